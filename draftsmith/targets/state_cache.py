"""The speculative loop's cache for hybrid targets: layers whose past is a fixed-size state
(a recurrent / SSM state and a short convolution window), not keys and values per token.

A KV cache is rolled back after a rejection by cropping its last tokens. A recurrent or
convolutional state cannot be cropped: it has folded every verified token in. Two ways restore it
to the accepted prefix (issue 42; benchmarks/bench_hybrid_rollback.py measures both):

  - "keep"   (the default) keep the state at each verified position. transformers 5 does it when a
             layer records its past (`activate_past_recording(recurrent_states_to_keep=q)`): the last
             q tokens of every forward run through the layer's one-token recurrence and each state
             is kept; a conv layer keeps its whole input window until the next crop. Rolling back
             r tokens is then `crop(-r)`: the conv window is sliced and the recurrent state is the
             kept one r tokens back. Nothing is recomputed.
  - "replay" snapshot every state before the verification forward (one copy per layer); after a
             rejection restore the snapshot, crop the attention layers' keys to the same prefix and
             run the accepted tokens through the target again (a second forward of a + 1 tokens).

Layer kinds (transformers 5 cache layer classes, by the config's layer type):
  full_attention / sliding_attention / chunked_attention -> keys and values per token: crop;
  linear_attention (gated delta-net: Qwen3.5, Qwen3-Next, Kimi-Linear; Mamba-2: Nemotron-H,
  Granite-4 hybrid) -> conv window + recurrent state; conv (LFM2) -> conv window only;
  hybrid (Falcon-H1: Mamba-2 and attention side by side in every layer) -> both;
  mlp / moe (Nemotron-H's MLP-only layers) -> nothing to roll back.

Trees and batches are refused on hybrid targets (`loop_refusal`): a tree's branches would need one
recurrent state per branch, and a batch's ragged acceptance one kept-state index per row; neither is
implemented.
"""
from __future__ import annotations

ROLLBACK_MODES = ("keep", "replay")
STATE_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "hybrid_sliding")  # layers with a conv / recurrent state

# layer type (config.layer_types, as transformers' cache reads it) -> (what the cache holds, how the loop rolls it back)
LAYER_CACHES = {
    "full_attention": ("keys/values per token", "crop the rejected tokens"),
    "sliding_attention": ("keys/values of the window (past recorded until each crop)", "crop the rejected tokens"),
    "chunked_attention": ("keys/values of the chunk (past recorded until each crop)", "crop the rejected tokens"),
    "linear_attention": ("conv window + recurrent state", None),
    "conv": ("conv window", None),
    "hybrid": ("keys/values per token + conv window + recurrent state", None),
    "hybrid_sliding": ("windowed keys/values + conv window + recurrent state", None),
    "dummy": ("nothing (no attention, no state)", "nothing to roll back"),
}
STATE_ROLLBACK = {"keep": "per-position states kept during verification; the accepted one restored (no recompute)",
                  "replay": "snapshot before verification restored, accepted tokens run again"}


def cache_layer_types(config) -> list[str]:
    """The cache layer type of every decoder layer, as transformers' DynamicCache builds them."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    return get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0]


def has_state_layers(config) -> bool:
    """True when some layer keeps a recurrent or convolutional state (a hybrid target)."""
    return any(t in STATE_LAYER_TYPES for t in cache_layer_types(config))


def first_attention_layer(config) -> int | None:
    """The first layer with keys and values (attention, or Falcon-H1's attention-and-Mamba layer); None if none."""
    types = cache_layer_types(config)
    return next((i for i, t in enumerate(types) if t not in STATE_LAYER_TYPES[:2] and t != "dummy"), None)


def describe(config, mode: str = "keep") -> list[dict]:
    """One row per distinct layer type: its layer ids, what its cache holds and how it is rolled back."""
    types = cache_layer_types(config)
    rows = []
    for kind in dict.fromkeys(types):
        holds, how = LAYER_CACHES.get(kind, (f"unknown cache layer type {kind!r}", "unknown"))
        if how is None:
            how = STATE_ROLLBACK[mode] + ("" if kind == "conv" else "; keys/values cropped" if "hybrid" in kind else "")
            if kind == "conv" and mode == "keep":
                how = "conv window kept whole until the crop, then sliced to the accepted prefix (no recompute)"
        rows.append({"layer_type": kind, "layers": [i for i, t in enumerate(types) if t == kind],
                     "cache": holds, "rollback": how})
    return rows


def loop_refusal(config, what: str) -> str | None:
    """One line when `what` ("tree drafting" | "batched decoding") cannot run on this target."""
    if not has_state_layers(config):
        return None
    kinds = sorted({t for t in cache_layer_types(config) if t in STATE_LAYER_TYPES})
    return (f"{what} is not supported on hybrid targets ({config.get_text_config(decoder=True).model_type}: "
            f"{'/'.join(kinds)} layers keep one state, not one per branch or per ragged row); use chain drafting "
            "with --batch-size 1")


def _state_layers(cache):
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return [layer for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]


def activate(cache, keep_states: int, mode: str = "keep") -> None:
    """Prepare a fresh DynamicCache for rollback. Attention layers record their past (sliding windows);
    state layers record their past in "keep" mode with `keep_states` kept per forward (the longest
    verification: k + 1), and not at all in "replay" mode (their snapshot is taken per round)."""
    if mode not in ROLLBACK_MODES:
        raise ValueError(f"state rollback mode {mode!r} is not one of {ROLLBACK_MODES}")
    states = set(map(id, _state_layers(cache)))
    for layer in cache.layers:
        if not hasattr(layer, "activate_past_recording"):
            continue
        if id(layer) not in states:
            layer.activate_past_recording()
        elif mode == "keep":
            layer.activate_past_recording(recurrent_states_to_keep=keep_states)
            # transformers builds the per-state histories with dict.fromkeys(range(n), []): one shared list
            layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}


def snapshot(cache) -> list:
    """Copies of every state layer's conv / recurrent states and token count ("replay" mode)."""
    snap = []
    for layer in _state_layers(cache):
        conv = {i: None if s is None else s.clone() for i, s in layer.conv_states.items()}
        rec = {i: None if s is None else s.clone() for i, s in layer.recurrent_states.items()}
        snap.append((layer, conv, rec, dict(layer.has_previous_state), layer.cumulative_length_linear.clone()))
    return snap


def restore(cache, snap: list, tokens_to_remove: int) -> None:
    """Put the snapshot back and crop the attention keys/values by `tokens_to_remove` ("replay" mode)."""
    from transformers.cache_utils import DynamicLayer

    restored = set()
    for layer, conv, rec, previous, length in snap:
        for i in conv:
            if conv[i] is not None:
                layer.conv_states[i].copy_(conv[i])
            if rec[i] is not None:
                layer.recurrent_states[i].copy_(rec[i])
        layer.has_previous_state = dict(previous)
        layer.cumulative_length_linear.copy_(length)
        if isinstance(layer, DynamicLayer) and tokens_to_remove:  # Falcon-H1: the attention half of the layer
            DynamicLayer.crop(layer, -tokens_to_remove)
        restored.add(id(layer))
    for layer in cache.layers:
        if id(layer) not in restored and tokens_to_remove:
            layer.crop(-tokens_to_remove)


def trim(cache) -> None:
    """Drop what a "keep"-mode cache recorded beyond the current position (crop(0)): the conv windows
    shrink to the kernel and the kept states are released; attention layers are unchanged."""
    for layer in _state_layers(cache):
        if getattr(layer, "record_past", False) and all(layer.is_conv_states_initialized.values()):
            layer.crop(0)


def seq_length(cache) -> int:
    """Tokens the cache holds (the token count of its first layer that counts them)."""
    for layer in cache.layers:
        n = layer.get_seq_length() if hasattr(layer, "get_seq_length") else None
        if n is not None and (not isinstance(n, int) or n >= 0):
            return int(n)
    return 0
