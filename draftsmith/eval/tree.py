"""Tree drafting for the speculative loop: tree construction, tree attention masks, tree
verification (greedy longest accepted path; exact multi-draft recursive rejection sampling)
and the gather of the accepted path's cache entries.

A tree holds N draft nodes under a root, the last committed token. Node i has a target-vocabulary
token, a parent (-1: the root) and a depth (1 + its parent's depth). Nodes are in topological
order (a parent before its children). The verification forward feeds [root, node 0..N-1]
(N + 1 positions) with a 4D attention mask in which every position sees the committed cache,
itself and its ancestors, and with position ids n_past + depth (root: depth 0).

Proposers that draft trees implement two methods (the "tree expander" protocol):
  tree_root()                          -> [V] draft log-probabilities of the token after the root
  tree_expand(tokens, parents, depth)  -> [m, V] draft log-probabilities of each fed node's children
    tokens [m] the nodes fed now, all at `depth` (1-based); parents [m] the FEED index of each
    node's parent (the order in which earlier tree_expand calls fed nodes; -1: the root).
A proposer keeps per-fed-node state (draft KV entries, hidden states) between the two calls of a
round and discards it in its next commit(). `heads.base.FedNodes` tracks the ancestor mask it needs.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import SamplingParams, logits_to_probs, sample


@dataclass
class TreeConfig:
    kind: str = "dynamic"  # dynamic: EAGLE-2 expand + rerank; static: a fixed sparse tree (Medusa)
    depth: int = 5  # deepest draft position
    topk: int = 4  # children expanded per node (dynamic); ranks per depth (static)
    budget: int = 16  # verify budget: draft nodes sent to the one verification forward
    # static: per-position top-k acceptance [depth][topk] the sparse tree is built from
    # (eval/tree_calibration.measure_topk_acceptance); None: the stated prior (prior_acceptance), not a measurement
    acceptance: list[list[float]] | None = None

    def __post_init__(self):
        if self.kind not in ("dynamic", "static"):
            raise UserError(f"--tree must be 'dynamic' or 'static', got {self.kind!r}")
        for name in ("depth", "topk", "budget"):
            if getattr(self, name) < 1:
                raise UserError(f"--tree-{name.replace('budget', 'verify-budget')} must be >= 1, got {getattr(self, name)}")


@dataclass
class Tree:
    tokens: torch.Tensor  # [N] long, target-vocabulary ids
    parents: torch.Tensor  # [N] long, parent node index (-1: the root)
    depths: torch.Tensor  # [N] long, 1-based

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def chain(cls, tokens: torch.Tensor) -> "Tree":
        n = tokens.shape[0]
        return cls(tokens, torch.arange(n, device=tokens.device) - 1, torch.arange(1, n + 1, device=tokens.device))

    def children(self, node: int) -> list[int]:
        """Node indices whose parent is `node` (-1: the root's children), in tree order."""
        return (self.parents == node).nonzero().flatten().tolist()


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """[N] parent indices (topological order) -> [N, N] bool, row i marks i and its ancestors."""
    n = parents.shape[0]
    anc = torch.eye(n, dtype=torch.bool, device=parents.device)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def verify_inputs(tree: Tree, n_past: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree attention mask and position ids of the verification forward over [root, nodes].

    -> mask [1, 1, N+1, n_past+N+1] additive (0 attend, dtype-min masked: eager adds it, sdpa takes
    it as a float mask), positions [1, N+1] = n_past + depth (the root at n_past).
    """
    n, dev = len(tree), tree.tokens.device
    seen = torch.zeros(n + 1, n_past + n + 1, dtype=torch.bool, device=dev)
    seen[:, : n_past + 1] = True  # the committed cache and the root
    seen[1:, n_past + 1:] = ancestor_matrix(tree.parents)  # [N, N]: itself and its ancestors
    mask = torch.zeros(seen.shape, dtype=dtype, device=dev).masked_fill(~seen, torch.finfo(dtype).min)
    positions = n_past + torch.cat([torch.zeros(1, dtype=torch.long, device=dev), tree.depths])  # [N+1]
    return mask[None, None], positions[None]  # [1, 1, N+1, n_past+N+1], [1, N+1]


# ---------------------------------------------------------------- construction
def dynamic_tree(proposer, depth: int, topk: int, budget: int) -> Tree:
    """EAGLE-2 dynamic draft tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models
    with Dynamic Draft Trees", sec. 4). Steps:
    1. expand the root: its top-K tokens become depth-1 nodes, score = draft log-probability;
    2. for depth 2..D: feed the K best nodes of the previous depth (the frontier) to the drafter
       together (one forward with a tree mask); each gets its top-K children, score = parent score
       + log q (the cumulative log-probability, an estimate of the path's acceptance);
    3. rerank: keep the `budget` nodes of highest score over all depths. A child never scores above
       its parent (log q <= 0) and ties go to the shallower node, so the kept set is a tree.
    """
    tokens, parents, depths, scores, fed = [], [], [], [], []  # per candidate node; fed: feed index or -1
    lp = proposer.tree_root()  # [V]
    top = lp.topk(min(topk, lp.shape[-1]))
    layer = []
    for s, t in zip(top.values.tolist(), top.indices.tolist()):  # 1.
        if s > float("-inf"):
            layer.append(len(tokens))
            tokens.append(t), parents.append(-1), depths.append(1), scores.append(s), fed.append(-1)
    n_fed = 0
    for d in range(2, depth + 1):  # 2.
        frontier = sorted(layer, key=lambda i: -scores[i])[:topk]
        if not frontier:
            break
        feed_parents = torch.tensor([fed[parents[i]] if parents[i] >= 0 else -1 for i in frontier])
        lp = proposer.tree_expand(torch.tensor([tokens[i] for i in frontier]), feed_parents, d - 1)  # [m, V]
        for i in frontier:
            fed[i], n_fed = n_fed, n_fed + 1
        top = lp.topk(min(topk, lp.shape[-1]), dim=-1)  # [m, K]
        layer = []
        for row, i in enumerate(frontier):
            for s, t in zip(top.values[row].tolist(), top.indices[row].tolist()):
                if s > float("-inf"):
                    layer.append(len(tokens))
                    tokens.append(t), parents.append(i), depths.append(d), scores.append(scores[i] + s), fed.append(-1)
    keep = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))[:budget]  # 3.
    return _subtree(tokens, parents, depths, keep)


def _subtree(tokens, parents, depths, keep) -> Tree:
    """The kept candidate nodes re-indexed in topological order (by depth, then candidate order)."""
    keep = sorted(keep, key=lambda i: (depths[i], i))
    index = {old: new for new, old in enumerate(keep)}
    if any(parents[i] >= 0 and parents[i] not in index for i in keep):
        raise AssertionError("tree rerank kept a node without its parent")
    return Tree(torch.tensor([tokens[i] for i in keep], dtype=torch.long),
                torch.tensor([index[parents[i]] if parents[i] >= 0 else -1 for i in keep], dtype=torch.long),
                torch.tensor([depths[i] for i in keep], dtype=torch.long))


def sparse_tree_choices(acceptance: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """Medusa's sparse tree (Cai et al. 2024, "Medusa", sec. 2.3.1): choose the `budget` paths of
    ranks (r_1, .., r_d) with the highest estimated probability prod_j acceptance[j][r_j], where
    acceptance[j][r] is the probability that the rank-r candidate at draft position j is the
    target's token. Best-first: a child is pushed only once its parent is chosen, and it never
    scores above its parent, so the chosen set is a tree."""
    heap = [(-acceptance[0][r], (r,)) for r in range(len(acceptance[0]))]
    heapq.heapify(heap)
    chosen: list[tuple[int, ...]] = []
    while heap and len(chosen) < budget:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < len(acceptance):
            for r, a in enumerate(acceptance[len(path)]):
                heapq.heappush(heap, (neg * a, path + (r,)))
    return chosen


def prior_acceptance(depth: int, topk: int) -> list[list[float]]:
    """A stand-in for measured per-position top-k acceptance (NOT measured): rank r at any depth
    is right with probability 0.5 / (r + 1). Pass measured values to sparse_tree_choices instead
    where they exist."""
    return [[0.5 / (r + 1) for r in range(topk)] for _ in range(depth)]


def static_tree(proposer, choices: list[tuple[int, ...]]) -> Tree:
    """A fixed tree of rank paths (Medusa's sparse trees): node (r_1..r_d) is the rank-r_d token of
    the draft distribution at its parent (r_1..r_{d-1}). Steps:
    1. depth 1: ranks of the root's distribution;
    2. depth d >= 2: feed the depth-(d-1) nodes that have children (one tree_expand call), then
       take each child's rank from its parent's distribution."""
    choices = sorted(set(choices), key=lambda c: (len(c), c))
    node_of: dict[tuple[int, ...], int] = {}
    tokens, parents, depths = [], [], []
    fed: dict[int, int] = {}
    lp_of: dict[int, torch.Tensor] = {-1: proposer.tree_root()}  # 1. node -> its children's log-probs
    max_depth = max((len(c) for c in choices), default=0)
    for d in range(1, max_depth + 1):
        level = [c for c in choices if len(c) == d]
        if d >= 2:  # 2.
            need = sorted({node_of[c[:-1]] for c in level if c[:-1] in node_of})
            if need:
                feed_parents = torch.tensor([fed.get(parents[i], -1) for i in need])
                lp = proposer.tree_expand(torch.tensor([tokens[i] for i in need]), feed_parents, d - 1)  # [m, V]
                for row, i in enumerate(need):
                    fed[i] = len(fed)
                    lp_of[i] = lp[row]
        for c in level:
            parent = node_of.get(c[:-1], -1) if d >= 2 else -1
            if d >= 2 and c[:-1] not in node_of:
                raise UserError(f"static tree choice {c} has no parent {c[:-1]} in the tree")
            lp = lp_of[parent]
            top = lp.topk(c[-1] + 1)
            if top.values[-1] == float("-inf"):
                continue  # rank beyond the draft vocabulary
            node_of[c] = len(tokens)
            tokens.append(int(top.indices[-1])), parents.append(parent), depths.append(d)
    return _subtree(tokens, parents, depths, list(range(len(tokens))))


def build(proposer, cfg: TreeConfig, depth: int) -> Tree:
    """The round's tree, at most `depth` deep (the loop lowers it near max_new_tokens)."""
    if not (hasattr(proposer, "tree_root") and hasattr(proposer, "tree_expand")):
        raise UserError(f"proposer {getattr(proposer, 'name', type(proposer).__name__)!r} does not draft trees; "
                         "drop --tree or use an eagle1/eagle3/medusa/mlp_speculator checkpoint or --draft-model")
    depth = min(depth, cfg.depth, getattr(proposer, "max_tree_depth", depth))
    if cfg.kind == "dynamic":
        return dynamic_tree(proposer, depth, cfg.topk, cfg.budget)
    acc = cfg.acceptance[:depth] if cfg.acceptance else prior_acceptance(depth, cfg.topk)
    return static_tree(proposer, sparse_tree_choices(acc, cfg.budget))


# ---------------------------------------------------------------- verification
def recursive_rejection(p: torch.Tensor, candidates: torch.Tensor, q: torch.Tensor | None = None,
                        replacement: bool = False, generator: torch.Generator | None = None) -> tuple[int, int]:
    """Multi-draft recursive rejection sampling: SpecInfer (Miao et al. 2024, "multi-step speculative
    sampling"), SpecTr (Sun et al. 2023); the without-replacement update is Sequoia's (Chen et al. 2024).

    p [V] the target distribution; candidates [m] draft tokens; q [V] the distribution they were drawn
    from (i.i.d. when replacement, else without replacement), or None: deterministic candidates (top-k),
    each its own one-hot draft. Returns (index of the accepted candidate or -1, emitted token), the
    token distributed exactly as p. Steps, for i = 1..m:
    1. accept x_i with probability min(1, p(x_i) / q(x_i))  (q one-hot: p(x_i));
    2. on rejection p <- norm(max(0, p - q)); without replacement also q(x_i) <- 0, q <- norm(q);
    3. if every candidate is rejected, sample the token from the final p.
    """
    p = p.float().clone()
    det = q is None
    if not det:
        q = q.float().clone().to(p.device)
    for i, x in enumerate(candidates.tolist()):
        qi = p.new_zeros(p.shape).index_fill_(0, torch.tensor([x], device=p.device), 1.0) if det else q
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * float(qi[x]) <= float(p[x]) and float(qi[x]) > 0:  # 1. without a division
            return i, x
        residual = (p - qi).clamp_min(0.0)  # 2.
        total = residual.sum()
        p = residual / total if total > 0 else p  # total 0 only through float rounding (p == q)
        if not det and not replacement:
            q[x] = 0.0
            qs = q.sum()
            if qs <= 0:
                break
            q = q / qs
    return -1, int(sample(p, generator).item())  # 3.


@dataclass
class TreeVerdict:
    path: list[int]  # accepted node indices, root to leaf (len = accepted draft tokens)
    token: int  # the correction or bonus token after the path


def verify_tree(tree: Tree, target_logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None = None) -> TreeVerdict:
    """Walk the tree from the root; row 0 of target_logits [N+1, V] scores the token after the
    root, row 1 + i the token after node i. Steps:
    1. at the current node, take its children (tree order);
    2. greedy: move to the child whose token is the target's argmax (the longest accepted path);
       stochastic: recursive_rejection over the children (deterministic candidates) with p after
       the sampling transform; an accepted child becomes the current node;
    3. when no child is accepted (or a leaf is reached), emit the argmax / the sampled token.
    """
    node, path = -1, []
    probs = None if params.greedy else logits_to_probs(target_logits, params)  # [N+1, V]
    while True:
        kids = tree.children(node)  # 1.
        row = node + 1
        if params.greedy:  # 2.
            choice = int(target_logits[row].argmax(-1))
            match = [c for c in kids if int(tree.tokens[c]) == choice]
            if not match:
                return TreeVerdict(path, choice)  # 3.
            node = match[0]
        else:
            idx, token = recursive_rejection(probs[row], tree.tokens[kids], None, generator=generator)
            if idx < 0:
                return TreeVerdict(path, token)  # 3.
            node = kids[idx]
        path.append(node)


def keep_indices(path: list[int], n_past: int, device) -> torch.Tensor:
    """Cache rows to keep after verification: the committed past, the root and the accepted nodes
    (row n_past + 1 + i for node i)."""
    nodes = torch.tensor(path, dtype=torch.long, device=device) + n_past + 1
    return torch.cat([torch.arange(n_past + 1, device=device), nodes])  # [n_past + 1 + a]


def gather_cache(cache, keep: torch.Tensor) -> None:
    """Keep only the cache rows `keep` (sequence axis) in every layer: the accepted path's entries
    (a gather, not a crop: accepted tree nodes need not be contiguous)."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(-2, keep)  # [b, kv, L, d] -> [b, kv, len(keep), d]
        layer.values = layer.values.index_select(-2, keep)
