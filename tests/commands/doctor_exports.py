"""Tiny exports for the doctor tests beyond test_doctor.py: (kind, format) -> export directory, built once per
module (no download; llama.cpp's sidecar and command written without its binaries, as test_doctor.py does)."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith import checkpoint
from draftsmith.export import export
from draftsmith.export.layout import ExportOptions
from draftsmith.heads import DRAFTERS
from tests.commands.test_doctor import LLAMACPP, llamacpp_dry_export, newest_release
from tests.export.conftest import make_checkpoint


def build_exports(root: Path, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Path]:
    monkeypatch = pytest.MonkeyPatch()
    built = {}
    try:
        for kind in sorted({k for k, _ in pairs}):
            ckpt = make_checkpoint(root / kind, kind, dict(DRAFTERS.get(kind).tiny_options))
            loaded = checkpoint.load_drafter(ckpt, device="cpu")
            for fmt in [f for k, f in pairs if k == kind]:
                out = root / f"{kind}-{fmt}"
                if fmt == LLAMACPP:
                    llamacpp_dry_export(loaded, out, monkeypatch)
                else:
                    version = newest_release(kind, fmt)[1]
                    export(ckpt, fmt, out, ExportOptions(engine_version=version), validate=False, loaded=loaded)
                built[(kind, fmt)] = out
    finally:
        monkeypatch.undo()
    return built
