"""Image prompts through the one speculative loop on every vision-language target draftsmith loads (issue 42):
Gemma-3, Qwen2.5-VL and Qwen3-VL (M-RoPE positions from the prompt's images, kept for the decode steps), tiny
random weights, prompts made by each target's processor around an image made in code. Greedy speculative
output, with rejections and with an (untrained) EAGLE-3 drafter, equals the target's own decoding and an
uncached full forward per token with the same image; the vision tower runs once per request. The `images`
workload runs through eval's runner with its lossless check."""
from __future__ import annotations

import pytest
import torch

from draftsmith.eval import image_workloads
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.eval.proposers import ReplayProposer
from draftsmith.testing import vlm

NEW = 14


def _reference(target, ids, media) -> list[int]:
    """Greedy tokens from one uncached full forward per token (the image kept in every forward)."""
    seq = ids.tolist()
    with torch.no_grad():
        for _ in range(NEW):
            full = dict(media)
            for key in ("token_type_ids", "mm_token_type_ids"):
                if key in media:  # the generated tokens are text (0)
                    full[key] = torch.cat([media[key], media[key].new_zeros(1, len(seq) - len(ids))], dim=1)
            target.model.model.rope_deltas = None  # (Qwen-VL) computed afresh from the whole sequence
            seq.append(int(target.model(input_ids=torch.tensor([seq]), **full).logits[0, -1].argmax()))
    return seq[len(ids):]


@pytest.mark.parametrize("name", ["gemma3-vl", "qwen2.5-vl", "qwen3-vl"])
def test_image_prompt_is_lossless(name):
    from draftsmith.heads import DRAFTERS

    torch.set_num_threads(1)
    target = vlm.vlm_target(name)
    calls = vlm.count_images(target)
    item = image_workloads.generated(2)[1]
    ids, truncated, media = image_workloads.encode(item, target)
    assert not truncated and (ids == target.config.image_token_id).sum() > 0
    cfg = LoopConfig(k=0, max_new_tokens=NEW, eos_ids=[])
    base = generate(target, None, ids, cfg, media=media).tokens
    assert len(calls) == 1
    assert base == _reference(target, ids, media)
    text_only = generate(target, None, ids, cfg).tokens  # the image tokens without their pixels
    assert text_only != base  # the pixels reached the decoder
    calls.clear()
    replay = ReplayProposer({tuple(ids.tolist()): ids.tolist() + base}, target.vocab_size, miss_rate=0.35)
    spec = generate(target, replay, ids, LoopConfig(k=4, max_new_tokens=NEW, eos_ids=[]), media=media)
    assert spec.tokens == base and any(r.accepted < r.proposed for r in spec.rounds)  # with rejections
    assert len(calls) == 1  # the prefill only: verification runs the language model on the cache
    cls = DRAFTERS.get("eagle3")
    options = cls.Config(**cls.tiny_options)
    drafter = cls.from_target(options, target).eval()
    eagle = generate(target, drafter.make_proposer(target), ids, LoopConfig(k=3, max_new_tokens=NEW, eos_ids=[]),
                     media=media)
    assert eagle.tokens == base


def test_images_workload_through_the_runner(tmp_path):
    from draftsmith.eval import runner, workloads

    torch.set_num_threads(1)
    target = vlm.vlm_target("qwen2.5-vl")
    for i in range(3):
        vlm.tiny_image(i).save(tmp_path / f"{i}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    assert workloads.expand(["images", f"images:{tmp_path}"]) == ["images", f"images:{tmp_path}"]
    assert [it["id"] for it in workloads.load(f"images:{tmp_path}", num_prompts=2)] == ["images-0.png", "images-1.png"]
    from draftsmith.heads import DRAFTERS

    cls = DRAFTERS.get("eagle3")
    drafter = cls.from_target(cls.Config(**cls.tiny_options), target).eval()
    settings = runner.EvalSettings(k=3, max_new_tokens=8, num_prompts=2, warmup=0, repeats=1, check_lossless=True,
                                   eos_ids=[], data_dir=tmp_path)
    for name in ("images", f"images:{tmp_path}"):
        section = runner.run_workload(target, drafter.make_proposer(target), name, settings, log=lambda *_: None)
        assert section["num_requests"] == 2 and not section["lossless_mismatches"]
        assert all(r["lossless"] for r in section["requests"])


def test_images_on_a_text_target_and_a_missing_folder_are_one_line(tmp_path):
    from draftsmith import testing
    from draftsmith.core.errors import UserError
    from draftsmith.eval import workloads

    with pytest.raises(UserError, match="has no processor"):
        image_workloads.encode(image_workloads.generated(1)[0], testing.tiny_target())
    with pytest.raises(UserError, match="no such folder"):
        workloads.expand([f"images:{tmp_path / 'nope'}"])


@pytest.mark.parametrize("name", ["qwen2.5-vl", "qwen3-vl"])  # Gemma-3 trees fail on text too (see the report)
def test_tree_drafting_on_an_image_prompt_is_lossless(name):
    """Tree verification passes its own positions: a Qwen-VL text position after images is shifted by the
    prompt's M-RoPE offset (Target.position_offset), as the model's own decode steps shift it."""
    from draftsmith.eval.tree import TreeConfig
    from draftsmith.heads import DRAFTERS

    torch.set_num_threads(1)
    target = vlm.vlm_target(name)
    ids, _, media = image_workloads.encode(image_workloads.generated(1)[0], target)
    base = generate(target, None, ids, LoopConfig(k=0, max_new_tokens=NEW, eos_ids=[]), media=media).tokens
    cls = DRAFTERS.get("eagle3")
    drafter = cls.from_target(cls.Config(**cls.tiny_options), target).eval()
    tree = generate(target, drafter.make_proposer(target), ids,
                    LoopConfig(k=3, max_new_tokens=NEW, eos_ids=[], tree=TreeConfig(depth=3, topk=2, budget=6)),
                    media=media)
    assert tree.tokens == base
