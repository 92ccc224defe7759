"""Soft labels are the target's own logits: on Gemma-2 (final logit soft-capping) the offline
cache's replayed labels equal the online forward's, while the bare lm_head (the old replay) does
not; a target whose logit transform draftsmith does not know is refused when the cache is built."""
from __future__ import annotations

import pytest
import torch

from draftsmith import testing
from draftsmith.data import TokenDataset, collate, feature_cache, features
from draftsmith.targets import archs

REQUIRED = {"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"}


@pytest.fixture(scope="module")
def gemma2():
    return testing.arch_target("gemma2")


def _dataset(n=4):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 250, (6 + 3 * i,), generator=g, dtype=torch.int32) for i in range(n)]
    masks = [torch.tensor([0] + [1] * (len(x) - 1), dtype=torch.uint8) for x in ids]
    return TokenDataset(ids, masks, [f"r{i}" for i in range(n)])


def test_gemma2_offline_labels_equal_online(tmp_path, gemma2):
    assert gemma2.config.final_logit_softcapping == 0.5
    layers = [1, 2, 3]
    ds = _dataset()
    feature_cache.build(gemma2, ds, str(tmp_path), layers, "float32", shard_rows=2, required=REQUIRED,
                        batch_size=2, log=lambda *_: None)
    cached = feature_cache.open(str(tmp_path), gemma2, layers, REQUIRED)
    offline = features.complete(gemma2, collate([cached[1], cached[3]], pad_id=0), REQUIRED, layers)
    raw = collate([ds[1], ds[3]], pad_id=0)
    online = features.complete(gemma2, raw, REQUIRED, layers)  # a real forward: the target's own logits
    real = raw["attention_mask"].bool()
    torch.testing.assert_close(offline["target_logits"][real], online["target_logits"][real], atol=1e-5, rtol=1e-5)
    bare = gemma2.lm_head(offline["last_hidden_state"])  # what the cache used to replay
    assert (bare[real] - online["target_logits"][real]).abs().max() > 0.05
    assert online["target_logits"].abs().max() <= 0.5 + 1e-6  # soft-capped


def test_unknown_logit_transform_is_refused_at_cache_build(tmp_path, gemma2, monkeypatch):
    monkeypatch.setattr(archs, "logits_transform", lambda config: (None, None, None))  # forget the soft-cap
    with pytest.raises(ValueError, match="gemma2.*features.mode: online"):
        feature_cache.build(gemma2, _dataset(2), str(tmp_path), [1, 2, 3], "float32", required=REQUIRED,
                            log=lambda *_: None)
