"""`draftsmith doctor` for vLLM: `vllm serve MODEL --speculative-config JSON` (also `--speculative_config`,
`--speculative-config.KEY VALUE`, a `--config FILE.yaml` of the command's own, `python -m
vllm.entrypoints.openai.api_server --model MODEL`), read as vLLM's FlexibleArgumentParser reads it (dotted_flags,
with_config_file); or doctor's `--config FILE`: a speculative_config JSON, or a vLLM `--config` YAML holding
`speculative_config`.

What is compared with the export's own serve command (what the export was validated for):
  method and the fields that change what the draft computes (parallel_drafting, enable_adaptive_verification,
  dspark_draft_topk, quantization); num_speculative_tokens by the layout's k rule (export/doctor/contract.py;
  unset is the speculators config's `speculative_tokens`, which the export wrote); model = this export;
  the target = the fingerprinted verifier; --dtype; VLLM_USE_V1; the release (engine_versions; DSpark's
  adaptive-verification fields need vLLM >= 0.28.0; per-head Medusa heads over a draft vocabulary load in
  0.9.2 only, export/vllm/medusa_vocab.py).
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.export.doctor.args import (
    MAX_DEPTH,
    Command,
    bounded_int,
    load_json_object,
    load_json_value,
    read_config_file,
    scan,
)
from draftsmith.export.doctor.checks import (
    draft_finding,
    dtype_finding,
    env_findings,
    release_findings,
    target_finding,
    version_tuple,
)
from draftsmith.export.doctor.contract import Contract, Finding
from draftsmith.export.vllm import medusa_vocab

PROGRAM = "vllm serve"  # how `draftsmith doctor` names the program it reads
ENGINE = "vLLM"
PACKAGE = "vllm"  # importlib.metadata name: the installed release, when doctor runs where vLLM is
API_SERVER = "vllm.entrypoints.openai.api_server"
KNOWN = {"--speculative-config": ("spec", 1), "--model": ("model", 1), "--dtype": ("dtype", 1)}
# speculative_config fields that change what the draft computes; compared with the export's command (unset = None)
DRAFT_FIELDS = ("method", "parallel_drafting", "enable_adaptive_verification", "dspark_draft_topk", "quantization")
SPEC_FLAG = "--speculative-config"


@dataclass
class Settings:
    env: dict
    target: str | None
    spec: dict
    dtype: str | None
    unchecked: list = field(default_factory=list)
    dotted: "DottedUse" = None


def recognises(argv: list[str]) -> bool:
    program = Path(argv[0]).name
    return (program == "vllm" and argv[1:2] == ["serve"]) or (program.startswith("python") and argv[1:3] == ["-m", API_SERVER])


def read(command: Command, source: str) -> Settings:
    argv = command.argv
    serve = Path(argv[0]).name == "vllm"
    rest = argv[2:] if serve else argv[3:]
    words, dotted = dotted_flags(with_config_file(rest, serve, source), source)
    flags = scan(words, KNOWN, source, rename=vllm_name)
    spec_text = flags.get("spec")
    spec = load_json_object(spec_text, f"{source}: {SPEC_FLAG}") if spec_text is not None else {}
    target = flags.get("model") or (flags.positionals[0] if flags.positionals else None)
    extra = flags.positionals[1:] if flags.get("model") is None else flags.positionals
    return Settings(command.env, target, spec, flags.get("dtype"), flags.unchecked + extra,
                    dotted.get(SPEC_FLAG, DottedUse()))


def with_config_file(words: list[str], serve: bool, source: str) -> list[str]:
    """`--config FILE.yaml` in a vLLM command, as FlexibleArgumentParser._pull_args_from_config reads it: the file's
    keys become flags (`true` a bare flag, a list its items, an object its JSON, anything else its text; `false` is
    left out) placed before the command line's own flags, which therefore win, and after `vllm serve`'s model."""
    if "--config" not in words:
        return words
    if words.count("--config") > 1:
        raise UserError(f"{source}: --config given {words.count('--config')} times; vLLM takes one config file")
    i = words.index("--config")
    if i + 1 >= len(words):
        raise UserError(f"{source}: --config needs a file and the command ends; give the YAML file, or drop --config")
    path = words[i + 1]
    if path.split(".")[-1] not in ("yaml", "yml"):
        raise UserError(f"{source}: --config {path[:200]}: vLLM reads a .yaml or .yml config file only")
    pulled = []
    for key, value in read_config_file(path, "vLLM --config file").items():
        if value is True:
            pulled.append(f"--{key}")
        elif isinstance(value, list):
            pulled += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            pulled += [f"--{key}", json.dumps(value)]
        elif value is not False:
            pulled += [f"--{key}", str(value)]
    rest = words[:i] + words[i + 2:]
    if not serve:
        return pulled + rest
    if not words[0].startswith("-"):  # the model right after `serve` (vLLM looks there before taking --config out)
        return rest[:1] + pulled + rest[1:]
    if "--model" not in pulled and not any(w == "--model" or w.startswith("--model=") for w in rest):
        raise UserError(f"{source}: vllm serve --config {path[:200]}: no model right after `serve` and no `model` key in "
                        "the file (vLLM stops: 'No model specified!'); write `vllm serve MODEL --config FILE`")
    return pulled + rest


def vllm_name(word: str) -> str:
    """FlexibleArgumentParser's rename: '_' -> '-' between `--` and the first '.', in the name only (before
    `=`), so `--speculative_config.num_speculative_tokens` is `--speculative-config.num_speculative_tokens`."""
    if not word.startswith("--"):
        return word
    name, eq, value = word.partition("=")
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + eq + value


@dataclass
class DottedUse:
    """The dotted flags (`--speculative-config.KEY VALUE`) of one config flag, and whether a JSON was also given."""

    keys: list = field(default_factory=list)  # as written after the flag: `num_speculative_tokens`, `a.b`
    merged: dict = field(default_factory=dict)  # what they set, merged as vLLM merges them
    dropped: str | None = None  # the `--speculative-config JSON` given as well, which they replace whole


def dotted_flags(words: list[str], source: str) -> tuple[list[str], dict[str, DottedUse]]:
    """The words as vLLM's FlexibleArgumentParser.parse_args hands them to argparse (vllm/utils/argparse_utils.py,
    0.20-0.33): every word that starts with '-' and holds a '.' in its name is a dotted key, its value the word
    after it (whatever that word is) or its `=value`; `KEY+` appends to a list (`a,b` is two items). The keys of
    one flag merge into one object (nested by the dots, lists joined), appended at the END as `FLAG JSON`, so
    argparse's last-wins store makes it the whole config: a `--speculative-config JSON` given too is dropped.
    A value is JSON, else a human-readable integer (`1k`, `2M`), else the text."""
    rest, merged, uses, i = [], {}, {}, 0
    while i < len(words):
        word = vllm_name(words[i])
        if not word.startswith("-") or "." not in word.split("=", 1)[0]:
            rest.append(word)
            i += 1
            continue
        if "=" in word:
            name, value = word.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(words):
                raise UserError(f"{source}: {word[:80]} needs a value and the command ends (vLLM stops on it with an "
                                "IndexError); give the value, or drop the flag")
            name, value, i = word, vllm_name(words[i + 1]), i + 2
        append = name.endswith("+")
        base, *keys = (name[:-1] if append else name).split(".")
        if len(keys) > MAX_DEPTH:
            raise UserError(f"{source}: {name[:80]}... nests {len(keys)} keys deep; a speculative config has 2 levels")
        item = [part for part in value.split(",")] if append else dotted_value(value, f"{source}: {name[:80]}")
        for key in reversed(keys):
            item = {key: item}
        merge_into(merged.setdefault(base, {}), item)
        uses.setdefault(base, DottedUse()).keys.append(".".join(keys))
    for base, value in merged.items():
        uses[base].merged = value
        given = [(w, rest[j + 1] if j + 1 < len(rest) else None) for j, w in enumerate(rest)
                 if w == base or w.startswith(base + "=")]
        if given:
            word, after = given[-1]
            uses[base].dropped = word.split("=", 1)[1] if "=" in word else after
        rest += [base, json.dumps(value)]
    return rest, uses


def dotted_value(text: str, source: str):
    """A dotted flag's value as vLLM reads it: JSON, else human_readable_int (`1k` = 1000, `1K` = 1024), else the
    text; bounded (a deep or huge value is one line, where vLLM stops with a traceback)."""
    try:
        return load_json_value(text, source)
    except UserError:
        raise
    except ValueError:  # not JSON
        pass
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if match:
        number, suffix = match.groups()
        if suffix in "kmgt":
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        return int(number) * 1024 ** ("KMGT".index(suffix) + 1) if number.isdigit() else text
    if re.fullmatch(r"[+-]?[\d_]+", text.strip()):  # int() reads `1_000` and other scripts' digits too
        try:
            return bounded_int(text.strip(), source)
        except UserError:
            raise
        except ValueError:
            return text
    return text


def merge_into(into: dict, update: dict) -> None:
    """vLLM's recursive_dict_update: objects merge key by key, lists join, anything else is replaced (no recursion:
    the depth is bounded by MAX_DEPTH keys above)."""
    stack = [(into, update)]
    while stack:
        target, changes = stack.pop()
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                stack.append((target[key], value))
            elif isinstance(value, list) and isinstance(target.get(key), list):
                target[key] = target[key] + value
            else:
                target[key] = value


def expected(contract: Contract, command: Command) -> Settings:
    return read(command, f"{contract.export_dir}/draftsmith.json serve_command")


def config_command(path) -> Command:
    """`--config FILE` as the command vLLM would run."""
    data = read_config_file(path, "vLLM speculative config")
    server = next((k for k in ("speculative_config", "speculative-config") if k in data), None)
    spec = data[server] if server else data
    spec_text = spec if isinstance(spec, str) else json.dumps(spec)
    argv = ["vllm", "serve", *([str(data["model"])] if server and data.get("model") else []), SPEC_FLAG, spec_text]
    if server and data.get("dtype"):
        argv += ["--dtype", str(data["dtype"])]
    return Command({}, argv)


def check(contract: Contract, got: Settings, want: Settings, release: str | None) -> tuple[list[Finding], list[str]]:
    """(findings, not checked) of a vLLM command against the export's."""
    def fix(**changes) -> str:  # the user's config with `changes` applied (None: the field dropped)
        spec = {k: v for k, v in {**got.spec, **changes}.items() if v is not None}
        return f"{SPEC_FLAG} {shlex.quote(json.dumps(spec))}"

    if not got.spec:
        return [Finding("speculative decoding", "run the target alone (no --speculative-config)",
                        "speculative decoding with this export", f"{SPEC_FLAG} {shlex.quote(json.dumps(want.spec))}")], []
    found = dotted_findings(got)
    found += draft_finding(got.spec.get("model"), contract.export_dir, lambda p: fix(model=p))
    for key in DRAFT_FIELDS:
        if got.spec.get(key) != want.spec.get(key):
            does = f"run {key} {got.spec[key]!r}" if key in got.spec else f"leave {key} unset (vLLM's default)"
            found.append(Finding(key, does, f"{key} {want.spec.get(key)!r}", fix(**{key: want.spec.get(key)})))
    found += k_findings(contract, got, want, fix)
    found += target_finding(got.target, contract, lambda t: f"vllm serve {shlex.quote(t)}")
    found += dtype_finding(got.dtype, contract, lambda d: f"--dtype {d} (or drop --dtype)")
    found += env_findings(got.env, want.env, "vllm serve ...")
    more, unchecked = release_findings(contract, release, ENGINE)
    found += more + release_field_findings(contract, got, release, fix)
    known = {"model", "num_speculative_tokens", *DRAFT_FIELDS}
    unchecked += [f"speculative_config.{k}" for k in got.spec if k not in known] + got.unchecked
    return found, unchecked


def dotted_findings(got: Settings) -> list[Finding]:
    """`--speculative-config JSON` and `--speculative-config.KEY VALUE` together: vLLM keeps the dotted keys alone."""
    use = got.dotted
    if use is None or use.dropped is None:
        return []
    keys = ", ".join(f"{SPEC_FLAG}.{k}" for k in dict.fromkeys(use.keys))
    try:
        meant = {**load_json_object(use.dropped, SPEC_FLAG), **use.merged}
    except UserError:
        meant = use.merged
    return [Finding("speculative config", f"take {keys} as the whole speculative config and drop the {SPEC_FLAG} "
                    "JSON (its parser appends the dotted keys as one later --speculative-config, and the last wins)",
                    "one speculative config holding every key", f"one {SPEC_FLAG} {shlex.quote(json.dumps(meant))} "
                    "and no dotted keys")]


def k_findings(contract: Contract, got: Settings, want: Settings, fix) -> list[Finding]:
    k = got.spec.get("num_speculative_tokens")
    if k is None:
        if "speculators_config" in contract.config:  # vLLM reads speculative_tokens from the export's config
            return []
        return [Finding("num_speculative_tokens", "refuse the config or pick its own k (unset)", contract.trained_k(),
                        fix(num_speculative_tokens=contract.k))]
    if contract.k_problem(k):
        return [Finding("num_speculative_tokens", contract.k_does(k), contract.trained_k(),
                        fix(num_speculative_tokens=contract.k))]
    if k != contract.k:
        return [Finding("num_speculative_tokens", f"draft {k} tokens a round (allowed; positions past the trained "
                        "ones were not trained)", contract.trained_k(), fix(num_speculative_tokens=contract.k), False)]
    return []


def release_field_findings(contract: Contract, got: Settings, release: str | None, fix) -> list[Finding]:
    """Fields a release cannot take (DSpark's adaptive verification before 0.28.0) and a draft vocabulary the
    release will not map (per-head Medusa heads outside 0.9.2)."""
    if release is None:
        return []
    found = []
    serving = contract.sidecar.get("vllm_dspark_serving")
    needs = serving.get("needs_vllm") if isinstance(serving, dict) else None
    if needs is not None and not (isinstance(needs, str) and re.fullmatch(r">=\s*\d{1,4}(\.\d{1,4}){0,3}", needs)):
        raise UserError(f"{contract.export_dir}/draftsmith.json: vllm_dspark_serving.needs_vllm {str(needs)[:40]!r} is "
                        "not a release such as '>= 0.28.0'; the file is damaged: export again")
    fields = {k: None for k in ("enable_adaptive_verification", "dspark_draft_topk") if k in got.spec}
    if needs and fields and version_tuple(release) < version_tuple(needs.lstrip(">= ")):
        found.append(Finding("engine release", f"reject {', '.join(fields)} in {release}",
                             f"vLLM {needs} (adaptive verification drives the trained confidence head)",
                             f"vLLM {needs.lstrip('>= ')} or later, or {fix(**fields)} (fixed K)"))
    why = medusa_vocab.release_vocab_problem(contract.config, release)
    if why:
        found.append(Finding("draft vocabulary", f"not map the draft vocabulary in {release} ({why})",
                             f"vLLM {', '.join(medusa_vocab.PER_HEAD_RELEASES)}",
                             f"serve with vLLM {medusa_vocab.PER_HEAD_RELEASES[-1]} (VLLM_USE_V1 as printed)"))
    return found
