"""Features from hybrid targets (issue 42): hidden_states[i], the aux feature an EAGLE-3 or block drafter
reads, is the residual stream entering decoder layer i on every layer type of every hybrid architecture
(gated delta-net, Mamba-2, short conv, MLP-only, attention), so every id in 0..L-1 is valid; `draftsmith
inspect` states the valid ids and each layer type's cache and rollback."""
from __future__ import annotations

import pytest
import torch

from draftsmith import testing
from draftsmith.targets import archs, state_cache

HYBRIDS = [name for name, (_, make) in archs.TINY.items() if state_cache.has_state_layers(make())]


def _decoder_layers(model):
    return model.model.layers


@pytest.mark.parametrize("arch", HYBRIDS)
def test_every_layer_id_is_the_input_of_that_layer(arch):
    torch.set_num_threads(1)
    target = testing.arch_target(arch)
    seen = {}

    def hook(i):
        def capture(module, args, kwargs):
            seen[i] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return capture

    handles = [layer.register_forward_pre_hook(hook(i), with_kwargs=True)
               for i, layer in enumerate(_decoder_layers(target.model))]
    ids = torch.randint(3, target.vocab_size, (1, 7), generator=torch.Generator().manual_seed(0))
    out = target.forward(ids)
    for h in handles:
        h.remove()
    valid, why = archs.valid_aux_layer_ids(target.config)
    assert valid == list(range(target.num_layers)) and len(out.hidden_states) == target.num_layers + 1
    assert sorted(seen) == valid
    for i in valid:
        assert torch.equal(out.hidden_states[i], seen[i]), (arch, i)
    assert "residual stream" in why
    assert archs.default_aux_layer_ids(target.num_layers) == [1, 2, 3]  # 4 layers: distinct, >= 1


def test_inspect_states_each_layer_types_cache_and_rollback(tmp_path):
    from draftsmith.commands import inspect

    target = testing.arch_target("nemotron-h")
    target.model.save_pretrained(str(tmp_path))
    target.tokenizer.save_pretrained(str(tmp_path))
    rep = inspect.report(str(tmp_path))
    text = inspect.format_text(rep)
    rows = {r["layer_type"]: r for r in rep["layer_caches"]}
    assert rows["linear_attention"]["layers"] == [0, 2] and "recurrent state" in rows["linear_attention"]["cache"]
    assert rows["full_attention"]["rollback"] == "crop the rejected tokens"
    assert rows["dummy"]["rollback"] == "nothing to roll back"
    assert "per-position states kept" in rows["linear_attention"]["rollback"]
    assert "linear_attention (layers [0, 2]): conv window + recurrent state" in text
    assert "valid: 0..3: hidden_states[i] is the residual stream" in text
    assert rep["cached_forward"]["status"] == "ok", rep["cached_forward"]
