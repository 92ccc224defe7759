"""Token-level divergences between the target distribution p and the draft distribution q, as
studied for draft-model distillation by DistillSpec (Zhou et al. 2023, "DistillSpec: Improving
Speculative Decoding via Knowledge Distillation", Table 1 and Section 4).

Every function takes log-probabilities over the same vocabulary, logp and logq of shape [..., V]
(log_softmax of finite logits, so finite), and returns one value per position, shape [...].

Why total variation: with speculative sampling (Leviathan et al. 2023, Corollary 3.6) the
probability that a draft token is accepted at one position is alpha = sum_x min(p(x), q(x))
= 1 - TV(p, q). DistillSpec's Theorem 1 builds on this: minimising TV maximises the expected
acceptance rate, which is what the draft model is for.
"""
from __future__ import annotations

import math
from typing import Union

import torch

from draftsmith.core.errors import UserError


def forward_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """FKL = KL(p || q) = sum_x p(x) (log p(x) - log q(x))  (DistillSpec Table 1, "FKL";
    mode-covering: the draft is pushed to put mass wherever the target does)."""
    return (logp.exp() * (logp - logq)).sum(-1)  # [..., V] -> [...]


def reverse_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """RKL = KL(q || p) = sum_x q(x) (log q(x) - log p(x))  (DistillSpec Table 1, "RKL";
    mode-seeking: the draft concentrates on the target's high-probability tokens)."""
    return (logq.exp() * (logq - logp)).sum(-1)  # [..., V] -> [...]


def jsd(logp: torch.Tensor, logq: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence JSD[beta] (DistillSpec Table 1, after Agarwal et
    al. 2023, GKD):

        m = beta * p + (1 - beta) * q
        JSD[beta](p || q) = beta * KL(p || m) + (1 - beta) * KL(q || m)

    Steps: 1. log m by logsumexp of the weighted log-probabilities (no underflow);
    2. the two KL terms against m; 3. their beta-weighted sum. beta must lie in (0, 1)."""
    if not 0.0 < beta < 1.0:
        raise UserError(f"jsd beta must lie strictly between 0 and 1, got {beta}")
    logm = torch.logaddexp(logp + math.log(beta), logq + math.log(1.0 - beta))  # 1. [..., V]
    kl_pm = (logp.exp() * (logp - logm)).sum(-1)  # 2. [..., V] -> [...]
    kl_qm = (logq.exp() * (logq - logm)).sum(-1)
    return beta * kl_pm + (1.0 - beta) * kl_qm  # 3.


def total_variation(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = 1/2 sum_x |p(x) - q(x)|  (DistillSpec Table 1, "TVD"); 1 - TV is the expected
    acceptance rate of speculative sampling (see the module docstring)."""
    return 0.5 * (logp.exp() - logq.exp()).abs().sum(-1)  # [..., V] -> [...]


def acceptance_rate(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q): the probability that speculative sampling
    accepts a token drawn from q (Leviathan et al. 2023, Definition 3.1 and Corollary 3.6)."""
    return torch.minimum(logp.exp(), logq.exp()).sum(-1)  # [..., V] -> [...]


# name -> function(logp, logq); "jsd" also takes beta.
DIVERGENCES = {"fkl": forward_kl, "rkl": reverse_kl, "jsd": jsd, "tv": total_variation}


def parse_weights(spec: Union[str, dict]) -> dict[str, float]:
    """A divergence name ("tv") or a weighted mix ({"tv": 0.5, "fkl": 0.5}) -> {name: weight}.

    Raises ValueError naming the bad entry and the known names."""
    weights = {spec: 1.0} if isinstance(spec, str) else dict(spec or {})
    if not weights:
        raise UserError(f"divergence: give a name or a mix of {sorted(DIVERGENCES)}, got {spec!r}")
    for name, w in weights.items():
        if name not in DIVERGENCES:
            raise UserError(f"divergence {name!r} is unknown; known: {sorted(DIVERGENCES)} (or a mix like "
                             "{'tv': 0.5, 'fkl': 0.5})")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
            raise UserError(f"divergence weight of {name!r} must be a number >= 0, got {w!r}")
    if sum(weights.values()) <= 0:
        raise UserError(f"divergence weights {weights} sum to 0: give at least one positive weight")
    return {k: float(v) for k, v in weights.items()}


def mixed(weights: dict[str, float], logp: torch.Tensor, logq: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """sum_name weight * D_name(p, q) per position: [..., V] -> [...]."""
    total = None
    for name, w in weights.items():
        if w == 0:
            continue
        value = jsd(logp, logq, beta) if name == "jsd" else DIVERGENCES[name](logp, logq)
        total = w * value if total is None else total + w * value
    return total
