"""`draftsmith doctor` for vLLM: `vllm serve MODEL --speculative-config JSON` (also `--speculative_config`,
`--speculative-config.KEY VALUE`, `python -m vllm.entrypoints.openai.api_server --model MODEL`), or
`--config FILE`: a speculative_config JSON, or a vLLM `--config` YAML holding `speculative_config`.

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
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.export.doctor.args import Command, load_json_object, read_config_file, scan
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


def recognises(argv: list[str]) -> bool:
    program = Path(argv[0]).name
    return (program == "vllm" and argv[1:2] == ["serve"]) or (program.startswith("python") and argv[1:3] == ["-m", API_SERVER])


def read(command: Command, source: str) -> Settings:
    argv = command.argv
    rest = argv[2:] if Path(argv[0]).name == "vllm" else argv[3:]
    flags = scan(rest, KNOWN, source)
    spec_text = flags.get("spec")
    spec = load_json_object(spec_text, f"{source}: {SPEC_FLAG}") if spec_text is not None else {}
    for name, values in flags.values.items():  # --speculative-config.KEY VALUE
        if name.startswith("spec."):
            spec[name[len("spec."):]] = _scalar(values[0])
    target = flags.get("model") or (flags.positionals[0] if flags.positionals else None)
    extra = flags.positionals[1:] if flags.get("model") is None else flags.positionals
    return Settings(command.env, target, spec, flags.get("dtype"), flags.unchecked + extra)


def _scalar(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


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
    found = draft_finding(got.spec.get("model"), contract.export_dir, lambda p: fix(model=p))
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


def k_findings(contract: Contract, got: Settings, want: Settings, fix) -> list[Finding]:
    k = got.spec.get("num_speculative_tokens")
    if k is None:
        if "speculators_config" in contract.config:  # vLLM reads speculative_tokens from the export's config
            return []
        return [Finding("num_speculative_tokens", "refuse the config or pick its own k (unset)", contract.trained_k(),
                        fix(num_speculative_tokens=contract.k))]
    if not isinstance(k, int) or contract.k_problem(k):
        return [Finding("num_speculative_tokens", f"draft {k!r} tokens a round", contract.trained_k(),
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
