"""The vLLM (speculators) export loads with speculators' own loader on CPU and computes what
draftsmith's drafter computes. Needs `bash scripts/install_speculators.sh`; skips without it
unless DRAFTSMITH_REQUIRE_SPECULATORS=1."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.export import export
from draftsmith.heads.draft_layer import KVCache


def speculators():
    try:
        import speculators as module
    except ImportError as exc:
        reason = f"speculators is not importable ({exc}); run `bash scripts/install_speculators.sh`"
        if os.environ.get("DRAFTSMITH_REQUIRE_SPECULATORS") == "1":
            pytest.fail(reason + " (DRAFTSMITH_REQUIRE_SPECULATORS=1 requires it)")
        pytest.skip(reason)
    return module


def test_speculators_loads_vllm_export(eagle3_ckpt, eagle3_loaded, tmp_path):
    spec = speculators()
    out = export(eagle3_ckpt, "vllm", tmp_path / "vllm", loaded=eagle3_loaded).out_dir
    config = spec.SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "sdpa"  # flex attention has no CPU path here
    model = spec.SpeculatorModel.from_pretrained(str(out), config=config).eval()
    # 1. the loader is lenient: diff the key sets ourselves
    saved = set(load_file(str(out / "model.safetensors")))
    own = {k for k in model.state_dict() if not k.startswith("verifier_")}
    assert saved == own, f"speculators expects {sorted(own - saved)} more / {sorted(saved - own)} fewer"
    # 2. a forward of the reloaded model equals draftsmith's drafter numerically
    d, target = eagle3_loaded.drafter, eagle3_loaded.target
    ids = torch.randint(3, target.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    out_t = target.forward(ids)
    aux = torch.cat([out_t.hidden_states[i] for i in d.aux_layer_ids], dim=-1)  # [1, s, 3h]
    positions = torch.arange(9).view(1, -1)
    with torch.no_grad():
        hidden = d.fc(aux[:, :9])
        ours = d.logits(d.step(ids[:, 1:], hidden, positions, cache=KVCache()))  # [1, 9, dv]
        h2 = model.fc(aux[:, :9])
        x = torch.cat([model.embed_tokens(ids[:, 1:]), h2], dim=-1)  # [1, 9, 2h]
        pe = model.rotary_emb(x, positions)
        y = model.layers[0](x, attention_mask=None, position_ids=positions, position_embeddings=pe)
        y = y[0] if isinstance(y, tuple) else y
        theirs = model.lm_head(model.norm(y))
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4), (ours - theirs).abs().max()
    assert torch.equal(model.d2t, d.d2t) and torch.equal(model.t2d, d.t2d)
