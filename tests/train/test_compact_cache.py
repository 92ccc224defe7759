"""Compact feature caches (int8 / fp8 with a scale per token and layer): close to the fp32
features, about half of bf16's bytes, the size predicted by `prepare --dry-run`, and trainable."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftsmith import config
from draftsmith.cli import main as cli_main
from draftsmith.commands.prepare import predict_cache
from draftsmith.data import feature_cache
from draftsmith.train.loop import train


@pytest.mark.parametrize("dtype,tol", [("int8", 0.5 / 127), ("fp8", 2.0**-4)])
def test_quantize_roundtrip_error_is_bounded(dtype, tol):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3 * 16, generator=g) * torch.tensor([0.1, 5.0, 80.0]).repeat_interleave(16)  # layers differ
    q, scale = feature_cache.quantize(x, feature_cache.DTYPES[dtype], 16)
    assert q.dtype == feature_cache.DTYPES[dtype] and scale.shape == (7, 3)
    back = feature_cache.dequantize(q, scale, torch.float32)
    absmax = x.reshape(7, 3, 16).abs().amax(-1, keepdim=True).expand(7, 3, 16).reshape(7, 48)
    assert ((back - x).abs() <= tol * absmax + 1e-6).all()  # per token and layer, relative to that block's max


def cache_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("shard_*.safetensors"))


def test_compact_caches_size_prediction_and_training(tiny_run, tmp_path):
    sizes, losses = {}, {}
    for dtype in ("bfloat16", "int8", "fp8"):
        cache = tmp_path / f"cache-{dtype}"
        cfg = tiny_run(dtype, "features.mode=offline", f"features.cache_dir={cache}", f"features.dtype={dtype}",
                       "train.max_steps=2", "drafter.hard_label_weight=0.0")  # soft labels: a random tiny target's
        # argmax flips under quantisation (near ties), which would hide the cache's fidelity
        recipe = tmp_path / f"{dtype}.yaml"
        recipe.write_text(config.to_yaml(cfg))
        predicted = predict_cache(cfg, log=lambda *_: None)
        assert cli_main(["prepare", str(recipe), "--dry-run"]) == 0 and not cache.exists()  # builds nothing
        assert cli_main(["prepare", str(recipe), "--features"]) == 0
        sizes[dtype] = cache_bytes(cache)
        want = predicted["bytes"][dtype]["total"]
        assert abs(sizes[dtype] - want) / sizes[dtype] < 0.10, (dtype, sizes[dtype], want)
        if dtype != "fp8":  # (fp8's reading path is int8's; its error bound is tested above)
            losses[dtype] = train(config.load(recipe)).losses
    assert sizes["int8"] < 0.62 * sizes["bfloat16"] and sizes["fp8"] < 0.62 * sizes["bfloat16"]
    assert losses["int8"] == pytest.approx(losses["bfloat16"], rel=0.05)  # same init: compact features train alike
