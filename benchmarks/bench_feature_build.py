"""Feature-cache build on 1 and on N builder processes (issue 43 item 5): bytes per token and build
throughput of `draftsmith prepare --features` on a real target, draftsmith's cache and vLLM's format.

    PYTHONPATH=$PWD python benchmarks/bench_feature_build.py [--target ../shared/models/stories260K-hf]
        [--data ../shared/data/chat_corpus/lima.json] [--rows 400] [--ranks 1 2] [--out results.json]

Each configuration runs in a fresh output directory: `prepare --features --nproc R` with OMP_NUM_THREADS =
cores / R (so 1 rank and 2 ranks use the same cores). The wall clock covers the whole command (target
load and tokenisation in every rank included), as a user sees it. State `lscpu` flags and the machine's
load beside the numbers: on a shared machine a timing moves with the neighbours.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def run(recipe: Path, cache: Path, ranks: int, fmt: str, cores: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // ranks))}
    key = "features.dir" if fmt == "vllm" else "features.cache_dir"
    argv = [sys.executable, "-m", "draftsmith", "prepare", str(recipe), f"{key}={cache}", "--features",
            "--format", fmt, "--nproc", str(ranks)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} -> {proc.returncode}\n{proc.stderr[-3000:]}")
    files = [p for p in cache.iterdir() if p.suffix == ".safetensors"]
    size = sum(p.stat().st_size for p in files)
    return {"ranks": ranks, "format": fmt, "wall_s": round(wall, 2), "bytes": size, "files": len(files)}


def random_target(source: Path, dest: Path, hidden: int, layers: int) -> Path:
    """A random Llama (seed 0) with `source`'s tokenizer and vocabulary, saved to dest."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    base = AutoConfig.from_pretrained(source)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=base.vocab_size, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 64), max_position_embeddings=2048,
                      bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id)
    LlamaForCausalLM(cfg).eval().save_pretrained(dest)
    AutoTokenizer.from_pretrained(source).save_pretrained(dest)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="../shared/models/stories260K-hf")
    ap.add_argument("--data", default="../shared/data/chat_corpus/lima.json")
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--shard-rows", type=int, default=25)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--formats", nargs="+", default=["draftsmith"])
    ap.add_argument("--random-target", default=None, metavar="HIDDEN,LAYERS",
                    help="instead of --target's weights: a random Llama of this shape with --target's tokenizer "
                         "(a forward heavy enough that the build is not all process start-up)")
    ap.add_argument("--repeats", type=int, default=1, help="run the configurations this many times, interleaved")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        recipe = tmp / "r.yaml"
        installed = args.target.startswith("installed:")  # a registry-installed target (scripts/install_*.sh)
        target_path = args.target if installed else Path(args.target).resolve()
        if args.random_target:
            if installed:
                raise SystemExit("--random-target takes its tokenizer from a Hugging Face folder, not an installed: target")
            target_path = random_target(target_path, tmp / "random-target", *map(int, args.random_target.split(",")))
        recipe.write_text(yaml.safe_dump({
            "target": {"path": str(target_path), "device": "cpu"},
            "data": {"path": [str(Path(args.data).resolve())], "max_length": args.max_length,
                     "max_samples": args.rows},
            "features": {"shard_rows": args.shard_rows, "dtype": "bfloat16"}, "drafter": {"kind": "eagle3"}}))
        from draftsmith import config
        from draftsmith.data import dataset as ds
        from draftsmith.targets import load as target_mod

        cfg = config.load(str(recipe))
        tok = target_mod.from_config(cfg.target).tokenizer
        train, heldout, _ = ds.build_dataset(ds.training_data_config(cfg), tok)
        tokens = train.num_tokens + heldout.num_tokens
        results = []
        for rep, fmt, ranks in [(i, f, r) for i in range(args.repeats) for f in args.formats for r in args.ranks]:
            load = os.getloadavg()[0]
            r = run(recipe, tmp / f"{fmt}-{ranks}-{rep}", ranks, fmt, cores)
            r.update(repeat=rep, load_avg_1min_before=round(load, 1), tokens=tokens, rows=len(train) + len(heldout),
                     bytes_per_token=round(r["bytes"] / tokens, 1), tokens_per_s=round(tokens / r["wall_s"], 1))
            results.append(r)
            print(json.dumps(r), flush=True)
    base = {(r["format"], r["repeat"]): r["wall_s"] for r in results if r["ranks"] == 1}
    for r in results:
        if (r["format"], r["repeat"]) in base and r["ranks"] > 1:
            print(f"{r['format']} (repeat {r['repeat']}): {r['ranks']} ranks take "
                  f"{r['wall_s'] / base[(r['format'], r['repeat'])]:.2f}x the wall time of 1")
    if args.out:
        Path(args.out).write_text(json.dumps({"cores": cores, "load_avg": os.getloadavg(), "results": results},
                                             indent=2))


if __name__ == "__main__":
    main()
