"""The proposer cores several drafter kinds share (eval/loop.py drives them through heads.base.Proposer).

  LastStateProposer     commit() keeps h, the target state whose next token is the newest committed
                        token c (Medusa heads, MLP speculator stages read it; no KV cache).
  FeatureChainProposer  the drafter reads the target's features of the committed tokens into its own KV
                        cache and drafts by feeding its own output back (EAGLE-1: the last hidden state,
                        EAGLE-3: the fused aux states); rolls back to the committed context on commit;
                        chains and EAGLE-2 trees (eval/tree.py).
"""
from __future__ import annotations

import torch

from draftsmith.core.sampling import logits_to_probs, sample
from draftsmith.heads.base import Draft, FedNodes
from draftsmith.heads.draft_layer import KVCache


def draw(q: torch.Tensor, sampling, generator) -> torch.Tensor:
    """The draft token from q [V]: its argmax (greedy) or a sample."""
    return q.argmax() if sampling.greedy else sample(q, generator)


class LastStateProposer:
    """begin/commit of a proposer that reads the last committed target state (and the newest token)."""

    name = ""

    def __init__(self, drafter):
        self.drafter = drafter
        self.last_hidden: torch.Tensor | None = None

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.last_hidden = None

    @torch.no_grad()
    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        self.last_hidden = target_out.hidden_states[-1][:, -1:]  # [1, m, h] -> [1, 1, h]
        self._last_token = context[-1]

    def state(self, step: str) -> torch.Tensor:
        """h [1, 1, h]; the loop must have committed the prefill first."""
        if self.last_hidden is None:
            raise RuntimeError(f"{type(self).__name__}.{step} before commit(): the loop must commit the prefill first")
        return self.last_hidden


class FeatureChainProposer:
    """Chain drafting with the drafter's own KV cache (EAGLE-1, EAGLE-3). The drafter provides
    step(tokens, hidden, positions, cache) -> [1, m, h] and logits(out) -> [1, m, dv]; a subclass says
    which target features a committed token reads (features) and how draft logits map onto the target
    vocabulary (target_probs / target_logprobs; identity for a full-vocabulary drafter)."""

    name = ""

    def __init__(self, drafter):
        self.drafter = drafter

    def features(self, target_out) -> torch.Tensor:
        """[1, m, h] what the drafter reads for the m newly committed tokens."""
        raise NotImplementedError

    def target_probs(self, draft_logits: torch.Tensor, sampling) -> torch.Tensor:
        """[dv] draft logits -> [V] probabilities over the target vocabulary (same transform as p)."""
        return logits_to_probs(draft_logits, sampling)

    def target_logprobs(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[m, dv] draft logits -> [m, V] log-probabilities over the target vocabulary."""
        return torch.log_softmax(draft_logits.float(), -1)

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.cache = KVCache()
        self.committed = 0  # cache entries that belong to committed context
        self.last_out: torch.Tensor | None = None  # [1, 1, h] the drafter's output after the newest committed pair

    @torch.no_grad()
    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        d = self.drafter
        self.cache.crop(self.committed)  # drop the speculative chain of the last round
        hidden = self.features(target_out)  # [1, m, h]
        tokens = context[-num_new:].view(1, -1).to(hidden.device)  # x_{j+1}
        positions = torch.arange(self.committed, self.committed + num_new, device=hidden.device).view(1, -1)
        out = d.step(tokens, hidden, positions, cache=self.cache)
        self.committed += num_new
        self.last_out = out[:, -1:]

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling, generator=None) -> Draft:
        d = self.drafter
        out = self.last_out
        tokens, probs = [], []
        for i in range(k):
            q = self.target_probs(d.logits(out)[0, -1], sampling)  # [V]
            token = draw(q, sampling, generator)
            tokens.append(token)
            probs.append(q)
            if i + 1 < k:
                pos = torch.tensor([[self.committed + i]], device=out.device)
                out = d.step(token.view(1, 1), out, pos, cache=self.cache)  # feed the output back with the draft token
        return Draft(tokens=torch.stack(tokens).view(-1), probs=torch.stack(probs))

    # ------------------------------------------------------------------ tree drafting (eval/tree.py)
    @torch.no_grad()
    def tree_root(self) -> torch.Tensor:
        self.cache.crop(self.committed)
        self.tree_fed = FedNodes(self.last_out.device)
        self.tree_outs = self.last_out.new_zeros(1, 0, self.last_out.shape[-1])  # [1, F, h] per fed node
        return self.target_logprobs(self.drafter.logits(self.last_out)[0])[-1]  # [V]

    @torch.no_grad()
    def tree_expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
        """Feed m tree nodes at `depth` together: each reads its parent's output (the root's: last_out)
        and attends to the committed cache and its fed ancestors. -> [m, V] children log-probs."""
        dev = self.last_out.device
        parents = parents.to(dev)
        bank = torch.cat([self.last_out, self.tree_outs], dim=1)  # [1, 1 + F, h]: the root's output first
        self.cache.next_mask = self.tree_fed.add(parents, self.committed)  # [m, committed + F + m]
        pos = torch.full((1, tokens.shape[0]), self.committed + depth - 1, device=dev)
        out = self.drafter.step(tokens.view(1, -1).to(dev), bank[:, parents + 1], pos, cache=self.cache)  # [1, m, h]
        self.tree_outs = torch.cat([self.tree_outs, out], dim=1)  # [1, F, h] -> [1, F + m, h]
        return self.target_logprobs(self.drafter.logits(out)[0])  # [m, V]
