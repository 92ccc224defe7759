"""Does this target's forward with a KV cache work for several new tokens at once?

The speculative loop verifies k drafted tokens in ONE cached forward (eval/loop.py). Some
transformers models fail there, or disagree with decoding one token at a time (a DeepSeek-V3
config with fewer KV heads than attention heads raises a shape error inside attention), and
`eval` would crash with a traceback after training. `draftsmith inspect` and `draftsmith train`
run this check up front, once per target load:

  1. build a small random fp32 copy of the target's architecture (config.json only: the same
     attention, heads, KV heads, rope and layer kinds; fewer layers, a small vocabulary, a narrow
     MLP and few experts, none of which change how the cache works), on the CPU;
  2. prefill P tokens on a fresh cache, then feed the next k tokens in ONE forward;
  3. prefill the same P tokens on another fresh cache, then feed the k tokens one at a time;
  4. the logits of 2 and 3 must agree (fp32, relative tolerance); an exception or a disagreement
     is the reason to refuse.
A copy that cannot be built at all is reported as unchecked, never as a refusal. Cost: a few
forwards of a model with a few layers, milliseconds to about a second (docs/trust.md).
"""
from __future__ import annotations

import copy

import torch

PROMPT, K = 4, 3  # prefill length and draft tokens of the probe
TOLERANCE = 1e-3  # max |difference| relative to the largest |logit| (fp32; rounding alone is ~1e-6)
SMALL_VOCAB, SMALL_MLP, FEW_EXPERTS = 512, 64, 4


def small_config(config):
    """A copy of the (text) config with few layers, a small vocabulary, a narrow MLP and few experts."""
    from draftsmith.targets.archs import text_config

    small = copy.deepcopy(text_config(config))
    layers = int(small.num_hidden_layers)
    keep = min(layers, 2)
    kinds = getattr(small, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and kinds:  # one layer of every kind (Gemma-3: 5 sliding, 1 full)
        keep = max(keep, max(list(kinds).index(kind) for kind in set(kinds)) + 1)
    dense = getattr(small, "first_k_dense_replace", None)
    if isinstance(dense, int):  # DeepSeek: dense layers first, then MoE layers
        keep = max(keep, dense + 1)
    keep = min(keep, layers)
    for name, value in list(vars(small).items()):  # per-layer lists (layer_types, no_rope_layers, ...)
        if isinstance(value, list) and len(value) == layers:
            setattr(small, name, value[:keep])
    small.num_hidden_layers = keep
    if isinstance(dense, int):
        small.first_k_dense_replace = min(dense, keep - 1)
    vocab = min(int(small.vocab_size), SMALL_VOCAB)
    small.vocab_size = vocab
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(small, name, None)
        if isinstance(value, int) and value >= vocab:
            setattr(small, name, None)
        elif isinstance(value, list):
            setattr(small, name, [v for v in value if v < vocab] or None)
    for name in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        if isinstance(getattr(small, name, None), int):
            setattr(small, name, min(getattr(small, name), SMALL_MLP))
    for name in ("n_routed_experts", "num_experts", "num_local_experts"):
        if isinstance(getattr(small, name, None), int) and getattr(small, name) > 0:
            setattr(small, name, min(getattr(small, name), FEW_EXPERTS))
    if isinstance(getattr(small, "num_experts_per_tok", None), int):
        small.num_experts_per_tok = min(small.num_experts_per_tok, 2)
    for name in ("n_group", "topk_group"):
        if isinstance(getattr(small, name, None), int):
            setattr(small, name, 1)
    return small


def _logits(model, config, ids: torch.Tensor, one_at_a_time: bool) -> torch.Tensor:
    """Prefill ids[:, :PROMPT] on a fresh cache, then the rest in one forward or one by one -> [rest, V]."""
    from draftsmith.targets.archs import new_cache

    cache = new_cache(config)
    model(input_ids=ids[:, :PROMPT], cache=cache, use_cache=True)
    rest = ids[:, PROMPT:]
    if not one_at_a_time:
        return model(input_ids=rest, cache=cache, use_cache=True).logits[0]  # [1, k] -> [k, V]
    steps = [model(input_ids=rest[:, i:i + 1], cache=cache, use_cache=True).logits[0, -1] for i in range(rest.shape[1])]
    return torch.stack(steps)  # k x [V] -> [k, V]


def check(config, k: int = K) -> tuple[str, str]:
    """("ok" | "failed" | "unchecked", reason). "failed": the loop's k-token verification cannot run
    on this architecture in transformers (the reason says how). The global RNG is left as it was
    (train seeds before it: golden losses must not move)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        return _check(config, k)


def _check(config, k: int) -> tuple[str, str]:
    from transformers import AutoModelForCausalLM

    try:
        small = small_config(config)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(small, dtype=torch.float32).eval()
    except Exception as exc:  # a config this shrinking cannot build: say so, refuse nothing
        return "unchecked", f"a small copy of the architecture could not be built ({type(exc).__name__}: {_first(exc)})"
    ids = torch.randint(0, small.vocab_size, (1, PROMPT + k), generator=torch.Generator().manual_seed(0))
    try:
        single = _logits(model, small, ids, one_at_a_time=True)
    except Exception as exc:  # a probe of transformers' code: any failure is the finding
        return "failed", f"a cached one-token forward fails in transformers ({type(exc).__name__}: {_first(exc)})"
    try:
        block = _logits(model, small, ids, one_at_a_time=False)
    except Exception as exc:
        return "failed", (f"a cached {k}-token forward (the speculative loop's verification) fails in transformers "
                          f"({type(exc).__name__}: {_first(exc)})")
    scale = float(single.abs().max()) or 1.0
    diff = float((block - single).abs().max())
    if not diff <= TOLERANCE * scale:
        return "failed", (f"a cached {k}-token forward disagrees with {k} one-token forwards (max |difference| {diff:.3g} "
                          f"against logits up to {scale:.3g}, fp32): the cache is wrong for multi-token verification")
    return "ok", f"cached {k}-token forward equals {k} one-token forwards (max |difference| {diff:.1e}, fp32)"


def _first(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return text[:200]
