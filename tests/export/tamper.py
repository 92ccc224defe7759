"""Copy an export and damage it on purpose: the export gate tests plant one fault at a time."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file


def tampered_copy(src: Path, dst: Path, edit_tensors=None, edit_config=None, edit_sidecar=None) -> Path:
    """Copy the export directory src to dst, then apply each given edit in place: edit_tensors(dict) on
    model.safetensors, edit_config(dict) on config.json, edit_sidecar(dict) on draftsmith.json."""
    shutil.copytree(src, dst)
    if edit_tensors:
        tensors = load_file(str(dst / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(dst / "model.safetensors"))
    for name, edit in (("config.json", edit_config), ("draftsmith.json", edit_sidecar)):
        if edit:
            data = json.loads((dst / name).read_text())
            edit(data)
            (dst / name).write_text(json.dumps(data))
    return dst
