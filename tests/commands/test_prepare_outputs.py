"""Issue 34 (trust, round 4), prepare: regenerate.output and its summary are never FIFOs or device
nodes (refused before the target loads), and a full disk while writing the feature cache is one line."""
from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

from tests.conftest import refused_in_one_line


@pytest.fixture
def recipe(tmp_path):
    from draftsmith.testing import tiny_target

    model_dir = tmp_path / "target"
    tiny = tiny_target(num_layers=2, hidden=32)
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"q {i}"},
                                                         {"role": "assistant", "content": f"answer {i}"}]}) for i in range(3)) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({
        "target": {"path": str(model_dir), "device": "cpu"},
        "data": {"path": [str(data)], "max_length": 64},
        "features": {"cache_dir": str(tmp_path / "cache"), "shard_rows": 2},
        "drafter": {"kind": "eagle3"},
        "regenerate": {"max_new_tokens": 4, "batch_size": 2},
    }))
    return path


@pytest.mark.parametrize("which", ["regen.jsonl", "regen.jsonl.summary.json"])
def test_regenerate_output_that_is_a_fifo_is_refused(recipe, tmp_path, capsys, which):
    os.mkfifo(tmp_path / which)
    refused_in_one_line(capsys, ["prepare", str(recipe), f"regenerate.output={tmp_path / 'regen.jsonl'}"],
              "regenerate.output", which, "FIFO")
    assert stat.S_ISFIFO(os.lstat(tmp_path / which).st_mode)


def test_a_full_disk_while_building_the_feature_cache_is_one_line(recipe, tmp_path, capsys, monkeypatch):
    from safetensors import SafetensorError

    from draftsmith.data import feature_cache

    def no_room(tensors, filename, metadata=None):
        open(filename, "wb").close()  # a partial file, as a real full disk leaves
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" }) (os error 28)")

    monkeypatch.setattr(feature_cache, "save_file", no_room)
    refused_in_one_line(capsys, ["prepare", str(recipe), "--features"], "cache", "no space left")
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]
