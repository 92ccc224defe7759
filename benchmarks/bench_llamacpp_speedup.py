"""llama.cpp's wall-clock decode speedup with a draftsmith export at several k, and with llama.cpp's own
draftless proposers, on the shared workloads: one target-only llama-server and one server per setup, all
up at once, every prompt sent to each in a rotating order after one untimed warm-up (eval_engine's
serve_interleaved, as `draftsmith eval --engine llama.cpp` does), greedy, EOS ignored, batch 1.

    python benchmarks/bench_llamacpp_speedup.py runs/eagle3-smollm2-135m/final --export exported/smollm2-q8 \
        --target-gguf "$(bash scripts/install_smollm2.sh | tail -1)" --ks 1,2,3,4,5 --compare ngram-mod,ngram-simple \
        --workloads mt_bench,alpaca --num-prompts 20 --max-new-tokens 128 --threads 2 \
        --out benchmarks/results/llamacpp-speedup/smollm2.json

Speedup per prompt = decode tokens/s with the proposer / decode tokens/s of the target-only server on the
same prompt (the server's timings.predicted_per_second: tokens counted by the server from ids, after the
first token); median and p90 over prompts. The prompts are encoded as `draftsmith eval` encodes them for
the checkpoint (its training prompt format). The CPU's model and SIMD flags are recorded with the numbers.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_verify_bounds import cpu_facts, finish  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="the trained drafter (its recipe gives the prompt format and tokenizer)")
    p.add_argument("--export", required=True, help="its `draftsmith export --to llama.cpp` directory")
    p.add_argument("--target-gguf", default=None, help="serve this target GGUF (default: the export's)")
    p.add_argument("--ks", default="1,2,3,4,5", help="--spec-draft-n-max values, one server each")
    p.add_argument("--compare", default="", help="llama.cpp spec types to run too (eval --engine-compare syntax)")
    p.add_argument("--workloads", default="mt_bench,alpaca")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    from draftsmith.checkpoint import read_config
    from draftsmith.commands.eval_engine import serve_interleaved
    from draftsmith.data.regenerate import recipe_tokenizer
    from draftsmith.eval import workloads
    from draftsmith.eval.engine import compare_section, compare_setups
    from draftsmith.export.llamacpp.layouts import read_export_dir
    from draftsmith.export.llamacpp.tools import LlamaServer, find_llama_cpp

    tools = find_llama_cpp()
    side = read_export_dir(args.export)
    target = Path(args.target_gguf or side["target"])
    draft = Path(side["draft"])
    tokenizer = recipe_tokenizer(read_config(Path(args.checkpoint)))
    fmt = workloads.training_prompt_format(workloads.checkpoint_recipe(args.checkpoint), tokenizer)
    ks = [int(k) for k in args.ks.split(",")]
    setups = compare_setups(args.compare, side["spec_type"])
    result = {"checkpoint": args.checkpoint, "export": args.export, "draft_gguf_type": side.get("draft_gguf_type"),
              "target_gguf": str(target), "spec_type": side["spec_type"], "threads": args.threads,
              "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "prompt_format": fmt,
              "llama_cpp": tools.version(), "cpu": cpu_facts(), "command": " ".join([sys.executable, *sys.argv]),
              "workloads": {}}
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        items = workloads.load(name, None, args.num_prompts)
        ids = [workloads.encode(item, tokenizer, fmt)[0].reshape(-1).tolist() for item in items]
        bound = len(ids) + 1
        servers = {"target-only": LlamaServer(tools, target, threads=args.threads, max_requests=bound)}
        for k in ks:
            servers[f"k={k}"] = LlamaServer(tools, target, draft=draft, spec_type=side["spec_type"], k=k,
                                            threads=args.threads, max_requests=bound)
        for s in setups:
            servers[s["name"]] = LlamaServer(tools, target, draft=draft if s["draft"] else None,
                                             spec_type=s["spec_type"], k=max(ks), threads=args.threads,
                                             max_requests=bound)
        replies = serve_interleaved(servers, ids, args.max_new_tokens)
        base = replies.pop("target-only")
        rows = {setup: compare_section(r, base) for setup, r in replies.items()}
        result["workloads"][name] = {"num_prompts": len(ids), "target_only_tokens_per_s": compare_section(base, base)[
            "decode_tokens_per_s"], "setups": rows}
        print(f"{name}: {len(ids)} prompts x {args.max_new_tokens} tokens; target-only "
              f"{result['workloads'][name]['target_only_tokens_per_s']['median']:.1f} tok/s median", flush=True)
        for setup, row in rows.items():
            sp = row["decode_speedup"]
            print(f"  {setup:24s} speedup {sp['median']:.2f}x median, {sp['p90']:.2f}x p90 | tau "
                  f"{row['acceptance_length']:.2f} | alpha {row['acceptance_rate']:.2f} | output == target-only "
                  f"{row['output_equals_target_only']}/{row['num_requests']}", flush=True)
    return finish(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
