"""FSDP2 meta-device target loading (train.target_sharding=fsdp2): on 2 CPU ranks each rank's peak
memory for loading is well under the whole model's, it computes the same logits as the replicated
target, and its fingerprint equals Target.fingerprint of the fully loaded model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def big_target_dir(tmp_path_factory):
    """8 layers, hidden 512: 33.6M decoder parameters (134 MB fp32) against a 0.26M embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.testing import byte_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8, vocab_size=259, max_position_embeddings=256, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("big") / "target"
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path, sum(p.numel() * 4 for p in model.model.layers.parameters())


def run(target_dir: Path, out: Path, mode: str, nproc: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(HERE / "meta_load_worker.py"), str(target_dir), str(out), mode]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{mode} x{nproc} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.slow
def test_fsdp2_meta_load_peak_memory_falls_with_world_size(big_target_dir, tmp_path):
    from draftsmith.targets import load as target_mod

    path, layer_bytes = big_target_dir
    replicated = run(path, tmp_path / "r.json", "replicate", 1)
    one = run(path, tmp_path / "s1.json", "fsdp2", 1)
    two = run(path, tmp_path / "s2.json", "fsdp2", 2)
    reference = target_mod.load(str(path), "float32", "cpu")
    assert one["fingerprint"] == two["fingerprint"] == reference.fingerprint
    with torch.no_grad():
        want = reference.forward(torch.arange(3, 19).view(1, -1)).logits[0, :4, :8].flatten()
    for result in (replicated, one, two):
        torch.testing.assert_close(torch.tensor(result["logits"]), want, rtol=1e-5, atol=1e-5)
    print("peak RSS rise per rank (bytes):", {"replicate x1": replicated["peaks"], "fsdp2 x1": one["peaks"],
                                              "fsdp2 x2": two["peaks"], "decoder layers": layer_bytes})
    assert replicated["peaks"][0] > 0.9 * layer_bytes  # the whole model is resident on its rank
    assert max(two["peaks"]) < 0.7 * one["peaks"][0]  # each of 2 ranks holds about half
    assert max(two["peaks"]) < 0.7 * layer_bytes
