"""Build the prompt file that `draftsmith prepare` regenerates with the target (recipes/cpu/eagle3-gemma3-270m-regen.yaml).

Prompts: first user turns from the shared corpora (../shared/data): HumanEval, GSM8K test, MT-bench and
the Vicuna bench, Alpaca, Spec-Bench, LIMA and the DPO demo conversations. Rows of the SAME benchmark
files as the evaluation workloads are used, except the evaluation prompts themselves: the first
--holdout prompts of every workload (humaneval, gsm8k, mt_bench, alpaca and each spec_bench task, as
`workloads.load` picks them) are dropped by text wherever they occur (draftsmith/eval/heldout.py).
pretrain_text is not used (documents, no turn to answer). Rows are written shortest first so that a
regeneration batch pads little. Output: JSONL {"id", "source", "messages": [{"role": "user", ...}]}.

    python scripts/build_regen_prompts.py --out data/gemma3-regen-prompts.jsonl
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from draftsmith.eval import heldout, workloads  # noqa: E402

EVAL_WORKLOADS = ("humaneval", "gsm8k", "mt_bench", "alpaca", "spec_bench")
# source -> how many rows to take at most (after hold-out), in file order
DEFAULT_CAPS = {"humaneval": 144, "gsm8k": 220, "mt_bench": 60, "vicuna_bench": 80, "alpaca": 260,
                "spec_bench": 200, "lima": 150, "dpo": 60}


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _workload(name: str, data_dir: Path) -> list[list[dict]]:
    """Every prompt of an eval workload (group names expanded), in file order, as eval reads its text."""
    items = [item for concrete in workloads.expand([name]) for item in workloads.load(concrete, data_dir, None)]
    if name == "spec_bench":  # expand() groups the rows by task; keep the file's question order
        items.sort(key=lambda item: int(item["id"].rsplit("-", 1)[1]))
    return [_user(item["prompt"]) for item in items]


def candidates(data_dir: Path) -> dict[str, list[dict]]:
    """source -> rows {"source", "messages"} in file order (first user turn only)."""
    d = data_dir
    lima = json.loads((d / "chat_corpus" / "lima.json").read_text(encoding="utf-8"))
    dpo = json.loads((d / "chat_corpus" / "dpo_en_demo.json").read_text(encoding="utf-8"))
    return {
        "humaneval": _workload("humaneval", d),
        "gsm8k": _workload("gsm8k", d),
        "mt_bench": _workload("mt_bench", d),
        "vicuna_bench": [_user(r["turns"][0]) for r in _jsonl(d / "mt_bench" / "vicuna_bench_question.jsonl")],
        "alpaca": _workload("alpaca", d),
        "spec_bench": _workload("spec_bench", d),
        "lima": [_user(r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")) for r in lima],
        "dpo": [_user(next(t["value"] for t in r["conversations"] if t["from"] == "human")) for r in dpo],
    }


def build(data_dir: Path, holdout: int, caps: dict[str, int], max_chars: int) -> tuple[list[dict], dict]:
    """-> (rows shortest first, per-source counts {source: [taken, held out, too long]})."""
    held = heldout.eval_prompt_texts(EVAL_WORKLOADS, holdout, data_dir)
    rows, counts, seen = [], {}, set()
    for source, messages_list in candidates(data_dir).items():
        kept, dropped = heldout.without_heldout([{"messages": m} for m in messages_list], held)
        too_long = [r for r in kept if len(heldout.user_text(r)) > max_chars]
        taken = 0
        for i, r in enumerate(r for r in kept if len(heldout.user_text(r)) <= max_chars):
            key = heldout.normalize(heldout.user_text(r))
            if taken >= caps.get(source, 0) or key in seen:
                continue
            seen.add(key)
            rows.append({"id": f"{source}-{i}", "source": source, "messages": r["messages"]})
            taken += 1
        counts[source] = [taken, len(dropped), len(too_long)]
    rows.sort(key=lambda r: len(heldout.user_text(r)))
    return rows, counts


def without_rows_of(rows: list[dict], spec: str) -> list[dict]:
    """rows minus those whose messages the first N rows of FILE hold (spec "FILE:N", or "FILE" for all)."""
    path, _, n = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "")
    if not Path(path).is_file():
        raise SystemExit(f"--minus {spec}: no such file {path} (build it first, e.g. with --scale 2.5)")
    rows_of_file = _jsonl(Path(path))
    if n and len(rows_of_file) < int(n):
        raise SystemExit(f"--minus {spec}: {path} has {len(rows_of_file)} rows, fewer than {n}")
    held = rows_of_file[: int(n) if n else None]
    taken = {json.dumps(r["messages"], sort_keys=True) for r in held}
    return [r for r in rows if json.dumps(r["messages"], sort_keys=True) not in taken]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=workloads.default_data_dir())
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--holdout", type=int, default=20, help="evaluation prompts held out per workload (first N)")
    p.add_argument("--max-chars", type=int, default=1200, help="skip prompts longer than this (characters)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every per-source cap")
    p.add_argument("--minus", metavar="FILE[:N]", default=None,
                   help="leave out the prompts that the first N rows of FILE (every row without :N) already hold: "
                        "the rows a larger --scale adds to a recipe's, to be answered and put in front of them")
    args = p.parse_args(argv)
    caps = {k: int(v * args.scale) for k, v in DEFAULT_CAPS.items()}
    rows, counts = build(args.data_dir, args.holdout, caps, args.max_chars)
    if args.minus:
        rows = without_rows_of(rows, args.minus)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, args.out)
    for source, (taken, dropped, too_long) in counts.items():
        print(f"{source:>13}: {taken:>4} prompts, {dropped:>3} held out (evaluation prompts), {too_long:>3} too long")
    print(f"{len(rows)} prompts -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
