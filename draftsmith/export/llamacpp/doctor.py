"""`draftsmith doctor` for llama.cpp: `llama-server -m TARGET.gguf -md DRAFT.gguf --spec-type T --spec-draft-n-max K
[--spec-draft-p-min P]`, read as the llama.cpp vendored by llama-cpp-python 0.3.36 reads it (common/arg.cpp:
`--a_b` is `--a-b`, the last value wins; common/common.h: n_max defaults to 3, p_min to 0.0).

Compared with the export's own serve command and draftsmith.json:
  --spec-type (the kind's draft type); --spec-draft-n-max by the layout's rule (a block drafter decodes one block
  of n_max + 1 (DFlash) / n_max (DSpark) tokens: only the trained block is exact; above the trained block
  llama.cpp clamps n_max to it, a note, not a mismatch: measured, and read in common/speculative.cpp); -md / --model-draft = the
  export's draft GGUF (a -hfd repository is not this export); -m = the target GGUF the export was checked with;
  --spec-draft-p-min against the trained rule: llama.cpp stops at the first slot whose own confidence is below P
  and does not send it, draftsmith cut where the running product of confidences fell below
  drafter.confidence_threshold and sent that slot, so the export serves the whole block (P = 0);
  --spec-replace (a token translation between vocabularies: the draft already shares the target's).
llama-server has no config file doctor reads, and no release table.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.export.doctor.args import Command, as_float, as_int, scan
from draftsmith.export.doctor.checks import draft_finding, release_findings, same_path
from draftsmith.export.doctor.contract import Contract, Finding

PROGRAM = "llama-server"  # how `draftsmith doctor` names the program it reads
ENGINE = "llama.cpp"
PACKAGE = None  # llama-server is a binary: no installed release to read
DEFAULT_N_MAX, DEFAULT_P_MIN = 3, 0.0  # common/common.h of the pinned llama.cpp
N_MAX, P_MIN, SPEC_TYPE = "--spec-draft-n-max", "--spec-draft-p-min", "--spec-type"
KNOWN = {"-m": ("model", 1), "--model": ("model", 1), "-md": ("draft", 1), "--model-draft": ("draft", 1),
         "--spec-draft-model": ("draft", 1), SPEC_TYPE: ("spec_type", 1), N_MAX: ("n_max", 1),
         P_MIN: ("p_min", 1), "--draft-p-min": ("p_min", 1), "--spec-replace": ("replace", 2),
         "-hfd": ("draft_hf", 1), "-hfrd": ("draft_hf", 1), "--hf-repo-draft": ("draft_hf", 1),
         "--spec-draft-hf": ("draft_hf", 1)}


@dataclass
class Settings:
    values: dict
    unchecked: list = field(default_factory=list)

    def get(self, name: str):
        got = self.values.get(name)
        return got[0] if got else None


def recognises(argv: list[str]) -> bool:
    return Path(argv[0]).name in ("llama-server", "llama-server.exe")


def read(command: Command, source: str) -> Settings:
    flags = scan(command.argv[1:], KNOWN, source)
    return Settings(dict(flags.values), flags.unchecked + flags.positionals)


def expected(contract: Contract, command: Command) -> Settings:
    return read(command, f"{contract.export_dir}/draftsmith.json serve_command")


def config_command(path) -> Command:
    raise UserError(f"--config {path}: llama-server takes its settings as flags only; pass its command after `--`, "
                    "e.g. `draftsmith doctor DIR -- llama-server -m T.gguf -md D.gguf ...`")


def check(contract: Contract, got: Settings, want: Settings, release: str | None) -> tuple[list[Finding], list[str]]:
    found = []
    types = [t for t in (got.get("spec_type") or "").split(",") if t]
    trained_type = want.get("spec_type")
    if trained_type not in types or len(types) > 1:
        does = f"draft with {','.join(types)}" if types else "draft with its default type"
        found.append(Finding("spec-type", does, f"{trained_type} (the {contract.kind} drafter's graph)",
                             f"{SPEC_TYPE} {trained_type}"))
    if got.get("draft_hf") is not None:
        found.append(Finding("draft model", f"download the draft {got.get('draft_hf')}", "this export's draft GGUF",
                             f"-md {shlex.quote(str(contract.file('draft')))} (and no -hfd)"))
    else:
        found += draft_finding(got.get("draft"), contract.file("draft"), lambda p: f"-md {shlex.quote(p)}")
    found += n_max_findings(contract, got)
    found += p_min_findings(contract, got, want)
    target = contract.file("target")
    if got.get("model") is not None and target is not None and not same_path(got.get("model"), target):
        found.append(Finding("target", f"verify with {got.get('model')}", f"the target GGUF {target} (the one the "
                             "export loaded in llama-server)", f"-m {shlex.quote(str(target))}"))
    if got.values.get("replace"):
        found.append(Finding("draft vocabulary", f"translate draft tokens with --spec-replace {' '.join(got.values['replace'])}",
                             "the target's own vocabulary (the draft GGUF carries it)", "drop --spec-replace"))
    _, unchecked = release_findings(contract, release, ENGINE)
    return found, unchecked + ["dtype (the GGUF files carry their own)"] + got.unchecked


def n_max_findings(contract: Contract, got: Settings) -> list[Finding]:
    raw = got.get("n_max")
    k = DEFAULT_N_MAX if raw is None else as_int(raw, N_MAX)
    does = f"draft {k} token{'' if k == 1 else 's'} a round" + (" (its default)" if raw is None else "")
    if contract.block_size() is not None and contract.k is not None and k > contract.k:
        # common/speculative.cpp (draft-dflash): "requested draft size ... exceeds the trained block size --
        # clamping": a block drafter drafts at most its trained block, so a larger n_max changes nothing
        return [Finding("k", f"clamp {N_MAX} {k} to the trained block's {contract.k} draft tokens (it warns "
                        "'exceeds the trained block size -- clamping'); acceptance and output are unchanged",
                        contract.trained_k(), f"{N_MAX} {contract.k}", changes_acceptance=False)]
    if contract.k_problem(k):
        block = contract.block_size()
        if block is not None and contract.k is not None:  # the anchor slot: block - k (DFlash 1, DSpark 0)
            does += f", in one block of {k + block - contract.k} tokens"
        return [Finding("k", does, contract.trained_k(), f"{N_MAX} {contract.k}")]
    if k != contract.k:
        return [Finding("k", does + " (allowed; positions past the trained ones were not trained)", contract.trained_k(),
                        f"{N_MAX} {contract.k}", changes_acceptance=False)]
    return []


def p_min_findings(contract: Contract, got: Settings, want: Settings) -> list[Finding]:
    p = DEFAULT_P_MIN if got.get("p_min") is None else as_float(got.get("p_min"), P_MIN)
    trained = want.get("p_min")
    if trained is None:
        if p <= 0:
            return []
        return [Finding("confidence cut", f"stop drafting where the draft's top probability falls below {p} (fewer "
                        "drafts; the output is unchanged)", "drafting the whole k", f"{P_MIN} 0", changes_acceptance=False)]
    if p == as_float(trained, P_MIN):
        return []
    threshold = contract.options.get("confidence_threshold")
    rule = "the running product of confidences" + (f" cut at drafter.confidence_threshold={threshold}"
                                                    if threshold is not None else "")
    return [Finding("confidence cut", f"stop at the first slot whose own confidence is below {p} and drop it "
                    f"({P_MIN} {p})", f"{rule}, which sends the slot where it falls (served as the whole block)",
                    f"{P_MIN} {trained}")]
