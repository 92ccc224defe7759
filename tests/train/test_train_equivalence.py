"""Training equivalences (issue 11, item 20): gradient accumulation in one process equals one
large batch, and a bf16 offline feature cache trains like online features rounded to bf16."""
from __future__ import annotations

import pytest
import torch

from draftsmith import checkpoint, config
from draftsmith.cli import main as cli_main
from draftsmith.train.loop import train


def test_grad_accum_equals_one_large_batch(tiny_run):
    """4 sequences per step as 1 micro-batch of 4 or 2 micro-batches of 2: same global batches, and
    the loss is a sum over tokens divided by the step's token count, so losses and weights agree."""
    big = train(tiny_run("big", "train.max_steps=3", "train.batch_size=4", "train.grad_accum=1"))
    accum = train(tiny_run("accum", "train.max_steps=3", "train.batch_size=2", "train.grad_accum=2"))
    assert accum.losses == pytest.approx(big.losses, rel=1e-5)
    a, b = checkpoint.read_weights(accum.final_checkpoint), checkpoint.read_weights(big.final_checkpoint)
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6, msg=key)
    # and it is not trivially so: a micro-batch of 2 without accumulation trains on other batches
    small = train(tiny_run("small", "train.max_steps=3", "train.batch_size=2", "train.grad_accum=1"))
    assert small.losses != pytest.approx(big.losses, rel=1e-3)


SOFT = "drafter.hard_label_weight=0.0"


def test_bf16_offline_cache_matches_online_bf16_features(tiny_run, tmp_path, monkeypatch):
    """The cache stores hidden states in bf16 and replays the logits from the stored last state:
    training on it equals online training whose features are rounded and replayed the same way (up
    to bf16 rounding flips from the cache's other forward batching), and stays close to fp32 online."""
    # Soft labels: argmax labels of a random-weight tiny target flip under bf16 rounding (near ties).
    cache = tmp_path / "cache"
    cfg = tiny_run("offline", "features.mode=offline", f"features.cache_dir={cache}", "features.dtype=bfloat16",
                   "train.max_steps=3", SOFT)
    recipe = tmp_path / "offline.yaml"
    recipe.write_text(config.to_yaml(cfg))
    assert cli_main(["prepare", str(recipe), "--features"]) == 0
    offline = train(config.load(recipe))
    fp32 = train(tiny_run("online-fp32", "train.max_steps=3", SOFT))

    from draftsmith.data import features

    complete = features.complete

    def rounded(target, batch, required, layers):  # online features, rounded as the cache stores them
        out = complete(target, batch, required, layers)
        out = {k: (v.to(torch.bfloat16).float() if k in features.HIDDEN_FEATURES else v) for k, v in out.items()}
        if "target_logits" in out:  # the cache path replays the logits from the stored (rounded) last state
            out["target_logits"] = features.logits_from_hidden(target, out["last_hidden_state"])
        return out

    monkeypatch.setattr(features, "complete", rounded)
    online_bf16 = train(tiny_run("online-bf16", "train.max_steps=3", SOFT))
    assert offline.losses == pytest.approx(online_bf16.losses, rel=1e-5)
    assert offline.losses == pytest.approx(fp32.losses, rel=2e-2)  # bf16 rounding moves them a little
