"""Hybrid targets (issue 42) in the one speculative loop: recurrent / conv layers restored to the
accepted prefix after every rejection (targets/state_cache.py), on tiny random-weight models of every
hybrid architecture in archs.TINY, float32.

- greedy speculative output == target-only output, with rejections, for both rollback modes;
- after a round with a rejection, every layer's state equals the state of a fresh prefill of the
  committed tokens (the rollback itself, not only its effect on the argmax);
- trees and batches refuse a hybrid target in one line;
- at T = 1 the loop reproduces the hybrid target's own law (chi-square, exact law by enumeration)."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from test_verification import chi_square_pvalue

from draftsmith import testing
from draftsmith.core.errors import UserError
from draftsmith.core.sampling import SamplingParams
from draftsmith.eval.loop import BatchState, LoopConfig, SpeculativeState, generate
from draftsmith.eval.proposers import ReplayProposer
from draftsmith.eval.tree import TreeConfig
from draftsmith.heads.draft_lm import DraftModelProposer
from draftsmith.targets import archs, state_cache
from draftsmith.targets.load import Target

HYBRIDS = [name for name, (_, make) in archs.TINY.items() if state_cache.has_state_layers(make())]
NEW = 24


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and on a shared machine much faster than several."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _prompt(target) -> torch.Tensor:
    return torch.randint(3, target.vocab_size, (9,), generator=torch.Generator().manual_seed(1))


def _sometimes_wrong(target, prompt, base, seed=0):
    """The target's own greedy continuation, each draft token replaced by a wrong one with probability 0.35."""
    return ReplayProposer({tuple(prompt.tolist()): prompt.tolist() + base}, target.vocab_size, miss_rate=0.35, seed=seed)


def test_the_matrix_has_at_least_six_hybrids():
    assert len(HYBRIDS) >= 6, HYBRIDS
    assert not state_cache.has_state_layers(archs.TINY["llama3"][1]())


@pytest.mark.parametrize("arch", HYBRIDS)
def test_greedy_lossless_with_rejections(arch):
    target = testing.arch_target(arch)
    prompt = _prompt(target)
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=NEW, eos_ids=[])).tokens
    ids = prompt.tolist()  # the reference of the reference: full forwards without any cache
    with torch.no_grad():
        for _ in range(NEW):
            ids.append(int(target.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert base == ids[len(prompt):]
    for mode in state_cache.ROLLBACK_MODES:
        spec = generate(target, _sometimes_wrong(target, prompt, base), prompt,
                        LoopConfig(k=5, max_new_tokens=NEW, eos_ids=[], state_rollback=mode))
        assert spec.tokens == base, mode
        assert sum(r.accepted < r.proposed for r in spec.rounds) >= 2, mode  # rollback exercised


def _states(cache) -> list[torch.Tensor]:
    """Every tensor the cache needs for the next token: keys/values, the last conv window, recurrent states."""
    out = []
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None:
            out += [layer.keys, layer.values]
        for i in getattr(layer, "conv_states", {}) or {}:
            conv = layer.conv_states[i]
            if conv is not None:
                out.append(conv[..., -layer.conv_kernel_size[i]:])
            if layer.recurrent_states[i] is not None:
                out.append(layer.recurrent_states[i])
    return out


@pytest.mark.parametrize("mode", state_cache.ROLLBACK_MODES)
@pytest.mark.parametrize("arch", ["qwen3.5", "falcon-h1", "lfm2"])
def test_rolled_back_states_equal_a_fresh_prefill(arch, mode):
    target = testing.arch_target(arch)
    prompt = _prompt(target)
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=NEW, eos_ids=[])).tokens
    state = SpeculativeState(target, _sometimes_wrong(target, prompt, base, seed=3), LoopConfig(
        k=5, max_new_tokens=NEW, eos_ids=[], state_rollback=mode))
    state.prefill(prompt)
    checked = 0
    while not state.done and checked < 3:
        stats = state.step()
        if stats.accepted == stats.proposed or state.done:
            continue
        fresh = state_cache.seq_length(state.cache)
        assert fresh == state.context.shape[0] - 1
        ref = archs.new_cache(target.config)
        target.forward(state.context[None, :-1], cache=ref)
        for got, want in zip(_states(state.cache), _states(ref), strict=True):
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-4)
        checked += 1
    assert checked >= 1


def test_trees_and_batches_are_refused_in_one_line():
    target = testing.arch_target("qwen3.5")
    with pytest.raises(UserError) as tree:
        SpeculativeState(target, object(), LoopConfig(k=2, tree=TreeConfig(depth=2)))
    with pytest.raises(UserError) as batch:
        BatchState(target, [None, None], LoopConfig(k=0))
    for exc in (tree, batch):
        text = str(exc.value)
        assert "\n" not in text and "hybrid targets" in text and "linear_attention" in text
    with pytest.raises(UserError, match="state_rollback"):
        SpeculativeState(target, None, LoopConfig(k=0, state_rollback="guess"))


V = 8  # the chi-square target's vocabulary: its law over 3 new tokens is enumerated exactly


def _tiny_hybrid(arch: str, seed: int) -> Target:
    cfg = archs.TINY[arch][1]()
    cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = V, None, None, None
    torch.manual_seed(seed)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # peaked, position-dependent next-token laws
    return Target(model, SimpleNamespace(eos_token_id=None, get_vocab=lambda: {"t": 0}), name=f"{arch}-v{V}")


@torch.no_grad()
def _exact_law(target, prompt: list[int], n: int) -> torch.Tensor:
    """P(t1..tn | prompt) as a [V] * n tensor, from full forwards over every prefix (no cache)."""
    law = torch.softmax(target.model(torch.tensor([prompt])).logits[0, -1].double(), -1)  # [V]
    for depth in range(1, n):
        prefixes = torch.tensor([prompt + list(p) for p in itertools.product(range(V), repeat=depth)])  # [V^d, P+d]
        nxt = torch.softmax(target.model(prefixes).logits[:, -1].double(), -1)  # [V^d, V]
        law = law.reshape(-1, 1) * nxt  # [V^d, V]
    return law.reshape([V] * n)


@pytest.mark.parametrize("arch", ["qwen3.5"])
def test_stochastic_loop_reproduces_the_hybrid_targets_law(arch):
    target = _tiny_hybrid(arch, seed=0)
    draft = _tiny_hybrid(arch, seed=0).model  # the same hybrid with a noisy head: close to p, often wrong
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(11)))
    drafter = DraftModelProposer(draft, V)  # its own hybrid cache is rolled back too (draft_lm.commit)
    prompt = [1, 5, 2, 7]
    law = _exact_law(target, prompt, 3)  # [V, V, V]
    cfg = LoopConfig(k=2, max_new_tokens=3, sampling=SamplingParams(temperature=1.0), eos_ids=[])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(V, V, V)
    proposed = accepted = 0
    runs = 800
    for _ in range(runs):
        out = generate(target, drafter, torch.tensor(prompt), cfg, gen)
        counts[tuple(out.tokens)] += 1
        proposed += sum(r.proposed for r in out.rounds)
        accepted += sum(r.accepted for r in out.rounds)
    assert 0.1 < accepted / proposed < 0.9  # both the accept and the reject paths run
    # token 3 follows a round that may have rejected: its law given tokens 1-2 depends on the rolled-back state
    assert chi_square_pvalue(counts.sum(0).flatten(), law.sum(0).flatten()) > 1e-3  # tokens 2, 3
    assert chi_square_pvalue(counts.flatten(), law.flatten()) > 1e-3
    # power: a target whose state were not rolled back (another seed's law) is rejected by the same counts
    other = _exact_law(_tiny_hybrid(arch, seed=1), prompt, 3)
    assert chi_square_pvalue(counts.sum(0).flatten(), other.sum(0).flatten()) < 1e-6
