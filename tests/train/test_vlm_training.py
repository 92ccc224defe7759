"""A vision-language target trains EAGLE-3 on rows with images (issue 42), through the one training loop:
online (the full model with pixel values in each step) and offline (the feature cache built once by
`prepare --features`). A counter on the vision tower proves it runs once per image row across the cache build
and 2 training steps; the cached features of an image row are what the target computed from its pixels; the
trained drafter exports to vLLM / SGLang or is refused in one line."""
from __future__ import annotations

import json
import math

import pytest
import torch

from draftsmith import config as config_mod
from draftsmith.testing import vlm

ROWS = 6  # image rows (one image each); a text row follows them


def _data(tmp_path):
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(ROWS):
        vlm.tiny_image(i).save(tmp_path / "img" / f"{i}.png")
        rows.append({"images": [f"img/{i}.png"], "conversations": [
            {"from": "human", "value": f"what is in picture {i}?"}, {"from": "gpt", "value": f"a square, {i} times"}]})
    rows.append({"conversations": [{"from": "human", "value": "and text?"}, {"from": "gpt", "value": "text too"}]})
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _recipe(tmp_path, target_dir, data, out, **features):
    return config_mod.from_dict({
        "target": {"path": str(target_dir), "device": "cpu"},
        "data": {"path": [str(data)], "max_length": 96, "eval_samples": 1},
        "drafter": {"kind": "eagle3", "ttt_steps": 2},
        "features": {"mode": "online", **features},
        "train": {"output_dir": str(tmp_path / out), "max_steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1,
                  "log_every": 1, "eval_every": 0},
        "logging": {"progress_bar": False, "report_to": []}})


@pytest.mark.parametrize("name", ["gemma3-vl", "qwen2.5-vl"])
def test_vision_tower_runs_once_per_row_through_cache_and_training(tmp_path, name):
    from draftsmith.commands.prepare import run_features
    from draftsmith.data import collate, feature_cache, features
    from draftsmith.train.loop import Trainer

    torch.set_num_threads(1)
    target = vlm.vlm_target(name)
    calls = vlm.count_images(target)
    data = _data(tmp_path)
    cfg = _recipe(tmp_path, tmp_path / "unused-target", data, "offline", mode="offline",
                  cache_dir=str(tmp_path / "cache"), dtype="float32")
    run_features(cfg, target=target, log=lambda *_: None)
    assert sum(calls) == ROWS  # every image row's image once, at build time
    result = Trainer(cfg, target).run(stop_after=2)
    assert len(result.losses) == 2 and all(math.isfinite(x) for x in result.losses)
    assert sum(calls) == ROWS  # training read the cache: the vision tower did not run again

    from draftsmith import data as data_mod
    from draftsmith.targets.archs import default_aux_layer_ids

    layers = default_aux_layer_ids(target.num_layers)
    cache = feature_cache.open(str(tmp_path / "cache"), target, layers, ["aux_hidden_states"])
    train, _, _ = data_mod.build_dataset(cfg.data, target.tokenizer, target.processor)
    item = train[0]
    online = features.complete(target, collate([item], 0), {"aux_hidden_states"}, layers)["aux_hidden_states"][0]
    assert torch.equal(cache[0]["input_ids"], item["input_ids"])
    assert torch.allclose(cache[0]["aux_hidden_states"].float(), online, atol=1e-5)  # what the target computed


def test_eagle3_trains_online_on_image_rows_and_exports_or_refuses(tmp_path):
    from draftsmith import checkpoint
    from draftsmith.export import can_export, export, formats_for
    from draftsmith.train.loop import Trainer

    torch.set_num_threads(1)
    target = vlm.vlm_target("gemma3-vl")
    vlm.save(target, tmp_path / "target")
    calls = vlm.count_images(target)
    cfg = _recipe(tmp_path, tmp_path / "target", _data(tmp_path), "online")
    trainer = Trainer(cfg, target)
    result = trainer.run()
    assert len(result.losses) == 2 and all(math.isfinite(x) for x in result.losses)
    assert 1 <= sum(calls) <= 4  # online: each step's image rows went through the vision tower with the text
    loaded = checkpoint.load_drafter(result.final_checkpoint, target=target)
    outcomes = {}
    for fmt in [f for f in formats_for("eagle3") if f in ("vllm", "sglang")]:
        why = can_export("eagle3", fmt, None, target.config)
        if why:
            assert all("\n" not in line for line in why)
            outcomes[fmt] = "refused: " + "; ".join(why)
            continue
        out = export(None, fmt, tmp_path / f"export-{fmt}", loaded=loaded)  # validated: names, shapes, rope, round trip
        assert (tmp_path / f"export-{fmt}" / "config.json").is_file()
        outcomes[fmt] = out.report.get("round_trip", "validated")
    assert set(outcomes) == {"vllm", "sglang"}
    assert any(not v.startswith("refused") for v in outcomes.values())  # at least one engine takes it


def test_vllm_format_hidden_states_of_image_rows(tmp_path):
    """prepare --features --format vllm writes each image row's states as the target computed them from its
    pixels; training from that folder runs the vision tower once more only (the spot check of one row)."""
    from draftsmith.commands.prepare import run_features
    from draftsmith.train.loop import Trainer

    torch.set_num_threads(1)
    target = vlm.vlm_target("qwen2.5-vl")
    calls = vlm.count_images(target)
    cfg = _recipe(tmp_path, tmp_path / "unused-target", _data(tmp_path), "from-vllm", mode="offline", source="vllm",
                  dir=str(tmp_path / "hs"))
    run_features(cfg, target=target, log=lambda *_: None, fmt="vllm")
    assert sum(calls) == ROWS
    result = Trainer(cfg, target).run(stop_after=2)  # the spot check recomputes one row and compares it
    assert len(result.losses) == 2 and all(math.isfinite(x) for x in result.losses)
    assert sum(calls) <= ROWS + 1


def test_loss_on_prompt_is_refused_for_image_rows_before_training(tmp_path):
    """Image tokens carry no label; train.loss_on_prompt would put one on them, so such data is refused by key."""
    from draftsmith.core.errors import UserError
    from draftsmith.train.loop import Trainer

    target = vlm.vlm_target("gemma3-vl")
    cfg = _recipe(tmp_path, tmp_path / "unused-target", _data(tmp_path), "lop")
    cfg.train.loss_on_prompt = True
    with pytest.raises(UserError, match="train.loss_on_prompt.*images"):
        Trainer(cfg, target)
