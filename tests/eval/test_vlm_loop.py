"""A vision-language target (issue 42) in the one speculative loop: a tiny random Gemma-3 with its
SigLIP vision tower (archs.TINY["gemma3-vl"]) decodes an image prompt (pixel values generated in code)
greedily, token for token like the target alone and like one full uncached forward per token, with
rejections; the vision tower runs once per request (a counter on its forward)."""
from __future__ import annotations

import torch

from draftsmith import testing
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.eval.proposers import ReplayProposer

NEW = 16


def _image_prompt(target):
    c = target.config
    g = torch.Generator().manual_seed(2)
    text = torch.randint(3, 250, (6,), generator=g).tolist()
    image = [c.boi_token_index] + [c.image_token_index] * c.mm_tokens_per_image + [c.eoi_token_index]
    ids = torch.tensor(text[:3] + image + text[3:])  # [n]
    size = c.vision_config.image_size
    media = {"pixel_values": torch.rand(1, 3, size, size, generator=g),  # a tiny image made in code
             "token_type_ids": (ids == c.image_token_index).long()[None]}  # [1, n]: 1 on image tokens
    return ids, media


def test_image_prompt_is_lossless_and_runs_the_vision_tower_once():
    torch.set_num_threads(1)
    target = testing.arch_target("gemma3-vl")
    calls = []
    target.model.model.vision_tower.register_forward_hook(lambda *_: calls.append(1))
    ids, media = _image_prompt(target)
    base = generate(target, None, ids, LoopConfig(k=0, max_new_tokens=NEW, eos_ids=[]), media=media).tokens
    assert len(calls) == 1
    seq = ids.tolist()  # the reference: one uncached forward over the image prompt and the tokens so far
    with torch.no_grad():
        for _ in range(NEW):
            tt = torch.zeros(1, len(seq), dtype=torch.long)
            tt[0, : ids.shape[0]] = media["token_type_ids"][0]
            logits = target.model(input_ids=torch.tensor([seq]), pixel_values=media["pixel_values"],
                                  token_type_ids=tt).logits
            seq.append(int(logits[0, -1].argmax()))
    assert base == seq[ids.shape[0]:]
    no_image = generate(target, None, ids, LoopConfig(k=0, max_new_tokens=NEW, eos_ids=[])).tokens
    assert no_image != base  # the image changes the continuation: the pixels reached the decoder
    calls.clear()
    proposer = ReplayProposer({tuple(ids.tolist()): ids.tolist() + base}, target.vocab_size, miss_rate=0.35)
    spec = generate(target, proposer, ids, LoopConfig(k=4, max_new_tokens=NEW, eos_ids=[]), media=media)
    assert spec.tokens == base
    assert sum(r.accepted < r.proposed for r in spec.rounds) >= 1
    assert len(calls) == 1  # the vision tower ran in the prefill only
