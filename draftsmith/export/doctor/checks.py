"""The checks every engine's doctor shares: the draft is this export, the target is the fingerprinted verifier,
the dtype is the export's, the engine release serves the kind (export/engine_versions.py), the environment the
export's command sets. Each returns Findings (doctor/contract.Finding); `fix` builds the corrected flag."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from draftsmith.core.errors import UserError
from draftsmith.core.files import read_received_text
from draftsmith.export import engine_versions
from draftsmith.export.doctor.args import MAX_CONFIG_BYTES, load_json_object
from draftsmith.export.doctor.contract import Contract, Finding

AUTO_DTYPES = ("auto", None)


def same_path(given: str, want: Path) -> bool:
    if not isinstance(given, str):  # a config's `model` given as a list or number (vLLM's `--speculative-config.model+`)
        return False
    try:
        return Path(given).expanduser().resolve() == Path(want).resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def draft_finding(given: str | None, want: Path, fix: Callable[[str], str], what: str = "draft model") -> list[Finding]:
    """The draft the engine loads must be this export's directory (or its draft file)."""
    if given is not None and same_path(given, want):
        return []
    does = f"load the draft from {str(given)[:200]}" if given else "load no draft model of this export"
    return [Finding(what, does, f"the files in {want}", fix(str(want)))]


def _local_config(path: str) -> dict | None:
    """The config.json of a local target directory (None where `path` names no local directory holding one: a hub
    id); a received file like any other: regular, bounded, shallow, else one line naming it."""
    try:
        config = Path(path).expanduser() / "config.json"
        present = config.exists()
    except (OSError, RuntimeError, ValueError):
        return None
    if not present:
        return None
    data = load_json_object(read_received_text(config, "target config.json", limit=MAX_CONFIG_BYTES), str(config))
    return data


def target_finding(given: str | None, contract: Contract, fix: Callable[[str], str]) -> list[Finding]:
    """The target the command names against the verifier draftsmith.json fingerprinted (its serve_as and shape).
    A local directory of the same shape under another path is a note: its weights are not hashed here."""
    ident = contract.verifier
    want = ident.get("serve_as") or ident.get("path")
    if given is None or not want or given == want or same_path(given, Path(str(want))):
        return []
    trained = f"the verifier {want} (fingerprint {ident.get('fingerprint', '?')})"
    config = _local_config(given)
    if config is not None:
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        got = {"vocab_size": text.get("vocab_size"), "hidden_size": text.get("hidden_size"),
               "num_layers": text.get("num_hidden_layers")}
        differ = {k: v for k, v in got.items() if ident.get(k) is not None and v != ident.get(k)}
        if not differ:
            return [Finding("target", f"verify with {given}, a model of the verifier's shape under another path "
                            "(its weights are not hashed here)", trained, fix(str(want)), changes_acceptance=False)]
        shape = ", ".join(f"{k} {v} (trained {ident.get(k)})" for k, v in differ.items())
        return [Finding("target", f"verify with {given}: {shape}", trained, fix(str(want)))]
    return [Finding("target", f"verify with {given}, not the fingerprinted verifier", trained, fix(str(want)))]


def dtype_finding(given: str | None, contract: Contract, fix: Callable[[str], str]) -> list[Finding]:
    """An explicit dtype (not auto) other than the one the export wrote."""
    want = contract.dtype
    if given in AUTO_DTYPES or want is None or given == want:
        return []
    return [Finding("dtype", f"run the models in {given}", f"the export's {want}", fix(want))]


def env_findings(given: dict, expected: dict, command: str) -> list[Finding]:
    """Environment the export's command sets (vLLM 0.9.2's VLLM_USE_V1=0)."""
    return [Finding(f"environment {name}", f"run with {name}={given.get(name, '(unset)')}",
                    f"{name}={value} (the export's serve command sets it)", f"{name}={value} {command}")
            for name, value in expected.items() if given.get(name) != value]


def release_findings(contract: Contract, release: str | None, engine: str) -> tuple[list[Finding], list[str]]:
    """The engine release against export/engine_versions.SERVING: (findings, what was not checked)."""
    table = engine_versions.TARGETS.get(contract.fmt)
    if not engine_versions.versions(contract.fmt):  # TensorRT-LLM: its target table is one snapshot of main
        found = target_findings(contract, table.releases[-1], engine) if table is not None else []
        if release is None:
            return found, [f"{engine} release (pass --engine-version, or run doctor where the engine is installed)"]
        return found, [f"{engine} release {release} (draftsmith keeps no release table for {engine})"]
    if release is None:
        return [], [f"{engine} release (pass --engine-version, or run doctor where the engine is installed)"]
    try:
        version = engine_versions.resolve(contract.fmt, release)
    except UserError:
        read = ", ".join(engine_versions.versions(contract.fmt))
        return [], [f"{engine} release {release} (draftsmith has read {read} only)"]
    row = engine_versions.serving(contract.fmt, version, contract.kind)
    if row.served:
        return target_findings(contract, version, engine), []
    serving = engine_versions.releases_serving(contract.fmt, contract.kind)
    fix = f"serve with {engine} {serving[-1]}" if serving else f"export for another engine ({row.why})"
    return [Finding("engine release", f"not serve a {contract.kind} drafter in {version} ({row.why}; "
                    f"read from {row.source})", f"{engine} {', '.join(serving) or 'none read'}", fix)], []


def recorded_model_types(contract: Contract) -> list[str]:
    """The target's model_types the export records: the verifier's (the class an engine loads, e.g. gemma3 for
    Gemma-3 with its vision tower), then its text model's (target_architecture, e.g. qwen3_5_text)."""
    arch = contract.sidecar.get("target_architecture")
    found = [contract.verifier.get("model_type"), arch.get("model_type") if isinstance(arch, dict) else None]
    return [t for t in dict.fromkeys(found) if isinstance(t, str) and t]


def target_findings(contract: Contract, release: str, engine: str) -> list[Finding]:
    """The engine's target table (export/<engine>/targets.py, engine_versions.TARGETS) at `release`: a release that
    serves the kind, but not for this hybrid or vision-language target's model class, is one mismatch naming the
    engine, the release, the target's model_type and the engine file it was read from."""
    table = engine_versions.TARGETS.get(contract.fmt)
    listed = [t for t in recorded_model_types(contract) if table is not None and t in table.model_types()]
    if not listed:  # an attention-only target (no table row): served wherever the kind is
        return []
    model_type = listed[0]
    gap = table.gap(model_type, release, contract.kind)
    if gap is None:
        return []
    serving = table.serving_releases(model_type, contract.kind)
    fix = (f"serve with {engine} {serving[-1]}" if serving
           else f"export another kind or format (no {engine} release draftsmith has read serves it)")
    trained = f"a {model_type} target, which {engine} {', '.join(serving) or 'none read'} serves for {contract.kind}"
    return [Finding("target architecture", f"not serve this drafter: {gap}", trained, fix)]


def version_tuple(text: str) -> tuple[int, ...]:
    """(0, 28, 0) for "v0.28.0" / ">= 0.28.0"; reading stops at the first piece with no digits or with more than a
    release number holds (a received sidecar's 5,000-digit "version" is not parsed into an int)."""
    parts = []
    for piece in str(text)[:200].strip().lstrip(">=<~ ").removeprefix("v").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits or len(digits) > 9:
            break
        parts.append(int(digits))
    return tuple(parts)
