"""Put transformers' prompt lookup beside results that bench_real_target.py ran without it (--no-hf).

Pairs each prompt's speculative tokens/s in the given eval results JSON files with the transformers
prompt-lookup run on the same prompt id from a bench summary that has them (`hf_per_prompt`, written
by a `bench_real_target.py` run with --hf on the same prompts, dtype and max_new_tokens), and prints
the bench's table. The two sides were timed at different times: say so beside the numbers.

    python benchmarks/pair_prompt_lookup.py benchmarks/results/real-target/summary-bfloat16-bf16-regen-hf.json \
        benchmarks/results/real-target/dspark-gemma3-270m-regen-bfloat16-k5-bf16-s5.json ...
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_real_target import summarize, table  # noqa: E402


def check_same_protocol(results: dict, hf_summary: dict, where: Path) -> None:
    cfg = results["config"]
    for key in ("dtype", "max_new_tokens", "prompt_format"):
        if cfg.get(key) != hf_summary.get(key):
            raise SystemExit(f"pair_prompt_lookup: {where}: {key} is {cfg.get(key)!r} but the prompt-lookup runs used "
                             f"{hf_summary.get(key)!r}; pair results of the same protocol")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("hf_summary", type=Path, help="a bench summary-*.json with hf_per_prompt")
    p.add_argument("results", type=Path, nargs="+", help="eval results JSON files (one per kind)")
    p.add_argument("--out", type=Path, default=None, help="also write the paired rows as JSON")
    a = p.parse_args(argv)
    hf_summary = json.loads(a.hf_summary.read_text())
    hf = hf_summary.get("hf_per_prompt")
    if not hf:
        raise SystemExit(f"pair_prompt_lookup: {a.hf_summary} has no hf_per_prompt: run bench_real_target.py with --hf")
    rows = []
    for path in a.results:
        res = json.loads(path.read_text())
        check_same_protocol(res, hf_summary, path)
        row = {"label": res["drafter"]["name"], "k": res["config"]["k"]}
        rows += summarize(row, res, hf)
    print(table(rows, []))
    if a.out:
        a.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "hf_from": str(a.hf_summary),
                                     "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
