"""Sampling transforms shared by the target (p) and every proposer (q).

p and q must go through the SAME transform (temperature, then top-k, then top-p) before
verification; that is what keeps stochastic verification exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy (probabilities one-hot on the argmax)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature/top-k/top-p."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        # Keep the smallest set of tokens whose mass reaches top_p (the top token always stays).
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop = mass_before >= params.top_p
        drop[..., 0] = False  # the top token stays even when rounding leaves its mass_before above a tiny top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """[..., V] probabilities -> [...] ids (argmax when the distribution is one-hot)."""
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return ids.reshape(probs.shape[:-1])


# ---------------------------------------------------------------- verification rules
@dataclass(frozen=True)
class Verdict:
    accepted: int  # number of draft tokens accepted (0..k)
    token: int  # the target's correction token (after a rejection) or bonus token (all accepted)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Greedy verification (lossless): accept while the draft equals the target argmax.

    draft_tokens [k]; target_logits [k+1, V], row j scoring the token after draft position j-1
    (row 0: after the last committed token). Steps:
    1. argmax of every row: the target's own greedy choices g_0..g_k.
    2. accepted = length of the longest prefix with d_i == g_i.
    3. the emitted token is g_accepted (the correction, or the bonus token when all k match).
    """
    choices = target_logits.argmax(-1)  # [k+1, V] -> [k+1]
    k = draft_tokens.shape[0]
    matches = (draft_tokens.to(choices.device) == choices[:k]).long()  # [k]
    accepted = int(matches.cumprod(0).sum().item()) if k else 0
    return Verdict(accepted, int(choices[accepted].item()))


def verify_stochastic(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                      generator: torch.Generator | None = None) -> Verdict:
    """Exact speculative sampling (Leviathan et al. 2023, alg. 1; Chen et al. 2023, alg. 2).

    draft_tokens [k]; draft_probs [k, V] the q each draft was drawn from (None: a deterministic
    proposer, q one-hot on its token); target_probs [k+1, V] the target's p after the SAME
    temperature/top-k/top-p transform. The emitted tokens are distributed exactly as p. Steps:
    1. for i = 0..k-1: draw u ~ U[0, 1) and accept d_i when u < p_i(d_i) / q_i(d_i), which happens with
       probability min(1, p/q). The comparison is strict: with u = 0 (torch.rand can return it) a
       token the target gives p = 0 must still be rejected.
    2. on the first rejection at i, emit a token drawn from norm(max(0, p_i - q_i)) and stop.
    3. if all k are accepted, emit a bonus token drawn from p_k.
    """
    k = draft_tokens.shape[0]
    device = target_probs.device
    draft_tokens = draft_tokens.to(device)
    if draft_probs is None:  # deterministic proposer: q = one-hot(d_i)
        draft_probs = torch.nn.functional.one_hot(draft_tokens, target_probs.shape[-1]).float()  # [k] -> [k, V]
    draft_probs = draft_probs.to(device)
    rows = torch.arange(k, device=device)
    p_tok = target_probs[rows, draft_tokens]  # [k]
    q_tok = draft_probs[rows, draft_tokens]  # [k]
    u = torch.rand(k, generator=generator, device=device)  # [k]
    accept = (u * q_tok < p_tok).long()  # step 1: u < p/q, written without a division (q may be 0 after top-k)
    accepted = int(accept.cumprod(0).sum().item()) if k else 0
    if accepted == k:  # step 3: bonus token from p
        return Verdict(k, int(sample(target_probs[k], generator).item()))
    residual = (target_probs[accepted] - draft_probs[accepted]).clamp_min(0.0)  # step 2, [V]
    total = residual.sum()
    if total <= 0:
        # Only reachable through float rounding (p == q up to noise, then u*q >= p by an ulp):
        # norm(max(0, p - q)) is then undefined and its limit is p itself.
        residual, total = target_probs[accepted], target_probs[accepted].sum()
    return Verdict(accepted, int(sample(residual / total, generator).item()))


def verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
           params: SamplingParams, generator: torch.Generator | None = None) -> Verdict:
    """The lossless rule for `params`: greedy when temperature is 0, exact stochastic otherwise.

    target_logits [k+1, V] raw logits of the verification forward. Both rules preserve the
    target's output distribution; draftsmith has no lossy (relaxed) rule, and one added later
    must set `lossless = False` in VERIFICATION_RULES so that results label it.
    """
    if params.greedy:
        return verify_greedy(draft_tokens, target_logits)
    target_probs = logits_to_probs(target_logits, params)  # [k+1, V]
    return verify_stochastic(draft_tokens, draft_probs, target_probs, generator)


# name -> whether the rule preserves the target distribution exactly (results record both).
VERIFICATION_RULES = {"greedy": True, "stochastic": True}


def rule_name(params: SamplingParams) -> str:
    return "greedy" if params.greedy else "stochastic"
