"""What verification costs on this CPU, and the perfect-proposer bound it allows, for one target in
llama.cpp and in draftsmith's own loop (transformers).

A speculative round verifies k draft tokens plus the bonus position in ONE forward of k + 1 tokens.
With a drafter that costs nothing and is always right, a round yields k + 1 tokens for the cost of
T(k + 1), so the best any drafter can do at draft length k is

    bound(k) = (k + 1) * T(1) / T(k + 1)

(T(w): one cached forward of w new tokens at the given context). A real drafter gets
tau * T(1) / (T(k + 1) + drafting), always below that.

    python benchmarks/bench_verify_bounds.py --target installed:smollm2-135m-instruct \
        --engines llama.cpp,transformers --context 200 --out benchmarks/results/verify-bounds/smollm2.json

llama.cpp: `llama-bench -p W -n 0 -d CONTEXT` (prompt processing of W tokens after CONTEXT cached
tokens; llama-bench sits beside llama-server in the install script's build). transformers: the
target as draftsmith loads it (float32 by default), a prefill of CONTEXT tokens, then cached
forwards of W tokens, each timed after the cache is cut back to CONTEXT. Medians over --repeats
(min and max beside them); the CPU's model name and its avx512 / amx flags are recorded, since the
cost of a wider forward depends on them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def cpu_facts() -> dict:
    """Model name, core count and the SIMD flags that change what a wider forward costs."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if os.path.exists("/usr/bin/lscpu") else ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    simd = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return {"model": fields.get("Model name", platform.processor()).strip(), "cpus": os.cpu_count(), "simd_flags": simd}


def summarize(ms_by_width: dict[int, list[float]]) -> dict:
    rows = {}
    t1 = statistics.median(ms_by_width[1])
    for w, ms in sorted(ms_by_width.items()):
        med = statistics.median(ms)
        rows[w] = {"median_ms": round(med, 3), "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3),
                   "over_one_token": round(med / t1, 3), "bound_at_k": round(w * t1 / med, 3) if w > 1 else None}
    return rows


def llama_cpp_costs(gguf: Path, widths: list[int], context: int, repeats: int, threads: int, repack: bool) -> dict:
    from draftsmith.export.llamacpp.tools import find_llama_cpp

    bench = find_llama_cpp().server.with_name("llama-bench")
    if not bench.is_file():
        raise SystemExit(f"{bench} is missing: build it with `cmake --build {bench.parents[1]} --target llama-bench`")
    cmd = [str(bench), "-m", str(gguf), "-t", str(threads), "-p", ",".join(map(str, widths)), "-n", "0",
           "-d", str(context), "-r", str(repeats), "--repack", "1" if repack else "0", "-o", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    ms = {}
    for line in out.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            ms[rec["n_prompt"]] = [1000.0 * rec["n_prompt"] / s for s in rec["samples_ts"]]
    return {"command": " ".join(cmd), "by_width": summarize(ms)}


def transformers_costs(target_path: str, widths: list[int], context: int, repeats: int, dtype: str) -> dict:
    import torch

    from draftsmith.eval.loop import rollback
    from draftsmith.targets import load as target_mod

    target = target_mod.load(target_path, dtype=dtype)
    model = target.model
    ids = torch.randint(100, min(target.vocab_size, 20000), (1, context + max(widths)))
    ms: dict[int, list[float]] = {w: [] for w in widths}
    with torch.inference_mode():
        cache = model(ids[:, :context], use_cache=True).past_key_values
        for _ in range(repeats + 1):  # the first pass warms up and is dropped
            for w in widths:
                start = time.perf_counter()
                model(ids[:, context:context + w], past_key_values=cache, use_cache=True)
                elapsed = 1000.0 * (time.perf_counter() - start)
                rollback(cache, context)
                ms[w].append(elapsed)
    for w in widths:
        ms[w] = ms[w][1:]
    return {"dtype": dtype, "threads": torch.get_num_threads(), "by_width": summarize(ms)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="installed:smollm2-135m-instruct")
    p.add_argument("--engines", default="llama.cpp,transformers")
    p.add_argument("--widths", default="1,2,3,4,5,6,7,8,9", help="tokens per verification forward (k + 1)")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads (transformers: torch's setting)")
    p.add_argument("--repack", action="store_true", help="llama.cpp: repack weights (default off, as served)")
    p.add_argument("--dtype", default="float32", help="transformers: the target's dtype")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    widths = sorted({int(w) for w in args.widths.split(",")} | {1})
    from draftsmith.targets import installed

    gguf = installed.resolve(args.target.split(":", 1)[1]) if args.target.startswith("installed:") else Path(args.target)
    result = {"target": args.target, "context": args.context, "repeats": args.repeats, "cpu": cpu_facts(),
              "command": " ".join([sys.executable, *sys.argv]), "engines": {}}
    for engine in args.engines.split(","):
        if engine == "llama.cpp":
            result["engines"][engine] = llama_cpp_costs(gguf, widths, args.context, args.repeats, args.threads,
                                                        args.repack)
        elif engine == "transformers":
            result["engines"][engine] = transformers_costs(args.target, widths, args.context, args.repeats, args.dtype)
        else:
            raise SystemExit(f"--engines: {engine!r} is not llama.cpp or transformers")
        print(f"{engine} (context {args.context}):")
        print("  w  median ms   min ms   max ms  T(w)/T(1)  bound(k=w-1)")
        for w, row in result["engines"][engine]["by_width"].items():
            bound = f"{row['bound_at_k']:.2f}x" if row["bound_at_k"] else "-"
            print(f"  {w}  {row['median_ms']:9.2f} {row['min_ms']:8.2f} {row['max_ms']:8.2f} "
                  f"{row['over_one_token']:10.2f}  {bound:>12}")
    return finish(result, args.out)


def finish(result: dict, out: Path | None) -> int:
    """Print the CPU the numbers were measured on and write the result JSON (when --out is given)."""
    cpu = result["cpu"]
    print(f"cpu: {cpu['model']}, {cpu['cpus']} cpus, {' '.join(cpu['simd_flags'])}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
