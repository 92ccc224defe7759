"""The exporter interface: one engine format (its --to name, its engine, its layouts: one per drafter kind,
registered in the format's own file) and the hooks `draftsmith export` calls: options it reads alone, the
files, the validate hook (export/validate.py here; an engine's own check for llama.cpp) and the summary."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import torch

from draftsmith.core.errors import UserError
from draftsmith.export import validate as validation
from draftsmith.export.layout import ExportFiles, ExportOptions, Layout, TensorSpec, layouts, not_taken, num_tokens


class Exporter:
    """One engine format: name, engine and its layouts (one per kind, `layouts(name)`). The methods hand
    each call to the layout registered for the drafter's kind; none switches on the kind."""

    name: ClassVar[str] = ""
    engine: ClassVar[str] = ""
    # This format's own flags: a dataclass of core.flags.flag() fields (None: it has none). `draftsmith export` adds
    # them to its command line, export() refuses them for other formats (export/options.py), and layouts read them
    # typed as opts.flags (a layout that reads only some of them names those in Layout.own_options).
    Flags: ClassVar[type | None] = None
    # False when the export is checked by an external program (llama.cpp: llama-server), so the architecture
    # matrix, which checks exports in-process, does not run it; the format's own round-trip tests do
    checked_in_process: ClassVar[bool] = True
    # the checkpoint's speedup_profile.json is copied beside the export and its recommended k applied
    copies_profile: ClassVar[bool] = True
    # the engine's `draftsmith doctor` reader (a module or object with PROGRAM, ENGINE, PACKAGE, recognises, read,
    # expected, check, config_command), or None when doctor has no reader for this format's engine
    doctor: ClassVar[object] = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The drafter kinds this format registers a layout for."""
        return tuple(layouts(self.name).names())

    def layout(self, kind: str) -> Layout:
        why = not_taken(self.name, kind)
        if why:
            raise UserError(why)
        return layouts(self.name).get(kind)(self.name, self.engine, kind)

    def typed_flags(self, given) -> object | None:
        """This format's Flags built from `given` ({field: value}, or a Flags instance already), None without Flags."""
        if self.Flags is None or isinstance(given, self.Flags):
            return given if self.Flags is not None else None
        names = {f.name for f in dataclasses.fields(self.Flags)}
        return self.Flags(**{k: v for k, v in dict(given or {}).items() if k in names})  # export() refused the rest

    def check_options(self, opts: ExportOptions) -> None:
        """Raise for an option this format does not read (before anything is loaded)."""

    def build(self, loaded, opts: ExportOptions, out_dir: Path, checkpoint=None) -> ExportFiles:
        """The files of this format for a loaded checkpoint (out_dir: the final directory; checkpoint: where it
        was loaded from, when known)."""
        return self.layout(loaded.drafter.kind).build(loaded, opts, out_dir)

    def validate(self, export_dir: Path, loaded, opts: ExportOptions, files: ExportFiles) -> dict:
        """Check the files as written in `export_dir` (export/validate.py: names, shapes, rope, verifier, the
        round trip); raises ExportValidationError; the report. Formats checked by an engine override it."""
        k = num_tokens(loaded, opts, files.sidecar.get("num_speculative_tokens") or 5)
        return validation.validate_export(export_dir, self, loaded, opts, k)  # looked up per call (tests patch it)

    def summary(self, checkpoint, result) -> list[str]:
        """The lines `draftsmith export` prints before the serve command."""
        state = f"validated: {result.report.get('round_trip')}" if result.report else "NOT validated (--no-validate)"
        return [f"exported {checkpoint} -> {result.out_dir} ({self.name}; {state})"]

    def required_config_keys(self, kind: str) -> list[str]:
        """Dotted config.json keys the engine reads (nested dicts as a.b)."""
        return self.layout(kind).required_config_keys()

    def expected_tensors(self, config: dict, kind: str) -> dict[str, TensorSpec]:
        """Every tensor the engine expects, derived from config.json alone."""
        return self.layout(kind).expected_tensors(config)

    def llama_fields(self, config: dict, kind: str) -> dict | None:
        """The part of config.json holding the draft layer's Llama fields (rope, positions)."""
        return self.layout(kind).llama_fields(config)

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        """Format-specific checks beyond names and shapes; returns problems."""
        return self.layout(loaded.drafter.kind).check_format(export_dir, config, tensors, loaded)

    def load_back(self, export_dir: Path, loaded):
        """Re-import the exported files into a draftsmith drafter (the round trip)."""
        return self.layout(loaded.drafter.kind).load_back(export_dir, loaded)

    def reference_drafter(self, loaded, dtype: torch.dtype):
        """The trained drafter rounded to the export dtype, built as load_back builds it."""
        make = getattr(self.layout(loaded.drafter.kind), "reference_drafter", None)
        return make(loaded, dtype) if make else None

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        return self.layout(loaded.drafter.kind).serve_command(out_dir, loaded, opts)
