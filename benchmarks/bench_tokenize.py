"""Tokenization throughput: today's in-process path (data.num_proc: 0) against the datasets
path (Dataset.map, data.num_proc 1 and 2) and its second, cached run, on a synthetic ShareGPT
corpus (default 200k rows), with the embedded pycode-tiny tokenizer (BPE, vocab 1024) and a chat
template (so rendering and the prefix-stability check run as in real recipes).

    PYTHONPATH=$PWD python benchmarks/bench_tokenize.py                 # 200k rows
    PYTHONPATH=$PWD python benchmarks/bench_tokenize.py --rows 20000    # a quicker look

Each path runs once, in a fresh datasets cache (so the datasets runs really tokenize), except
"num_proc 2, second run", which reruns num_proc 2 on the same cache. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("the", "a", "model", "token", "draft", "verify", "accept", "speculative", "decoding", "python", "list",
         "function", "returns", "value", "error", "cache", "layer", "hidden", "state", "train", "loss")


def corpus(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(rows):
            turns = []
            for _ in range(rng.randint(1, 2)):
                turns.append({"from": "human", "value": " ".join(rng.choices(WORDS, k=rng.randint(5, 30))) + "?"})
                turns.append({"from": "gpt", "value": " ".join(rng.choices(WORDS, k=rng.randint(20, 80))) + "."})
            f.write(json.dumps({"id": f"r{i}", "conversations": turns}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from draftsmith.config import DataConfig
    from draftsmith.data import build_dataset
    from draftsmith.targets.load import resolve_path
    from draftsmith.testing import TINY_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(resolve_path("builtin:pycode-tiny"))
    tok.chat_template = TINY_CHAT_TEMPLATE
    work = Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    data = work / "sharegpt.jsonl"
    corpus(data, args.rows)
    results = []

    def run(label: str, num_proc: int, cache: str) -> None:
        os.environ["HF_DATASETS_CACHE"] = cache
        start = time.perf_counter()
        train, _, report = build_dataset(DataConfig(path=[str(data)], max_length=512, num_proc=num_proc), tok)
        seconds = time.perf_counter() - start
        results.append((label, seconds, report.read / seconds, report.tokens / seconds, report.tokenized_from_cache))
        print(f"{label}: {seconds:.1f} s, rows read {report.read}, used {report.used}, tokens {report.tokens}",
              file=sys.stderr, flush=True)

    run("in-process (num_proc 0, today's path)", 0, str(work / "c0"))
    run("datasets, num_proc 1", 1, str(work / "c1"))
    run("datasets, num_proc 2", 2, str(work / "c2"))
    run("datasets, num_proc 2, second run (cached)", 2, str(work / "c2"))
    print(f"\n{args.rows:,} rows; `nproc` = {os.cpu_count()}; load average before: {os.getloadavg()[0]:.1f}\n")
    print("| path | seconds | rows/s | tokens/s | from cache |")
    print("|---|---|---|---|---|")
    for label, seconds, rows_s, tokens_s, cached in results:
        print(f"| {label} | {seconds:.1f} | {rows_s:,.0f} | {tokens_s:,.0f} | {'-' if cached is None else cached} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
