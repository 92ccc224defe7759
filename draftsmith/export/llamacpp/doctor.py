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

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.export.doctor.args import MAX_INT_DIGITS, Command, as_float, scan
from draftsmith.export.doctor.checks import draft_finding, same_path
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


# the environment variables llama-server reads for the same settings (arg.cpp set_env): applied before the command
# line, which overrides them; --spec-type's values add up (environment, then each use on the command line)
ENV = {"LLAMA_ARG_MODEL": "model", "LLAMA_ARG_SPEC_DRAFT_MODEL": "draft", "LLAMA_ARG_SPEC_TYPE": "spec_type",
       "LLAMA_ARG_SPEC_DRAFT_N_MAX": "n_max", "LLAMA_ARG_SPEC_DRAFT_P_MIN": "p_min",
       "LLAMA_ARG_SPEC_DRAFT_HF_REPO": "draft_hf"}
# flags and variables arg.cpp keeps only to refuse them ("the argument has been removed")
REMOVED = {"--draft": N_MAX, "--draft-n": N_MAX, "--draft-max": N_MAX, "--draft-min": "--spec-draft-n-min",
           "--draft-n-min": "--spec-draft-n-min", "LLAMA_ARG_DRAFT_MAX": N_MAX, "LLAMA_ARG_DRAFT_MIN": "--spec-draft-n-min"}


@dataclass
class Settings:
    values: dict
    unchecked: list = field(default_factory=list)
    refused: list = field(default_factory=list)  # (what, why, fix): what llama-server stops on

    def get(self, name: str):
        got = self.values.get(name)
        return got[-1] if got else None


def recognises(argv: list[str]) -> bool:
    return Path(argv[0]).name in ("llama-server", "llama-server.exe")


def llama_name(word: str) -> str:
    """arg.cpp's rewrite: every '_' of a `--` word is '-' (no `=value` form: the whole word is the name)."""
    return word.replace("_", "-") if word.startswith("--") else word


def read(command: Command, source: str) -> Settings:
    flags = scan(command.argv[1:], KNOWN, source, equals=False, rename=llama_name, accumulate=("spec_type",))
    values = {name: [command.env[var]] for var, name in ENV.items() if var in command.env}
    for name, given in flags.values.items():
        values[name] = values.get(name, []) + given if name == "spec_type" else given
    refused = []
    for word in flags.unchecked + [var for var in command.env if var in REMOVED]:
        name = llama_name(word)
        if name in REMOVED:
            refused.append((word, "the argument has been removed", f"{REMOVED[name]} N"))
        elif name.startswith("--") and "=" in name and name.split("=", 1)[0] in KNOWN:
            flag, value = name.split("=", 1)
            refused.append((word, "invalid argument: llama.cpp takes no --flag=value", f"{flag} {value}"))
    return Settings(values, flags.unchecked + flags.positionals, refused)


def stoi(text: str, flag: str) -> int:
    """An integer flag as arg.cpp reads it (std::stoi): leading blanks, a sign and digits, the rest ignored
    (`3abc` is 3); no digits, or past a 32-bit int, and llama-server refuses to start."""
    match = re.match(r"\s*([+-]?\d+)", str(text)[:MAX_INT_DIGITS])
    if not match or not -2**31 <= int(match.group(1)) < 2**31:
        raise UserError(f"{flag} {str(text)[:40]!r}: llama-server refuses it (std::stoi: not a 32-bit integer); give "
                        "the number the export printed")
    return int(match.group(1))


def expected(contract: Contract, command: Command) -> Settings:
    return read(command, f"{contract.export_dir}/draftsmith.json serve_command")


def config_command(path) -> Command:
    raise UserError(f"--config {path}: llama-server takes its settings as flags only; pass its command after `--`, "
                    "e.g. `draftsmith doctor DIR -- llama-server -m T.gguf -md D.gguf ...`")


def check(contract: Contract, got: Settings, want: Settings, release: str | None) -> tuple[list[Finding], list[str]]:
    found = [Finding("command line", f"refuse to start: {what} ({why})", "a command llama-server accepts", fix)
             for what, why, fix in got.refused]
    types = [t for value in got.values.get("spec_type", []) for t in value.split(",") if t]
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
    more, unchecked = release_checks(contract, release)
    return found + more, unchecked + ["dtype (the GGUF files carry their own)"] + got.unchecked


def installed_release() -> str | None:
    """The `llama-server --version` line of the project's own build (scripts/install_llama_cpp.sh), found as
    `eval --engine` finds it (export/llamacpp/tools.find_llama_cpp: DRAFTSMITH_LLAMA_SERVER, DRAFTSMITH_LLAMA_CPP_DIR,
    the install script's cache); None where there is none."""
    from draftsmith.export.llamacpp.tools import LlamaCppMissing, find_llama_cpp

    try:
        return find_llama_cpp().version()
    except (LlamaCppMissing, OSError, subprocess.SubprocessError):
        return None


def release_checks(contract: Contract, release: str | None) -> tuple[list[Finding], list[str]]:
    """The llama-server build against the one the export was checked with (draftsmith.json llama_cpp.server_version;
    llama.cpp has no release table here): the same build is checked, another is a note."""
    if release is None:
        return [], [f"{ENGINE} release (no llama-server found: build it with `bash scripts/install_llama_cpp.sh`, or "
                    "pass --engine-version)"]
    side = contract.sidecar.get("llama_cpp")
    checked_with = side.get("server_version") if isinstance(side, dict) else None
    if isinstance(checked_with, str) and release.strip() == checked_with.strip():
        return [], []
    return [Finding("engine release", f"run {release[:120]}", f"the llama-server the export was checked with "
                    f"({str(checked_with)[:120] if checked_with else 'not recorded'})",
                    "serve with that build (bash scripts/install_llama_cpp.sh builds it), or export again with this one",
                    changes_acceptance=False)], []


def n_max_findings(contract: Contract, got: Settings) -> list[Finding]:
    raw = got.get("n_max")
    k = DEFAULT_N_MAX if raw is None else stoi(raw, N_MAX)
    if k < 0:
        return [Finding("k", f"refuse to start ({N_MAX} {k}: invalid value)", contract.trained_k(), f"{N_MAX} {contract.k}")]
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
