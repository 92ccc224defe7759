"""The valid inputs the harness damages: built once per session into one directory (the "world"),
copied into a fresh sandbox for every generated case. Every path inside is relative to the
world's root, and every command runs with the sandbox as its working directory, so a copy is a
complete, independent set of inputs.

    target/              a tiny seeded Llama (4 layers, hidden 32, 259 byte tokens) + tokenizer
    data/chat.jsonl      24 ShareGPT conversations
    data/prompts.jsonl   2 eval prompts
    recipe.yaml          EAGLE-3, 2 training steps, output_dir runs/base
    runs/base/final/     the checkpoint `draftsmith train recipe.yaml` wrote (drafter.json,
                         drafter.safetensors, config.yaml, trainer_state.pt)
    results/base.json    what `draftsmith eval runs/base/final` wrote
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml

from tests.robustness import sandbox

RECIPE = {
    "target": {"path": "target", "device": "cpu"},
    "data": {"path": ["data/chat.jsonl"], "max_length": 96},
    "drafter": {"kind": "eagle3", "ttt_steps": 2, "draft_vocab_size": 64},
    "train": {"output_dir": "runs/base", "max_steps": 2, "batch_size": 2, "lr": 3e-3, "warmup_steps": 1,
              "log_every": 1},
    "logging": {"progress_bar": False},
}
CHECKPOINT = "runs/base/final"
CACHE = "cache"  # the offline feature cache of RECIPE (3 shards of 8 rows)
VLLM_DIR = "vllm"  # the same rows as vLLM hidden-states files (prepare --format vllm)
RESULT = "results/base.json"
PROMPTS = "data/prompts.jsonl"
# eval flags that keep one case well under a second on a CPU core
EVAL_FAST = ["--workloads", f"jsonl:{PROMPTS}", "--k", "2", "--max-new-tokens", "4", "--warmup", "0",
             "--num-prompts", "1", "--device", "cpu"]


def _save_target(directory: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.testing import TINY_CHAT_TEMPLATE, byte_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(directory))
    byte_tokenizer(TINY_CHAT_TEMPLATE).save_pretrained(str(directory))


def _run_or_fail(root: Path, argv: list[str], outputs: list[str]) -> None:
    case = sandbox.Case(argv=argv, names=[], outputs=outputs, seconds=300)
    before = sandbox.snapshot(root)
    outcome = sandbox.run(case, root)
    found = sandbox.violations(case, outcome, before, sandbox.snapshot(root))
    if outcome.code != 0 or found:
        raise RuntimeError(f"building the harness's world: draftsmith {' '.join(argv)} -> {outcome.code}, {found}\n"
                           f"{outcome.stdout[-2000:]}\n{outcome.stderr[-4000:]}")


def build(root: Path) -> Path:
    """Write the world into root (an empty directory) through the real commands; returns root."""
    _save_target(root / "target")
    rows = [{"conversations": [{"from": "human", "value": f"question {i} about {'abc' * (i % 5)}"},
                               {"from": "gpt", "value": f"answer number {i}: " + "xyz " * (3 + i % 7)}]}
            for i in range(24)]
    (root / "data").mkdir()
    (root / "data" / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / PROMPTS).write_text('{"id": "a", "prompt": "hello there"}\n{"id": "b", "prompt": "abc abc"}\n')
    (root / "recipe.yaml").write_text(yaml.safe_dump(RECIPE, sort_keys=False))
    _run_or_fail(root, ["train", "recipe.yaml"], ["runs/base"])
    _run_or_fail(root, ["prepare", "recipe.yaml", f"features.cache_dir={CACHE}", "features.shard_rows=8", "--features"],
                 [CACHE])
    _run_or_fail(root, ["prepare", "recipe.yaml", f"features.dir={VLLM_DIR}", "--features", "--format", "vllm"],
                 [VLLM_DIR])
    (root / "results").mkdir()
    _run_or_fail(root, ["eval", CHECKPOINT, *EVAL_FAST, "--out", RESULT], [RESULT])
    shutil.rmtree(root / "tmp", ignore_errors=True)
    return root


def copy(world: Path, dest: Path) -> Path:
    """A fresh sandbox holding a copy of the world (symlinks kept as links)."""
    shutil.copytree(world, dest, symlinks=True)
    return dest
