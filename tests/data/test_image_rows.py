"""Rows with images (issue 42): chat rows naming image files and an HF dataset's image column go through a
tiny vision-language target's processor (draftsmith.testing.vlm; images made in code). The loss mask keeps the
assistant tokens and masks every image token; a bad image is one line naming the row and the file."""
from __future__ import annotations

import json
import os

import pytest
import torch

from draftsmith import config as config_mod
from draftsmith import data
from draftsmith.core.errors import UserError
from draftsmith.data import chat, features, images
from draftsmith.testing import vlm


def _cfg(path, max_length=128):
    return config_mod.from_dict({"target": {"path": "x"}, "data": {"path": [str(path)], "max_length": max_length,
                                 "eval_samples": 0}, "drafter": {"kind": "eagle3"}, "train": {"output_dir": "unused"}}).data


def _write(tmp_path, rows):
    (tmp_path / "img").mkdir(exist_ok=True)
    for i in range(3):
        vlm.tiny_image(i).save(tmp_path / "img" / f"{i}.png")
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"images": ["img/0.png"], "conversations": [{"from": "human", "value": "what is this?"},
                                                {"from": "gpt", "value": "a square"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "compare "},
                                               {"type": "image", "path": "img/1.png"},
                                               {"type": "image", "path": "img/2.png"}]},
                  {"role": "assistant", "content": "the same"}]},
    {"conversations": [{"from": "human", "value": "text only"}, {"from": "gpt", "value": "fine"}]},
]


@pytest.fixture(scope="module", params=["gemma3-vl", "qwen2.5-vl"])
def target(request):
    torch.set_num_threads(1)
    return vlm.vlm_target(request.param)


def test_image_rows_expand_image_tokens_and_mask_them(tmp_path, target):
    train, _, report = data.build_dataset(_cfg(_write(tmp_path, ROWS)), target.tokenizer, target.processor)
    assert report.used == 3 and not report.skipped
    image_id = target.config.image_token_id
    per_image = target.processor.image_seq_length if hasattr(target.processor, "image_seq_length") else None
    for i, n_images in enumerate([1, 2, 0]):
        item = train[i]
        ids, mask = item["input_ids"], item["loss_mask"]
        is_image = ids == image_id
        assert int(is_image.sum()) > 0 if n_images else "media" not in item
        if per_image:
            assert int(is_image.sum()) == n_images * per_image
        assert not mask[is_image].any()  # never a loss on an image token
        answer = ROWS[i]["conversations"][1]["value"] if i != 1 else "the same"
        learnt = target.tokenizer.decode(ids[mask.bool()])
        assert learnt == answer + "</s>"  # exactly the assistant's answer and its end-of-turn token
        if n_images:
            key = next(k for k in images.SEQUENCE_KEYS if k in item)
            assert torch.equal(item[key] != 0, is_image)
            assert item["media"]["pixel_values"].shape[0] >= n_images
    batch = data.collate([train[i] for i in range(3)], 0)
    feats = features.complete(target, batch, {"aux_hidden_states"}, [1, 2])
    for b in range(3):  # a row's features in a padded batch of image and text rows == the row alone
        item = train[b]
        alone = data.collate([item], 0)
        want = features.complete(target, alone, {"aux_hidden_states"}, [1, 2])["aux_hidden_states"][0]
        assert torch.allclose(feats["aux_hidden_states"][b, : len(item["input_ids"])], want, atol=1e-5)


def test_an_image_changes_the_features(tmp_path, target):
    rows = [dict(ROWS[0], images=[f"img/{i}.png"]) for i in (0, 1)]
    train, _, _ = data.build_dataset(_cfg(_write(tmp_path, rows)), target.tokenizer, target.processor)
    a, b = (features.complete(target, data.collate([train[i]], 0), {"aux_hidden_states"}, [1])["aux_hidden_states"]
            for i in (0, 1))
    assert torch.equal(train[0]["input_ids"], train[1]["input_ids"]) and not torch.allclose(a, b)


@pytest.mark.parametrize("ref, why", [("img/missing.png", "no such file"), ("img", "not a regular file"),
                                      ("notes.txt", "not a readable image"), ("http://x.org/a.png", "a URL")])
def test_a_bad_image_is_one_line_naming_row_and_file(tmp_path, ref, why):
    target = vlm.vlm_target("gemma3-vl")
    path = _write(tmp_path, [ROWS[2], dict(ROWS[0], images=[ref])])
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(UserError) as err:
        data.build_dataset(_cfg(path), target.tokenizer, target.processor)
    line = str(err.value)
    assert "\n" not in line and f"{path}:2" in line and why in line
    if "://" not in ref:
        assert os.path.basename(ref) in line


def test_fifo_and_oversized_images_are_refused(tmp_path, monkeypatch):
    target = vlm.vlm_target("gemma3-vl")
    os.mkfifo(tmp_path / "pipe.png")
    path = _write(tmp_path, [dict(ROWS[0], images=["pipe.png"])])
    with pytest.raises(UserError, match="pipe.png.*not a regular file"):
        data.build_dataset(_cfg(path), target.tokenizer, target.processor)
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 10)
    path.write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(UserError, match="0.png.*more than the 10"):
        data.build_dataset(_cfg(path), target.tokenizer, target.processor)


def test_text_target_skips_image_rows_and_a_cut_image_skips_its_row(tmp_path):
    from draftsmith import testing

    text = testing.tiny_target(chat_template=testing.TINY_CHAT_TEMPLATE)
    train, _, report = data.build_dataset(_cfg(_write(tmp_path, ROWS)), text.tokenizer)
    assert report.used == 1 and report.skipped[images.TEXT_TARGET] == 2
    target = vlm.vlm_target("gemma3-vl")
    late = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 40},
                                                      {"type": "image", "path": "img/0.png"}]},
                         {"role": "assistant", "content": "ok"}]}
    train, _, report = data.build_dataset(_cfg(_write(tmp_path, [ROWS[2], late]), max_length=45), target.tokenizer,
                                          target.processor)
    assert report.skipped[images.IMAGE_PAST_MAX_LENGTH] == 1 and report.used == 1  # never cut inside an image


def test_hf_dataset_with_an_image_column(tmp_path):
    import datasets

    target = vlm.vlm_target("qwen2.5-vl")
    rows = {"image": [vlm.tiny_image(i) for i in range(3)],
            "messages": [[{"role": "user", "content": f"describe {i}"}, {"role": "assistant", "content": f"shape {i}"}]
                         for i in range(3)]}
    ds = datasets.Dataset.from_dict(rows, features=datasets.Features({
        "image": datasets.Image(), "messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}]}))
    ds.save_to_disk(str(tmp_path / "saved"))
    train, _, report = data.build_dataset(_cfg(tmp_path / "saved"), target.tokenizer, target.processor)
    assert report.used == 3
    for i in range(3):
        item = train[i]
        assert item["media"]["image_grid_thw"].shape == (1, 3)
        assert target.tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == f"shape {i}</s>"


def test_expanded_mask_keeps_matched_tokens_only():
    assert images.expanded_mask([5, 9, 7, 7], [0, 0, 1, 1], [5, 8, 8, 9, 7, 7]) == [0, 0, 0, 0, 1, 1]
    assert chat.mask_from_offsets([(0, 1), (1, 2)], [(1, 2)]) == [0, 1]


def test_datasets_tokenization_path_says_it_reads_text_rows_only(tmp_path):
    import dataclasses

    target = vlm.vlm_target("gemma3-vl")
    cfg = dataclasses.replace(_cfg(_write(tmp_path, ROWS)), num_proc=1)
    with pytest.raises(UserError, match=r"data.num_proc=1 tokenizes text rows only.*2 row\(s\).*have images"):
        data.build_dataset(cfg, target.tokenizer, target.processor)
