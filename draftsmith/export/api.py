"""export(): load a checkpoint, build one format in a temporary sibling directory, validate the
files as written, then move the directory into place with one rename. A failed export leaves
the output directory untouched (absent, or as it was)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from draftsmith.eval.profile import PROFILE_FILE
from draftsmith.export.common import CONFIG_FILE, SIDECAR_FILE, WEIGHTS_FILE, ExportFiles, ExportOptions, num_tokens


@dataclass
class ExportResult:
    out_dir: Path
    serve_command: str
    report: dict  # validation report ({} with validate=False)


def write_files(files: ExportFiles, directory: Path) -> None:
    if files.writer is not None:
        files.writer(directory)
    if files.tensors:
        save_file(files.tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    if files.config:
        (directory / CONFIG_FILE).write_text(json.dumps(files.config, indent=2) + "\n")
    (directory / SIDECAR_FILE).write_text(json.dumps(files.sidecar, indent=2, default=str) + "\n")
    for name, text in files.extra.items():
        (directory / name).write_text(text)


def export(checkpoint, to: str, out, options: ExportOptions | None = None, validate: bool = True,
           overwrite: bool = False, loaded=None) -> ExportResult:
    """Export checkpoint (a draftsmith checkpoint dir, or an already loaded LoadedDrafter) to `out`."""
    from draftsmith.export import EXPORTERS
    from draftsmith.export.validate import validate_export
    from draftsmith.train.checkpoint import load_drafter, write_dir_atomically

    exporter = EXPORTERS.get(to)()
    opts = options or ExportOptions()
    if opts.max_model_len is not None and to != "hf":
        raise ValueError(f"--max-model-len applies to --to hf (a draft LM with a shorter context), not --to {to}")
    profile_text = _speedup_profile(checkpoint if loaded is None else None)
    loaded = loaded if loaded is not None else load_drafter(checkpoint)
    recommended = None
    if profile_text is not None:
        profile = json.loads(profile_text)
        recommended = profile.get("recommended_num_speculative_tokens")
        if opts.num_speculative_tokens is None and isinstance(recommended, int) and recommended >= 1:
            opts = dataclasses.replace(opts, num_speculative_tokens=recommended)  # the profile's best k at batch 1
    kind = loaded.drafter.kind
    if kind not in exporter.kinds:
        fits = [name for name in EXPORTERS.names() if kind in EXPORTERS.get(name).kinds]
        raise ValueError(f"--to {to} does not take {kind} drafters (it takes {list(exporter.kinds)}); "
                         f"formats for {kind}: {fits}")
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; pass --overwrite to replace it")
    report: dict = {}
    serve: list[str] = []

    def fill(tmp: Path) -> None:
        files = exporter.build(loaded, opts, out)
        serve.append(exporter.serve_command(out, loaded, opts))
        files.sidecar["serve_command"] = serve[0]
        if profile_text is not None:  # copied beside the weights; the sidecar says what it recommends
            files.extra[PROFILE_FILE] = profile_text
            files.sidecar["speedup_profile"] = {
                "file": PROFILE_FILE, "recommended_num_speculative_tokens": recommended,
                "speculation_pays_at_batch_1": profile.get("speculation_pays_at_batch_1"),
                "stops_paying_at_batch": {w: r.get("speculation_stops_paying_at_batch")
                                          for w, r in (profile.get("recommendation") or {}).items()}}
        write_files(files, tmp)
        if validate:  # a failure raises here, and nothing is written to `out`
            k = num_tokens(loaded, opts, files.sidecar.get("num_speculative_tokens") or 5)
            report.update(validate_export(tmp, exporter, loaded, opts, k))

    write_dir_atomically(out, fill, marker=None)
    return ExportResult(out_dir=out, serve_command=serve[0], report=report)


def _speedup_profile(checkpoint) -> str | None:
    """The text of CHECKPOINT/speedup_profile.json (written by `draftsmith profile`), or None."""
    path = Path(checkpoint) / PROFILE_FILE if checkpoint is not None else None
    if path is None or not path.exists():
        return None
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg}); rerun `draftsmith profile {checkpoint}` or delete it") from err
    if data.get("schema") != "draftsmith.speedup-profile":
        raise ValueError(f"{path}: schema {data.get('schema')!r} is not draftsmith.speedup-profile; "
                         f"rerun `draftsmith profile {checkpoint}` or delete it")
    return text
