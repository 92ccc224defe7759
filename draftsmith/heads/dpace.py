"""D-PACE, "Dynamic Position-Aware Cross-Entropy for Parallel Speculative Drafting" (arXiv:2605.18810), the
per-slot loss weights of the block drafters (DFlash, DSpark: `drafter.loss: dpace`).

One block's slots i = 1..B (in order) each predict one token; greedy verification accepts the block up to
the first miss, so the expected accepted length is E[L] = sum_m prod_{i <= m} a_i, where a_i is the
probability that slot i is accepted given the slots before it were. D-PACE estimates a_i with the draft's own
confidence in the target's token, q_i = exp(-CE_i) (CE_i = -log q(target argmax) at slot i), smooths it
(the paper's Eq. 7)

    s_i = (1 - alpha) * q_i + alpha

and weights slot j's cross-entropy by (Eq. 8)

    w_j = sum_{m >= j} prod_{i <= m} s_i

which is d E[L] / d log a_j with a = s: the gradient of the loss then points where the expected accepted
length gains most. The weights are detached (no gradient flows through them). A slot outside the loss
(no label, padding, DFlash's anchor slot) passes s_i = 1 into the products and gets w = 0, and adds no term
to the sum over m (as speculators does). alpha in (0, 1]: alpha = 1 gives w_j = number of loss slots at or
after j (a linear decay); smaller alpha follows the draft's confidence more closely.

Peers (read, not copied): vLLM speculators 0.9.0 (`per_position_loss_weight: dpace`, default for DFlash,
requires `loss_fn: ce`, `dpace_alpha` 0.5), NVIDIA Model Optimizer (`dflash_loss_objective: dpace`, the
default, `dflash_dpace_alpha` 0.5), SpecForge (`--loss-type dpace`, opt-in; default `dflash`, the fixed
exponential decay). speculators keeps DSpark's confidence-head loss on the fixed decay; so does draftsmith.
"""
from __future__ import annotations

import torch

from draftsmith.core.errors import UserError

LOSSES = ("kl", "dpace")  # drafter.loss of the block drafters


@torch.no_grad()
def dpace_weights(confidence: torch.Tensor, mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """confidence [..., B] (q_i in [0, 1], slots in block order), mask [..., B] (1 on loss slots) ->
    w [..., B], detached: w_j = mask_j * sum_{m >= j} mask_m * prod_{i <= m} s_i, with
    s_i = (1 - alpha) q_i + alpha on loss slots and 1 elsewhere."""
    if not 0.0 < alpha <= 1.0:
        raise UserError(f"drafter.dpace_alpha must lie in (0, 1], got {alpha}")
    m = mask.to(torch.float32)
    smooth = torch.where(m > 0, (1.0 - alpha) * confidence.float() + alpha, torch.ones_like(m))
    prefix = torch.cumprod(smooth, dim=-1)  # [..., B]: prod_{i <= m} s_i
    suffix = (prefix * m).flip(-1).cumsum(-1).flip(-1)  # [..., B]: sum_{m >= j} mask_m prefix_m
    return suffix * m


def hard_ce(logq: torch.Tensor, top: torch.Tensor, draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logq [..., dv] draft log-probabilities, top [...] the target's argmax (target ids), draft_ids [dv] ->
    (CE [...] = -log q(top), 0 where top is outside the draft vocabulary; confidence [...] = q(top), 0 there:
    such a token can never be drafted, so its slot is never accepted)."""
    index = torch.full((int(max(int(draft_ids.max()), int(top.max())) + 1),), -1, dtype=torch.long,
                       device=draft_ids.device)
    index[draft_ids] = torch.arange(len(draft_ids), device=draft_ids.device)
    hard = index[top]  # [...] draft id of the argmax, -1 outside
    inside = hard >= 0
    logq_top = logq.gather(-1, hard.clamp_min(0)[..., None]).squeeze(-1)  # [...]
    ce = torch.where(inside, -logq_top, torch.zeros_like(logq_top))
    confidence = torch.where(inside, logq_top.detach().exp(), torch.zeros_like(logq_top))
    return ce, confidence
