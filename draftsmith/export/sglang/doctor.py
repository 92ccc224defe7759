"""`draftsmith doctor` for SGLang: `python -m sglang.launch_server --model-path MODEL --speculative-*` (or
`sglang serve`), or `--config FILE`: SGLang's server-args YAML / JSON (keys as flags, `-` or `_`).

Compared with the export's own serve command (SGLang 0.5.23, arg_groups/speculative_hook.py):
  --speculative-algorithm (EAGLE3, EAGLE, DFLASH, DSPARK: the method for the kind); k by the layout's rule:
  --speculative-num-steps for the EAGLE algorithms (with --speculative-num-draft-tokens = steps + 1 at
  --speculative-eagle-topk 1), --speculative-num-draft-tokens = one whole block (+1) for the block algorithms;
  --speculative-draft-model-path = this export; --model-path = the fingerprinted verifier; --dtype and
  --speculative-draft-model-quantization; --speculative-token-map (SGLang's own hot-token vocabulary, which
  replaces the trained d2t); the release (engine_versions).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.export.doctor.args import Command, as_int, read_config_file, scan
from draftsmith.export.doctor.checks import draft_finding, dtype_finding, release_findings, target_finding
from draftsmith.export.doctor.contract import Contract, Finding

PROGRAM = "python -m sglang.launch_server"  # how `draftsmith doctor` names the program it reads
ENGINE = "SGLang"
PACKAGE = "sglang"
LAUNCHER = "sglang.launch_server"
ALGORITHM, STEPS, TOPK, DRAFT_TOKENS = ("--speculative-algorithm", "--speculative-num-steps",
                                       "--speculative-eagle-topk", "--speculative-num-draft-tokens")
KNOWN = {"--model-path": ("model", 1), "--model": ("model", 1), ALGORITHM: ("algorithm", 1),
         "--speculative-draft-model-path": ("draft", 1), "--speculative-draft-model": ("draft", 1),
         STEPS: ("steps", 1), TOPK: ("topk", 1), DRAFT_TOKENS: ("draft_tokens", 1), "--dtype": ("dtype", 1),
         "--speculative-token-map": ("token_map", 1), "--speculative-draft-model-quantization": ("quantization", 1)}


@dataclass
class Settings:
    values: dict  # canonical name -> value as written
    unchecked: list = field(default_factory=list)

    def get(self, name: str):
        return self.values.get(name)


def recognises(argv: list[str]) -> bool:
    program = Path(argv[0]).name
    return (program.startswith("python") and argv[1:3] == ["-m", LAUNCHER]) or (program == "sglang" and argv[1:2] == ["serve"])


def read(command: Command, source: str) -> Settings:
    argv = command.argv
    rest = argv[3:] if Path(argv[0]).name.startswith("python") else argv[2:]
    flags = scan(rest, KNOWN, source)
    return Settings({name: values[0] for name, values in flags.values.items()}, flags.unchecked + flags.positionals)


def expected(contract: Contract, command: Command) -> Settings:
    return read(command, f"{contract.export_dir}/draftsmith.json serve_command")


def config_command(path) -> Command:
    """SGLang's server-args file as the command it stands for."""
    data = read_config_file(path, "SGLang server-args config")
    argv = ["python", "-m", LAUNCHER]
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv += [flag, str(value)]
    return Command({}, argv)


def check(contract: Contract, got: Settings, want: Settings, release: str | None) -> tuple[list[Finding], list[str]]:
    algorithm, trained = got.get("algorithm"), want.get("algorithm")
    if algorithm is None:
        return [Finding("speculative decoding", "run the target alone (no --speculative-algorithm)",
                        f"--speculative-algorithm {trained}", f"{ALGORITHM} {trained}")], got.unchecked
    found = []
    if algorithm.upper() != str(trained).upper():
        found.append(Finding("algorithm", f"draft with {algorithm}", f"{trained} (the {contract.kind} drafter's method)",
                             f"{ALGORITHM} {trained}"))
    found += draft_finding(got.get("draft"), contract.export_dir, lambda p: f"--speculative-draft-model-path {shlex.quote(p)}")
    found += k_findings(contract, got, want)
    found += target_finding(got.get("model"), contract, lambda t: f"--model-path {shlex.quote(t)}")
    found += dtype_finding(got.get("dtype"), contract, lambda d: f"--dtype {d} (or drop --dtype)")
    if got.get("quantization") is not None:
        found.append(Finding("dtype", f"quantize the draft ({got.get('quantization')})", f"the export's {contract.dtype}",
                             "drop --speculative-draft-model-quantization"))
    if got.get("token_map") is not None:
        found.append(Finding("draft vocabulary", f"restrict drafts to the token map {got.get('token_map')} instead of "
                             "the draft's own d2t", "the draft vocabulary and d2t written in the export",
                             "drop --speculative-token-map"))
    more, unchecked = release_findings(contract, release, ENGINE)
    return found + more, unchecked + got.unchecked


def k_findings(contract: Contract, got: Settings, want: Settings) -> list[Finding]:
    """EAGLE algorithms count k in steps; block algorithms in draft tokens, one more than k (anchor / bonus)."""
    if want.get("steps") is not None:
        return steps_findings(contract, got, want)
    offset = as_int(want.get("draft_tokens"), DRAFT_TOKENS) - (contract.k or 0)
    raw = got.get("draft_tokens")
    fix = f"{DRAFT_TOKENS} {want.get('draft_tokens')}"
    if raw is None:
        return [Finding("k", "pick its own number of draft tokens (unset)", contract.trained_k(), fix)]
    k = as_int(raw, DRAFT_TOKENS) - offset
    if contract.k_problem(k):
        return [Finding("k", f"verify {raw} tokens a round ({k} drafts)", contract.trained_k(), fix)]
    return []


def steps_findings(contract: Contract, got: Settings, want: Settings) -> list[Finding]:
    steps_fix = f"{STEPS} {want.get('steps')} {TOPK} {want.get('topk')} {DRAFT_TOKENS} {want.get('draft_tokens')}"
    if got.get("steps") is None:
        return [Finding("k", "choose its own number of steps (unset)", contract.trained_k(), steps_fix)]
    steps = as_int(got.get("steps"), STEPS)
    found = []
    if contract.k_problem(steps):
        found.append(Finding("k", f"draft {steps} steps a round", contract.trained_k(), steps_fix))
    elif steps != contract.k:
        found.append(Finding("k", f"draft {steps} steps a round (allowed; steps past the trained ones were not trained)",
                             contract.trained_k(), steps_fix, changes_acceptance=False))
    topk = as_int(got.get("topk") or "1", TOPK)
    if str(topk) != str(want.get("topk")):
        found.append(Finding("eagle topk", f"draft a tree of top-{topk} branches", "chains (top-1), as measured",
                             f"{TOPK} {want.get('topk')}", changes_acceptance=False))
    tokens = got.get("draft_tokens")
    if topk == 1 and tokens is not None and as_int(tokens, DRAFT_TOKENS) != steps + 1:
        found.append(Finding("draft tokens", f"verify {tokens} tokens for {steps} chain steps",
                             f"steps + 1 = {steps + 1} verified tokens", f"{DRAFT_TOKENS} {steps + 1}"))
    return found
