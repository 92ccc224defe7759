"""Target features for training: computed online (a target forward inside the step) or read
from the offline feature cache (draftsmith/data/feature_cache.py). Both paths produce the
same dict of tensors, named as in heads/base.py.

The cache stores hidden states only; target_logits are recomputed from last_hidden_state
through the target's own output path (Target.logits_from_hidden: lm_head plus soft-capping or
logit scaling; cheap, and it keeps the cache a few times smaller than logits).
"""
from __future__ import annotations

import torch

from draftsmith.core.errors import UserError

HIDDEN_FEATURES = ("aux_hidden_states", "last_hidden_state")


def media_of(batch: dict) -> dict[str, torch.Tensor]:
    """A batch's image inputs for a vision-language target (data/images.py MEDIA_KEYS); {} for text rows."""
    from draftsmith.data.images import MEDIA_KEYS

    return {k: batch[k] for k in MEDIA_KEYS if k in batch}


def compute(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, required: set[str],
            layers: list[int], position_ids: torch.Tensor | None = None,
            media: dict | None = None) -> dict[str, torch.Tensor]:
    """One target forward -> the features in `required` (input ids/masks are not included).
    attention_mask is [b, s] (padding) or, for packed rows, the 4D bias of draftsmith.data.packing.
    media: image rows' processor tensors: the full vision-language model runs (vision tower included), so
    the features at image positions are what the target computed from the pixels."""
    out = target.forward(input_ids, attention_mask=attention_mask, position_ids=position_ids, **(media or {}))
    feats: dict[str, torch.Tensor] = {}
    if "aux_hidden_states" in required:
        feats["aux_hidden_states"] = torch.cat([out.hidden_states[i] for i in layers], dim=-1)  # n x [b,s,h] -> [b,s,n*h]
    if "last_hidden_state" in required or "target_logits" in required:
        feats["last_hidden_state"] = out.hidden_states[-1]
    if "target_logits" in required:
        feats["target_logits"] = out.logits
    return feats


@torch.no_grad()
def logits_from_hidden(target, last_hidden_state: torch.Tensor) -> torch.Tensor:
    """[b, s, h] post-norm hidden -> [b, s, V] target logits (lm_head + the target's own transforms)."""
    return target.logits_from_hidden(last_hidden_state)


@torch.no_grad()
def check_logits_path(target, last_hidden_state: torch.Tensor, logits: torch.Tensor, attention_mask: torch.Tensor,
                      atol: float = 1e-3) -> None:
    """Raise unless logits recomputed from the cached last hidden state equal the target's own logits
    (on real tokens): a target whose forward transforms logits in a way Target.logits_from_hidden does not
    know would otherwise train every offline drafter on wrong soft labels."""
    again = logits_from_hidden(target, last_hidden_state).float()
    real = attention_mask.bool()
    diff = float((again - logits.float()).abs()[real].max()) if real.any() else 0.0
    scale = float(logits.float()[real].abs().max()) if real.any() else 1.0
    if diff > atol * max(1.0, scale):
        raise UserError(
            f"offline features for target {target.name} ({target.config.model_type}): logits recomputed from the "
            f"last hidden state differ from the target's own logits by {diff:.3g}; its forward transforms logits in a "
            "way draftsmith does not replay. Use features.mode: online for this target")


def complete(target, batch: dict[str, torch.Tensor], required: set[str], layers: list[int]) -> dict[str, torch.Tensor]:
    """Fill in whatever `required` features the batch lacks (online forward or lm_head replay)."""
    missing = {f for f in required if f not in batch} - {"input_ids", "attention_mask", "loss_mask"}
    if not missing:
        return batch
    if missing <= {"target_logits"} and "last_hidden_state" in batch:
        return {**batch, "target_logits": logits_from_hidden(target, batch["last_hidden_state"])}
    from draftsmith.data import packing

    inputs = packing.model_inputs(batch, target.dtype)  # packed rows: block-diagonal mask, per-document positions
    feats = compute(target, batch["input_ids"], inputs["attention_mask"], missing, layers, inputs.get("position_ids"),
                    media_of(batch))
    return {**batch, **{k: v for k, v in feats.items() if k not in batch}}
