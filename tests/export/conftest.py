"""Tiny trained drafters saved as real draftsmith checkpoints, for the export tests.

load_drafter reloads the target from the recipe's target.path, so each tiny target is saved to
a directory first and the drafter is built against the reloaded copy (same fingerprint).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from draftsmith import checkpoint
from draftsmith import config as config_mod
from draftsmith.heads import DRAFTERS
from draftsmith.targets import load as target_mod
from draftsmith.testing import byte_tokenizer

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 512}


def save_tiny_target(directory: Path, rope: dict | None = None, max_positions: int = 1024, seed: int = 0) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    kwargs = {"rope_parameters": dict(rope)} if rope else {}
    cfg = LlamaConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, **kwargs)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(directory))
    byte_tokenizer().save_pretrained(str(directory))
    return str(directory)


def make_checkpoint(root: Path, kind: str, options: dict, rope: dict | None = None, max_positions: int = 1024) -> Path:
    """Build, perturb (a stand-in for training) and save a drafter; returns the checkpoint dir."""
    target_dir = save_tiny_target(root / "target", rope, max_positions)
    recipe = config_mod.from_dict({"target": {"path": target_dir, "device": "cpu"},
                                   "drafter": {"kind": kind, **options}})
    target = target_mod.from_config(recipe.target)
    torch.manual_seed(1)
    counts = torch.randint(0, 50, (target.vocab_size,))
    drafter = DRAFTERS.get(kind).from_target(recipe.drafter.options, target, counts)
    with torch.no_grad():
        for p in drafter.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return checkpoint.save(root / "final", drafter, target, recipe, step=10)


@pytest.fixture(scope="session")
def eagle3_ckpt(tmp_path_factory) -> Path:
    """EAGLE-3 with a reduced draft vocabulary (100 of 259), llama3 rope scaling, 4096 positions."""
    return make_checkpoint(tmp_path_factory.mktemp("eagle3"), "eagle3", {"draft_vocab_size": 100, "ttt_steps": 3},
                           rope=LLAMA3_ROPE, max_positions=4096)


@pytest.fixture(scope="session")
def eagle3_loaded(eagle3_ckpt):
    return checkpoint.load_drafter(eagle3_ckpt, device="cpu")


@pytest.fixture(scope="module")
def tools():
    """llama.cpp's tools (scripts/install_llama_cpp.sh) for the llama-server round trips: skipped without them,
    failed instead under DRAFTSMITH_REQUIRE_LLAMA_CPP=1 (set by .ci/run after the build succeeded)."""
    from draftsmith.export.llamacpp.tools import LlamaCppMissing, find_llama_cpp

    try:
        return find_llama_cpp()
    except LlamaCppMissing as exc:
        if os.environ.get("DRAFTSMITH_REQUIRE_LLAMA_CPP") == "1":
            pytest.fail(f"{exc} (DRAFTSMITH_REQUIRE_LLAMA_CPP=1 requires it)")
        pytest.skip(f"llama.cpp is not installed: {exc}")


@pytest.fixture(scope="module")
def ckpts(request, tmp_path_factory):
    """The test module's CHECKPOINTS ({name: (kind, options)} or (kind, options, make_checkpoint keywords)), each
    trained once per module: name -> (checkpoint path, loaded drafter)."""
    from draftsmith import checkpoint

    out = {}
    for name, (kind, options, *keywords) in request.module.CHECKPOINTS.items():
        path = make_checkpoint(tmp_path_factory.mktemp(str(name)), kind, options, **(keywords[0] if keywords else {}))
        out[name] = (path, checkpoint.load_drafter(path, device="cpu"))
    return out
