"""export(): load a checkpoint, build one format in a temporary sibling directory, validate the
files as written, then move the directory into place with one rename. A failed export leaves
the output directory untouched (absent, or as it was).

overwrite=True replaces only a previous draftsmith export (a directory holding its draftsmith.json),
never the source checkpoint, and only the files an export writes: other files in the directory
stay, and files the previous export listed that the new one does not write are removed."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import save_file

from draftsmith.core.errors import UserError
from draftsmith.core.files import clean_stale_temps, terminate_cleanly, write_dir_atomically
from draftsmith.export.layout import CONFIG_FILE, SIDECAR_FILE, WEIGHTS_FILE, ExportFiles, ExportOptions
from draftsmith.report.speedup_model import PROFILE_FILE


@dataclass
class ExportResult:
    out_dir: Path
    serve_command: str
    report: dict  # validation report ({} with validate=False)
    sidecar: dict = field(default_factory=dict)  # draftsmith.json as written


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


def written_files(directory: Path) -> list[str]:
    """Every file under directory, as sorted relative POSIX paths."""
    return sorted(p.relative_to(directory).as_posix() for p in Path(directory).rglob("*") if p.is_file())


def previous_export_files(out: Path) -> list[str] | None:
    """The files a previous draftsmith export in `out` wrote (its draftsmith.json lists them), [] for an
    export from before that list existed, or None when `out` holds no draftsmith export."""
    try:
        sidecar = json.loads((out / SIDECAR_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(sidecar, dict) or "format" not in sidecar or "draftsmith_version" not in sidecar:
        return None
    files = sidecar.get("files", [])
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else []


def check_out_dir(out: Path, source: Path | None, overwrite: bool) -> bool:
    """Raise unless `out` may receive an export; True when it holds a previous export to replace."""
    if source is not None:
        src = source.resolve()
        if out == src or out in src.parents:
            raise UserError(f"--out {out} is the source checkpoint {source} or a folder holding it; "
                             "write the export to a new directory, e.g. --out exported/NAME")
        if src in out.parents:
            raise UserError(f"--out {out} lies inside the source checkpoint {source}; choose a directory outside it")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; give a directory")
    if not out.exists() or not any(out.iterdir()):
        return False
    if not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; pass --overwrite to replace a previous export "
                              "there, or choose a new --out")
    if previous_export_files(out) is None:
        raise FileExistsError(f"--out {out} holds files but no draftsmith export ({SIDECAR_FILE}); --overwrite only "
                              "replaces a previous export: choose an empty or new --out")
    return True


def linked_folder(out: Path, rel: str) -> Path | None:
    """The first folder on the way from `out` to out/rel that is a symbolic link (None if none is):
    writing there would write wherever the link points, outside --out."""
    folder = out
    for part in Path(rel).parts[:-1]:
        folder = folder / part
        if folder.is_symlink():
            return folder
    return None


def replace_export_files(tmp: Path, out: Path) -> None:
    """Move the new export's files from tmp into out one by one (each os.replace is atomic), then
    remove files the previous export listed that the new one does not write; nothing else is touched.
    Nothing is written through a symbolic link: a linked folder inside out is refused before any
    file moves, and a file that is a link is replaced as a link (os.replace never follows it)."""
    old = set(previous_export_files(out) or [])
    new = written_files(tmp)
    for rel in sorted(set(new) | old):
        link = linked_folder(out, rel)
        if link is not None:
            raise UserError(f"--out {out}: {link.relative_to(out)} is a symbolic link (to {os.readlink(link)}); "
                            "draftsmith does not write through links out of --out: remove the link, or export to "
                            "a new --out")
    for rel in new:
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / rel, dest)
    for rel in sorted(old - set(new)):
        stale = out / rel
        if stale.is_symlink():
            stale.unlink()  # the link itself, never what it points to
        elif out.resolve() in stale.resolve().parents and stale.is_file():  # never outside out
            stale.unlink()


def export(checkpoint, to: str, out, options: ExportOptions | None = None, validate: bool = True,
           overwrite: bool = False, loaded=None, trust_remote_code: bool = False) -> ExportResult:
    """Export checkpoint (a draftsmith checkpoint dir, or an already loaded LoadedDrafter) to `out`, in any
    registered format (EXPORTERS): the same checks, the same atomic write, the format's own validate hook.

    trust_remote_code: run the target's custom code (--trust-remote-code); never taken from the checkpoint."""
    from draftsmith.checkpoint import load_drafter
    from draftsmith.export import engine_versions
    from draftsmith.export.layout import EXPORTERS
    from draftsmith.export.options import given_flags, own_flags, refuse_format_options, refuse_layout_options
    from draftsmith.export.support import can_export

    exporter = EXPORTERS.get(to)()
    opts = options or ExportOptions()
    exporter.check_options(opts)
    given = given_flags(opts)
    refuse_format_options(to, given)
    opts = dataclasses.replace(opts, flags=exporter.typed_flags(own_flags(to, given)))  # the format's Flags, typed
    version = engine_versions.resolve(to, opts.engine_version)  # None: a format without a version table
    out = Path(out).resolve()
    source = Path(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else None
    replacing = check_out_dir(out, source, overwrite)
    profile_text = _speedup_profile(checkpoint if loaded is None and exporter.copies_profile else None)
    loaded = loaded if loaded is not None else load_drafter(checkpoint, trust_remote_code=trust_remote_code)
    kind = loaded.drafter.kind
    reasons = can_export(kind, to, version)  # e.g. vLLM 0.33 serves no Medusa: refused before any file is built
    if not reasons:  # the release serves the kind, but maybe not for this target's model class (a hybrid, a VLM)
        reasons = engine_versions.target_refusals(to, version, kind, loaded.target.config)
    if reasons:
        raise UserError("; ".join(reasons))
    layout = exporter.layout(kind)
    refuse_layout_options(to, kind, given)
    opts = layout.options_for(opts, version)  # vLLM 0.27 DSpark: no adaptive-verification fields
    layout.check_loaded(loaded, opts)
    profile = json.loads(profile_text) if profile_text is not None else None
    opts = _apply_profile(exporter, loaded, opts, profile)
    report: dict = {}
    written: list = []

    def fill(tmp: Path) -> None:
        files = exporter.build(loaded, opts, out, checkpoint=checkpoint)
        files.sidecar["serve_command"] = engine_versions.serve_command(to, version, kind,
                                                                       exporter.serve_command(out, loaded, opts))
        if version is not None:
            files.sidecar["engine_version"] = version  # the release the export was checked against
        if profile is not None:  # copied beside the weights; the sidecar says what it recommends
            files.extra[PROFILE_FILE] = profile_text
            files.sidecar["speedup_profile"] = _profile_record(profile)
        write_files(files, tmp)
        if validate:  # a failure raises here, and nothing is written to `out`
            report.update(exporter.validate(tmp, loaded, opts, files))
        files.sidecar["files"] = sorted(set(written_files(tmp)) | {SIDECAR_FILE})  # what --overwrite may replace
        (tmp / SIDECAR_FILE).write_text(json.dumps(files.sidecar, indent=2, default=str) + "\n")
        written.append(files.sidecar)

    _write_atomically(out, fill, replacing)
    side = written[0]
    return ExportResult(out_dir=out, serve_command=side["serve_command"], report=report, sidecar=side)


def _write_atomically(out: Path, fill, replacing: bool) -> None:
    """fill(tmp) in a temporary sibling of `out`, then into place: one rename for a new export, file by file
    (each atomic) over a previous one, keeping anything else in the directory."""
    clean_stale_temps(out)  # .OUT.tmp-PID-* of earlier exports that were killed (their PID is gone)
    with terminate_cleanly():  # SIGTERM runs the clean-ups instead of leaving .OUT.tmp-* behind
        write_dir_atomically(out, fill, "export", into_existing=replace_export_files if replacing else None)


def _apply_profile(exporter, loaded, opts: ExportOptions, profile: dict | None) -> ExportOptions:
    """The profile's best k at batch 1 as --num-speculative-tokens, when none is given and the format serves it."""
    recommended = (profile or {}).get("recommended_num_speculative_tokens")
    if (opts.num_speculative_tokens is None and isinstance(recommended, int) and recommended >= 1
            and _servable_k(exporter, loaded, recommended)):
        return dataclasses.replace(opts, num_speculative_tokens=recommended)
    return opts


def _profile_record(profile: dict) -> dict:
    return {"file": PROFILE_FILE, "recommended_num_speculative_tokens": profile.get("recommended_num_speculative_tokens"),
            "speculation_pays_at_batch_1": profile.get("speculation_pays_at_batch_1"),
            "stops_paying_at_batch": {w: r.get("speculation_stops_paying_at_batch")
                                      for w, r in (profile.get("recommendation") or {}).items()}}


def _servable_k(exporter, loaded, k: int) -> bool:
    """Whether the format serves `k` draft tokens for this drafter (a block drafter in vLLM takes one whole
    block only): a profile's recommendation it cannot serve is not applied, the drafter's default is kept."""
    check = getattr(exporter.layout(loaded.drafter.kind), "check_k", None)
    try:
        if check is not None:
            check(loaded.drafter.cfg, k)
    except ValueError:
        return False
    return True


def _speedup_profile(checkpoint) -> str | None:
    """The text of CHECKPOINT/speedup_profile.json (written by `draftsmith profile`), or None: a bounded
    regular UTF-8 file (core/files), strict JSON (no NaN / Infinity, which break every strict reader it is
    copied on to) holding the profile's schema and a `recommendation` of mappings."""
    from draftsmith.checkpoint import check_speedup_profile
    from draftsmith.core.files import read_received_text

    path = Path(checkpoint) / PROFILE_FILE if checkpoint is not None else None
    if path is None or not os.path.lexists(path):
        return None
    text = read_received_text(path, "speedup profile")
    fix = f"rerun `draftsmith profile {checkpoint}` or delete it"

    def no_constant(name):
        raise UserError(f"{path}: holds {name}, which is not JSON; {fix}")

    try:
        data = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON ({err.msg}); {fix}") from err
    except RecursionError:
        raise UserError(f"{path}: nested too deeply; {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: holds a JSON {type(data).__name__}, not a speedup profile; {fix}")
    check_speedup_profile(data, path, checkpoint)
    return text
