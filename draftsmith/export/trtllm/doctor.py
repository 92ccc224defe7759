"""`draftsmith doctor` for TensorRT-LLM: `trtllm-serve MODEL [--backend pytorch] --extra_llm_api_options FILE`
(or `--config FILE`), or `doctor --config FILE` with the extra_llm_api_options YAML itself.

Compared with the YAML the export wrote (export/trtllm/layouts.py, SERVE_FILE), under `speculative_config`:
decoding_type (the method), max_draft_len (k, by the layout's rule), speculative_model / speculative_model_dir
(= this export), eagle3_layers_to_capture (the trained aux ids - 1; unset is TensorRT-LLM's default
{1, L//2 - 1, L - 4}), eagle3_one_model (a note: both modes compute the same draft); the backend (the export is
the PyTorch backend's); the target = the fingerprinted verifier. TensorRT-LLM has no release table here.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.export.doctor.args import Command, read_config_file, scan
from draftsmith.export.doctor.checks import draft_finding, release_findings, target_finding
from draftsmith.export.doctor.contract import Contract, Finding

SERVE_FILE = "extra_llm_api_options.yaml"  # the engine config file the export writes and trtllm-serve reads
PROGRAM = "trtllm-serve"  # how `draftsmith doctor` names the program it reads
ENGINE = "TensorRT-LLM"
PACKAGE = "tensorrt_llm"
OPTIONS = "--extra_llm_api_options"
KNOWN = {"--extra-llm-api-options": ("options", 1), "--config": ("options", 1), "--backend": ("backend", 1),
         "--model": ("model", 1)}
MODEL_KEYS = ("speculative_model", "speculative_model_dir")
CHECKED = ("decoding_type", "max_draft_len", *MODEL_KEYS, "eagle3_layers_to_capture", "eagle3_one_model")
WHAT = "TensorRT-LLM extra_llm_api_options YAML"


@dataclass
class Settings:
    target: str | None
    backend: str | None
    spec: dict
    options_file: str | None
    unchecked: list = field(default_factory=list)


def recognises(argv: list[str]) -> bool:
    return Path(argv[0]).name == "trtllm-serve"


def read(command: Command, source: str, options_file: str | None = None) -> Settings:
    flags = scan(command.argv[1:], KNOWN, source)
    positionals = flags.positionals[1:] if flags.positionals[:1] == ["serve"] else flags.positionals
    target = flags.get("model") or (positionals[0] if positionals else None)
    path = options_file or flags.get("options")
    try:
        data = read_config_file(path, WHAT) if path else {}
    except UserError as exc:
        if options_file:
            raise
        raise UserError(f"{source}: {OPTIONS} (or --config): {exc}") from None
    spec = data.get("speculative_config")
    spec = spec if isinstance(spec, dict) else {}
    unchecked = [f"speculative_config.{k}" for k in spec if k not in CHECKED]
    unchecked += [k for k in data if k != "speculative_config"] + flags.unchecked + positionals[1:]
    return Settings(target, flags.get("backend"), spec, path, unchecked)


def expected(contract: Contract, command: Command) -> Settings:
    return read(command, f"{contract.export_dir}/draftsmith.json serve_command", str(own_file(contract)))


def own_file(contract: Contract) -> Path:
    """The export's extra_llm_api_options.yaml: a file inside the export (a received export's link to /etc/shadow or
    anywhere else outside it is refused, never read)."""
    path = contract.export_dir / SERVE_FILE
    try:
        inside = path.resolve().is_relative_to(contract.export_dir.resolve())
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside:
        raise UserError(f"{path}: a link out of the export (to {os.readlink(path) if path.is_symlink() else '?'}); "
                        f"the export's {SERVE_FILE} must be its own file: export again")
    return path


def config_command(path) -> Command:
    return Command({}, ["trtllm-serve", OPTIONS, str(path)])


def check(contract: Contract, got: Settings, want: Settings, release: str | None) -> tuple[list[Finding], list[str]]:
    where = got.options_file or OPTIONS

    def fix(key: str, value) -> str:
        return f"{where}: speculative_config.{key}: {value}"

    if not got.spec:
        return [Finding("speculative decoding", "run the target alone (no speculative_config)", "this EAGLE drafter",
                        f"{OPTIONS} {shlex.quote(str(contract.export_dir / SERVE_FILE))}")], got.unchecked
    found = []
    if got.spec.get("decoding_type") != want.spec.get("decoding_type"):
        found.append(Finding("decoding_type", f"draft with {got.spec.get('decoding_type')!r}",
                             f"{want.spec.get('decoding_type')} (the {contract.kind} drafter's method)",
                             fix("decoding_type", want.spec.get("decoding_type"))))
    model = next((got.spec[k] for k in MODEL_KEYS if k in got.spec), None)
    found += draft_finding(None if model is None else str(model), contract.export_dir,
                           lambda p: fix("speculative_model", p))
    k = got.spec.get("max_draft_len")
    if contract.k_problem(k):
        found.append(Finding("max_draft_len", contract.k_does(k), contract.trained_k(),
                             fix("max_draft_len", contract.k)))
    elif k != contract.k:
        found.append(Finding("max_draft_len", f"draft {k} tokens a round (allowed; positions past the trained ones "
                             "were not trained)", contract.trained_k(), fix("max_draft_len", contract.k), False))
    found += capture_findings(contract, got, want, fix)
    if got.spec.get("eagle3_one_model", True) != want.spec.get("eagle3_one_model", True):
        found.append(Finding("eagle3_one_model", f"run eagle3_one_model {got.spec.get('eagle3_one_model')!r}",
                             "either mode (the same draft)", fix("eagle3_one_model", "true"), False))
    if got.backend not in (None, "pytorch"):
        found.append(Finding("backend", f"build the {got.backend} backend, which does not load this layout",
                             "the PyTorch backend's EAGLE-3 loader", "--backend pytorch"))
    found += target_finding(got.target, contract, lambda t: f"trtllm-serve {shlex.quote(t)}")
    more, unchecked = release_findings(contract, release, ENGINE)
    return found + more, unchecked + ["dtype (TensorRT-LLM builds the draft in config.json's torch_dtype)"] + got.unchecked


def capture_findings(contract: Contract, got: Settings, want: Settings, fix) -> list[Finding]:
    """eagle3_layers_to_capture: unset is TensorRT-LLM's default {1, L//2 - 1, L - 4} (output-of-layer ids)."""
    trained = list(want.spec.get("eagle3_layers_to_capture") or [])
    given = got.spec.get("eagle3_layers_to_capture")
    layers = contract.verifier.get("num_layers")
    if given is None:
        if not isinstance(layers, int):
            return [Finding("eagle3_layers_to_capture", "capture its default layers", f"layers {trained}",
                            fix("eagle3_layers_to_capture", trained))]
        given, how = [1, layers // 2 - 1, layers - 4], "its default layers"
    else:
        how = "layers"
    if isinstance(given, list) and all(type(i) is int for i in given) and sorted(given) == sorted(trained):
        return []
    return [Finding("eagle3_layers_to_capture", f"capture {how} {given} (outputs of those layers)",
                    f"layers {trained} (draftsmith's aux ids {contract.sidecar.get('aux_layer_ids')} - 1)",
                    fix("eagle3_layers_to_capture", trained))]
