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

from draftsmith.core.errors import UserError
from draftsmith.export.doctor.args import Command, as_int, read_config_file, scan
from draftsmith.export.doctor.checks import draft_finding, dtype_finding, release_findings, target_finding
from draftsmith.export.doctor.contract import Contract, Finding
from draftsmith.export.sglang.cli_flags import OPTIONS

PROGRAM = "python -m sglang.launch_server"  # how `draftsmith doctor` names the program it reads
ENGINE = "SGLang"
PACKAGE = "sglang"
LAUNCHER = "sglang.launch_server"
ALGORITHM, STEPS, TOPK, DRAFT_TOKENS = ("--speculative-algorithm", "--speculative-num-steps",
                                       "--speculative-eagle-topk", "--speculative-num-draft-tokens")
DFLASH_BLOCK, DSPARK_BLOCK = "--speculative-dflash-block-size", "--speculative-dspark-block-size"
# SGLang 0.5.23's spellings (arg_groups/fields: aliases=["--model"], aliases=["--speculative-draft-model"]); the two
# block sizes stand for --speculative-num-draft-tokens (speculative_hook.py: DFLASH's = it, DSPARK's = it - 1)
KNOWN = {"--model-path": ("model", 1), "--model": ("model", 1), ALGORITHM: ("algorithm", 1),
         "--speculative-draft-model-path": ("draft", 1), "--speculative-draft-model": ("draft", 1),
         STEPS: ("steps", 1), TOPK: ("topk", 1), DRAFT_TOKENS: ("draft_tokens", 1), "--dtype": ("dtype", 1),
         "--speculative-token-map": ("token_map", 1), "--speculative-draft-model-quantization": ("quantization", 1),
         DFLASH_BLOCK: ("dflash_block", 1), DSPARK_BLOCK: ("dspark_block", 1)}


@dataclass
class Settings:
    values: dict  # canonical name -> value as written
    unchecked: list = field(default_factory=list)
    refused: list = field(default_factory=list)  # (word, why, fix): what SGLang's parser stops on

    def get(self, name: str):
        return self.values.get(name)


def recognises(argv: list[str]) -> bool:
    program = Path(argv[0]).name
    return (program.startswith("python") and argv[1:3] == ["-m", LAUNCHER]) or (program == "sglang" and argv[1:2] == ["serve"])


def option_for(word: str) -> tuple[str | None, str]:
    """The SGLang option a flag word names, as SGLang's argparse.ArgumentParser (allow_abbrev) resolves it: the
    option itself, or the one option its name is a prefix of; (None, why) when the parser refuses it. argparse
    rewrites no '_': `--speculative_algorithm` is an unrecognized argument."""
    name = word.split("=", 1)[0]
    if name in OPTIONS:
        return name, ""
    matches = sorted(o for o in OPTIONS if o.startswith(name)) if name.startswith("--") and len(name) > 2 else []
    if len(matches) == 1:
        return matches[0], ""
    if matches:
        return None, f"ambiguous option {name[:60]} (could match {', '.join(matches[:3])}{', ...' if len(matches) > 3 else ''})"
    return None, f"unrecognized argument {name[:60]}"


def read(command: Command, source: str) -> Settings:
    argv = command.argv
    rest = argv[3:] if Path(argv[0]).name.startswith("python") else argv[2:]
    if len(rest) > 4 * len(OPTIONS):
        raise UserError(f"{source}: {len(rest):,} words after the program; an SGLang command has a few dozen")

    def rename(word: str) -> str:
        option, _ = option_for(word)
        return option + word[len(word.split("=", 1)[0]):] if option else word

    flags = scan(rest, KNOWN, source, rename=rename)
    refused = []
    for word in flags.unchecked:
        option, why = option_for(word)
        if option is None:
            dashed = "--" + word[2:].replace("_", "-") if word.startswith("--") else None
            fix = f"write {dashed}" if dashed in OPTIONS else "drop it (see python -m sglang.launch_server --help)"
            refused.append((word, why, fix))
    unchecked = [w for w in flags.unchecked if option_for(w)[0] is not None]
    return Settings({name: values[0] for name, values in flags.values.items()}, unchecked + flags.positionals, refused)


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
    found = [Finding("command line", f"refuse to start ({why})", "a command SGLang's parser accepts", fix)
             for _, why, fix in got.refused]
    if algorithm is None:
        return found + [Finding("speculative decoding", "run the target alone (no --speculative-algorithm)",
                                f"--speculative-algorithm {trained}", f"{ALGORITHM} {trained}")], got.unchecked
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
    if want.get("draft_tokens") is None:
        raise UserError(f"{contract.export_dir}/draftsmith.json serve_command: sets no {DRAFT_TOKENS} for the "
                        f"{contract.kind} drafter; the file is damaged or not this draftsmith's: export again")
    offset = as_int(want.get("draft_tokens"), DRAFT_TOKENS) - (contract.k or 0)
    fix = f"{DRAFT_TOKENS} {want.get('draft_tokens')}"
    raw, refused = block_draft_tokens(got)
    if refused:
        return [Finding("k", f"refuse to start ({refused})", contract.trained_k(), fix)]
    if raw is None:
        if str(got.get("algorithm")).upper() in ("DFLASH", "DSPARK"):  # read from the draft's config: this export's
            return []
        return [Finding("k", "pick its own number of draft tokens (unset)", contract.trained_k(), fix)]
    k = as_int(raw, DRAFT_TOKENS) - offset
    if contract.k_problem(k):
        return [Finding("k", f"verify {raw} tokens a round ({k} drafts)", contract.trained_k(), fix)]
    return []


def block_draft_tokens(got: Settings) -> tuple[str | None, str | None]:
    """--speculative-num-draft-tokens as SGLang resolves it for the block algorithms (speculative_hook.py):
    DFLASH's --speculative-dflash-block-size N is N, DSPARK's --speculative-dspark-block-size G is G + 1; given with
    a different --speculative-num-draft-tokens, SGLang refuses to start. (value, why SGLang refuses)."""
    raw, algorithm = got.get("draft_tokens"), str(got.get("algorithm")).upper()
    alias = {"DFLASH": (DFLASH_BLOCK, "dflash_block", 0), "DSPARK": (DSPARK_BLOCK, "dspark_block", 1)}.get(algorithm)
    if alias is None or got.get(alias[1]) is None:
        return raw, None
    flag, name, plus = alias
    size = as_int(got.get(name), flag)
    if size <= 0:
        return None, f"{flag} {size} must be positive"
    tokens = str(size + plus)
    if raw is not None and as_int(raw, DRAFT_TOKENS) != size + plus:
        return None, f"{flag} {size} stands for {DRAFT_TOKENS} {tokens}, and {DRAFT_TOKENS} {raw} differs"
    return tokens, None


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
