"""Numerics-aware lossless checking (`draftsmith eval --check-lossless`, `--verify-dtype`).

Greedy speculative decoding emits the target's argmax at every position, so its output equals
target-only greedy output token for token IN EXACT ARITHMETIC. In floating point the target's
logits depend on the shape of the forward that computed them: one verification forward over k + 1
tokens rounds differently from k + 1 one-token forwards (other matmul blockings, other reduction
orders), by about one unit in the last place of the dtype. Where the target's top-2 logits are that
close (a near-tie), the two passes may pick different tokens, and the outputs diverge from there on.
That is numerics, not a broken loop; everything else is a real mismatch.

`diagnose` classifies the first differing position of two greedy runs from the top-2 logits the loop
recorded behind every token (LoopConfig.record_top2), in both passes:
  near-tie  in EACH pass the two differing tokens are that pass's top-2, and its margin
            (top-1 - top-2 logit) is at most `steps` steps of the logits' dtype at that logit size,
            step(x) = finfo(dtype).eps * 2 ** floor(log2 |x|) (bf16 at |x| in [16, 32): 0.125);
            steps defaults to 2 (NEAR_TIE_STEPS): rounding each of the two logits moves the margin by
            up to one step, and the layers below add their own bf16 rounding (measured on Gemma-3-270M:
            margins 0 vs 0.1875, 1.5 steps, at a divergence of plain bf16 decoding);
  mismatch  anything else (a margin above one step, a token outside the top-2): a real failure.

`UpcastVerifier` is `--verify-dtype float32`: the whole verification forward (every layer, the final
norm and the lm_head) runs in float32 on an exact upcast of the weights as loaded (bf16 weights stay
the bf16 model's values), in the speculative and in the target-only pass alike; float32's step is
2 ** 16 times finer than bf16's, so greedy equality holds again except at float32 near-ties.
"""
from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from draftsmith.targets.load import TargetOutput, forget_position_offset, position_offset

NEAR_TIE_STEPS = 2.0  # --near-tie-steps: the margin, in dtype steps, below which a divergence is numerics


def resolution(x: float, dtype: torch.dtype) -> float:
    """One step of `dtype` at magnitude |x|: eps * 2 ** floor(log2 |x|), the spacing of representable
    values in [2 ** e, 2 ** (e + 1)) that holds x (bf16 at 20.0: 2 ** -7 * 16 = 0.125)."""
    info = torch.finfo(dtype)
    if abs(x) < info.tiny:
        return info.tiny
    return info.eps * 2.0 ** math.floor(math.log2(abs(x)))


def _pass_view(top2: Optional[list], pos: int, spec_tok: Optional[int], base_tok: Optional[int],
               dtype: torch.dtype, steps: float) -> Optional[dict]:
    """What one pass's target said at new-token position `pos`: margin, step, whether the two differing
    tokens are its top-2 and the margin is within one step."""
    if top2 is None or pos >= len(top2):
        return None
    v1, v2, i1, i2 = top2[pos]
    step = resolution(v1, dtype)
    margin = v1 - v2
    within = {spec_tok, base_tok} == {i1, i2} and margin <= steps * step
    return {"margin": margin, "step": step, "top1": [i1, v1], "top2": [i2, v2], "near_tie": within}


def diagnose(pos: int, spec, base, steps: float = NEAR_TIE_STEPS) -> dict:
    """The first difference of a speculative and a target-only Generation (both run with record_top2),
    classified as a numerical near-tie or a real mismatch (module docstring)."""
    spec_tok = spec.tokens[pos] if pos < len(spec.tokens) else None  # None: that output ended earlier
    base_tok = base.tokens[pos] if pos < len(base.tokens) else None
    dtype = spec.logits_dtype or base.logits_dtype or torch.float32
    s_view = _pass_view(spec.top2, pos, spec_tok, base_tok, spec.logits_dtype or dtype, steps)
    b_view = _pass_view(base.top2, pos, spec_tok, base_tok, base.logits_dtype or dtype, steps)
    near = None not in (spec_tok, base_tok) and bool(s_view and b_view and s_view["near_tie"] and b_view["near_tie"])
    out = {"position": pos, "spec_token": spec_tok, "target_token": base_tok,
           "kind": "near_tie" if near else "mismatch", "dtype": str(dtype).removeprefix("torch."),
           "near_tie_steps": steps,
           "speculative_pass": s_view, "target_only_pass": b_view}
    return out


def describe(d: dict) -> str:
    """One line: where the outputs diverged and what the target's margins were there."""
    where = f"first difference at new token {d['position']} (speculative {d['spec_token']}, target-only {d['target_token']})"
    s, b = d.get("speculative_pass"), d.get("target_only_pass")
    if not (s and b):
        return where
    margins = (f"top-2 margin {s['margin']:.4g} in the speculative pass, {b['margin']:.4g} in the target-only pass, "
               f"{d['dtype']} step {max(s['step'], b['step']):.4g}")
    if d["kind"] == "near_tie":
        m = max(s["margin"], b["margin"])
        return (f"diverged at a numerical near-tie (margin {m:.4g}, {d['dtype']} step {max(s['step'], b['step']):.4g}): "
                f"{where}; {margins}")
    return f"{where}; {margins}"


class UpcastVerifier:
    """The target with its verification forward in `dtype` (`--verify-dtype float32`): a copy of the
    model upcast exactly from the loaded weights computes every logit the loop verifies with, in both
    passes. Hidden states go back to the loaded dtype for the proposer (a drafter built for a bf16 target
    reads bf16 features). Everything else (tokenizer, identity, fingerprint) is the loaded target's."""

    def __init__(self, target, dtype: torch.dtype = torch.float32):
        self.inner = target
        self.verify_dtype = dtype
        self.model = copy.deepcopy(target.model).to(dtype).eval()  # [the weights as loaded, in dtype]
        for p in self.model.parameters():
            p.requires_grad_(False)

    def __getattr__(self, name):  # tokenizer, config, eos_ids, identity(), fingerprint, vocab_size, ...
        return getattr(self.inner, name)

    @property
    def dtype(self) -> torch.dtype:
        return self.verify_dtype  # what attention masks are built in

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def position_offset(self):
        return position_offset(self.model)  # this copy's (a Qwen-VL image prompt's M-RoPE shift), not the loaded one's

    @torch.no_grad()
    def forward(self, input_ids, attention_mask=None, cache=None, position_ids=None, **media) -> TargetOutput:
        forget_position_offset(self.model, cache)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         use_cache=cache is not None, output_hidden_states=True, **media)
        hidden = tuple(h.to(self.inner.dtype) for h in out.hidden_states)  # [b, s, h] in the loaded dtype
        return TargetOutput(logits=out.logits, hidden_states=hidden)
