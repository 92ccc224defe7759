"""Tree drafting (eval/tree.py): the tree-masked verification forward equals plain forwards of
each root-to-node path (sdpa and eager), the cache gather, greedy longest path, exact multi-draft
recursive rejection sampling (chi-square, with negative controls), and lossless tree decoding
for every proposer kind that drafts trees."""
from __future__ import annotations

import pytest
import torch
from test_verification import chi_square_pvalue

from draftsmith.core.sampling import SamplingParams, logits_to_probs, sample
from draftsmith.eval import tree as tree_mod
from draftsmith.eval import tree_calibration
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads import draft_lm as draft_lm_mod
from draftsmith.testing import tiny_target

#           0   1   2   3   4   5      parents: a depth-3 tree with two branches at the root
TOKENS = [10, 11, 20, 21, 30, 31]
PARENTS = [-1, -1, 0, 0, 2, 1]


def _tree():
    p = torch.tensor(PARENTS)
    depths = torch.ones(len(PARENTS), dtype=torch.long)
    for i, q in enumerate(PARENTS):
        if q >= 0:
            depths[i] = depths[q] + 1
    return tree_mod.Tree(torch.tensor(TOKENS), p, depths)


def _path(node):
    out = []
    while node >= 0:
        out.append(node)
        node = PARENTS[node]
    return out[::-1]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def target(request):
    t = tiny_target(num_layers=2, hidden=32, vocab=128, seed=3)
    t.model.set_attn_implementation(request.param)
    return t


def test_mask_and_positions():
    mask, pos = tree_mod.verify_inputs(_tree(), n_past=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 7, 10) and pos.tolist() == [[3, 4, 4, 5, 5, 6, 5]]
    seen = (mask[0, 0] == 0)
    assert seen[:, :4].all()  # everyone sees the past and the root
    assert seen[5, 4:].tolist() == [True, False, True, False, True, False]  # node 4: itself, 2, 0


def test_tree_forward_equals_path_forwards_and_gather(target):
    from transformers import DynamicCache

    context = torch.tensor([5, 17, 42, 99])  # committed; the cache holds all but the last
    tree = _tree()
    cache = DynamicCache(config=target.config)
    target.forward(context[None, :-1], cache=cache)
    mask, pos = tree_mod.verify_inputs(tree, 3, target.dtype)
    out = target.forward(torch.cat([context[-1:], tree.tokens])[None], attention_mask=mask, cache=cache, position_ids=pos)
    for node in range(len(tree)):
        seq = torch.cat([context, tree.tokens[_path(node)]])
        ref = target.forward(seq[None])
        torch.testing.assert_close(out.logits[0, node + 1], ref.logits[0, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits[0, 0], target.forward(context[None]).logits[0, -1], atol=1e-5, rtol=1e-5)
    # keep the path root -> 0 -> 2 -> 4: the gathered cache then continues exactly like a fresh one
    path = _path(4)
    tree_mod.gather_cache(cache, tree_mod.keep_indices(path, 3, context.device))
    assert cache.get_seq_length() == 4 + len(path)
    nxt = torch.tensor([[7]])
    got = target.forward(nxt, cache=cache).logits[0, -1]
    ref = target.forward(torch.cat([context, tree.tokens[path], nxt[0]])[None]).logits[0, -1]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_greedy_takes_the_longest_accepted_path():
    tree = _tree()
    logits = torch.zeros(7, 64)
    logits[0, 10] = logits[1, 20] = logits[3, 30] = logits[5, 50] = 1  # root->10, 10->20, 20->30, 30->50
    v = tree_mod.verify_tree(tree, logits, SamplingParams())
    assert v.path == [0, 2, 4] and v.token == 50
    logits[0] = 0
    logits[0, 11] = 1  # root -> 11, then node 1 (row 2) wants 0: node 5 (31) rejected
    v = tree_mod.verify_tree(tree, logits, SamplingParams())
    assert v.path == [1] and v.token == 0


def _naive(p, candidates, q, generator):
    """NEGATIVE CONTROL: accept each candidate with min(1, p/q) but never update p to the residual."""
    for i, x in enumerate(candidates.tolist()):
        if float(torch.rand((), generator=generator)) * float(q[x]) <= float(p[x]):
            return i, x
    return -1, int(sample(p, generator))


N = 4000


@pytest.mark.parametrize("mode", ["deterministic", "with_replacement", "without_replacement"])
def test_recursive_rejection_reproduces_p(mode):
    gen = torch.Generator().manual_seed(0)
    p = logits_to_probs(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5]), SamplingParams(1.0))
    q = logits_to_probs(torch.tensor([0.0, 2.0, 0.5, 1.0, 1.0, -2.0]), SamplingParams(1.0))
    counts, naive = torch.zeros(6), torch.zeros(6)
    for _ in range(N):
        if mode == "deterministic":
            cands, qq = torch.tensor([1, 3, 4]), None  # q's top-3, not p's
        else:
            cands = torch.multinomial(q, 3, replacement=mode == "with_replacement", generator=gen)
            qq = q
        _, tok = tree_mod.recursive_rejection(p, cands, qq, replacement=mode == "with_replacement", generator=gen)
        counts[tok] += 1
        if mode == "with_replacement":
            naive[_naive(p, cands, q, gen)[1]] += 1
    assert chi_square_pvalue(counts, p) > 1e-3
    if mode == "with_replacement":  # the test has power: skipping the residual update is caught
        assert chi_square_pvalue(naive, p) < 1e-6


def test_stochastic_tree_reproduces_the_joint_of_two_tokens():
    """A 2-level tree over a fixed bigram table: the first two emitted tokens ~ p(x1) p(x2 | x1)."""
    gen = torch.Generator().manual_seed(2)
    V, root = 5, 0
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(5)) * 1.5
    params = SamplingParams(1.0)
    P = logits_to_probs(table, params)  # [V, V]
    tree = tree_mod.Tree(torch.tensor([1, 2, 3, 0, 4]), torch.tensor([-1, -1, 0, 0, 1]), torch.tensor([1, 1, 2, 2, 2]))
    logits = torch.stack([table[root]] + [table[t] for t in tree.tokens.tolist()])  # [N+1, V]
    counts = torch.zeros(V * V)
    for _ in range(N // 2):
        v = tree_mod.verify_tree(tree, logits, params, gen)
        seq = tree.tokens[v.path].tolist() + [v.token]
        if len(seq) < 2:  # the next round would draw the second token from p(. | first)
            seq.append(int(sample(P[seq[0]], gen)))
        counts[seq[0] * V + seq[1]] += 1
    joint = (P[root][:, None] * P).reshape(-1)  # [V*V]
    assert chi_square_pvalue(counts, joint) > 1e-3
    # power: a tree rule that accepted the first child always would not give p
    wrong = torch.zeros(V * V)
    wrong[1 * V + 3] = N // 2
    assert chi_square_pvalue(wrong, joint) < 1e-6


def test_dynamic_tree_keeps_the_budget_best_and_is_a_tree():
    class Fixed:
        """Draft log-probs that depend only on the depth: token t has weight 2^-t."""
        def tree_root(self):
            return torch.log_softmax(-torch.arange(8.0) * 0.7, -1)

        def tree_expand(self, tokens, parents, depth):
            return self.tree_root().expand(tokens.shape[0], -1)

    tree = tree_mod.dynamic_tree(Fixed(), depth=4, topk=3, budget=9)
    assert len(tree) == 9
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))  # topological, parents kept
    assert tree.tokens[tree.depths == 1].tolist() == [0, 1, 2]
    assert int(tree.depths.max()) == 4  # the greedy chain survives the rerank
    chain = tree_mod.dynamic_tree(Fixed(), depth=4, topk=1, budget=4)
    assert chain.parents.tolist() == [-1, 0, 1, 2]


def test_sparse_tree_choices_best_first():
    acc = [[0.8, 0.1], [0.7, 0.2], [0.6, 0.1]]
    # 0.8, 0.56, 0.336, then (0, 1) = 0.16 beats (1,) = 0.1 and (0, 0, 1) = 0.056
    assert tree_mod.sparse_tree_choices(acc, 5) == [(0,), (0, 0), (0, 0, 0), (0, 1), (1,)]


def _heads(kind, target):
    from draftsmith.eval import proposers
    from draftsmith.heads import DRAFTERS

    cls = DRAFTERS.get(kind)
    torch.manual_seed(0)
    opts = {"medusa": {"num_heads": 3}, "mlp_speculator": {"n_predict": 3}}.get(kind, {})
    return proposers.from_drafter(cls.from_target(cls.Config(**opts), target), target)


@pytest.mark.parametrize("kind", ["eagle3", "eagle1", "medusa", "mlp_speculator", "draft_lm"])
@pytest.mark.parametrize("tree_kind", ["dynamic", "static"])
def test_tree_decoding_is_lossless(kind, tree_kind):

    t = tiny_target(num_layers=2, hidden=32, vocab=128, seed=1)
    if kind == "draft_lm":  # the target itself: its trees are accepted deep, exercising the gather
        proposer = draft_lm_mod.DraftModelProposer(t.model, t.vocab_size)
    else:
        proposer = _heads(kind, t)
    prompt = torch.tensor([1, 40, 41, 42, 43])
    base = generate(t, None, prompt, LoopConfig(k=0, max_new_tokens=24, eos_ids=[])).tokens
    cfg = LoopConfig(k=3, max_new_tokens=24, eos_ids=[], tree=tree_mod.TreeConfig(tree_kind, depth=3, topk=2, budget=6))
    g = generate(t, proposer, prompt, cfg)
    assert g.tokens == base
    assert all(r.proposed <= 6 for r in g.rounds) and len(g.tokens) == 24
    if kind == "draft_lm":
        assert max(r.accepted for r in g.rounds) >= 2


@pytest.mark.parametrize("kind", ["eagle3", "eagle1", "mlp_speculator", "draft_lm"])
def test_siblings_do_not_leak_into_a_nodes_draft(kind):
    """A node's children log-probs are the same whether its siblings were fed beside it or not."""

    t = tiny_target(num_layers=2, hidden=32, vocab=128, seed=1)
    proposer = draft_lm_mod.DraftModelProposer(t.model, t.vocab_size) if kind == "draft_lm" else _heads(kind, t)
    prompt = torch.tensor([1, 40, 41, 42, 43])
    out = t.forward(prompt[None])

    def run(first_level):
        proposer.begin(prompt)
        proposer.commit(prompt, prompt.shape[0], out)
        proposer.tree_root()
        proposer.tree_expand(torch.tensor(first_level), torch.tensor([-1] * len(first_level)), 1)
        parent = len(first_level) - 1  # feed index of token 77
        return proposer.tree_expand(torch.tensor([9]), torch.tensor([parent]), 2)[0]

    torch.testing.assert_close(run([50, 60, 77]), run([77]), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(run([50, 60, 77]), run([50, 60, 78]), atol=1e-4)  # the parent's token matters


def test_stochastic_tree_loop_runs_to_length():
    t = tiny_target(num_layers=2, hidden=32, vocab=128, seed=1)

    proposer = draft_lm_mod.DraftModelProposer(t.model, t.vocab_size)  # q = p: deep acceptance at T = 1
    cfg = LoopConfig(k=3, max_new_tokens=20, eos_ids=[], sampling=SamplingParams(1.0),
                     tree=tree_mod.TreeConfig("dynamic", depth=3, topk=2, budget=6))
    g = generate(t, proposer, torch.tensor([1, 40, 41]), cfg, torch.Generator().manual_seed(0))
    assert len(g.tokens) == 20 and max(r.accepted for r in g.rounds) >= 1


def test_measured_topk_acceptance_builds_the_static_tree():

    t = tiny_target(num_layers=2, hidden=32, vocab=128, seed=1)
    prompts = [torch.tensor([1, 40, 41]), torch.tensor([1, 7, 8, 9])]
    same = tree_calibration.measure_topk_acceptance(t, draft_lm_mod.DraftModelProposer(t.model, t.vocab_size), prompts, 3, 2, 12)
    assert [row[0] for row in same] == [1.0, 1.0, 1.0]  # the target as its own drafter: always rank 0
    heads = _heads("medusa", t)  # 3 heads: depth is capped there
    acc = tree_calibration.measure_topk_acceptance(t, heads, prompts, 5, 3, 12)
    assert len(acc) == 3 and all(0 <= sum(row) <= 1 + 1e-9 for row in acc)
    cfg = tree_mod.TreeConfig("static", depth=3, topk=3, budget=5, acceptance=acc)
    base = generate(t, None, prompts[0], LoopConfig(k=0, max_new_tokens=12, eos_ids=[])).tokens
    assert generate(t, heads, prompts[0], LoopConfig(k=3, max_new_tokens=12, eos_ids=[], tree=cfg)).tokens == base
