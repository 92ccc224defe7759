"""`draftsmith eval`: run a drafter in the speculative loop on workloads and measure it.

    draftsmith eval runs/eagle3-stories260k/final --workloads spec_bench,mt_bench --k 5
    draftsmith eval runs/eagle3-stories260k/final --temperature 1.0 --check-lossless
    draftsmith eval --draft-model DIR_OR_ID --target ../shared/models/stories260K-hf --workloads mt_bench
    draftsmith eval --proposer ngram --target builtin:pycode-tiny --workloads pycode --k 4

Prints a per-workload table and writes the results JSON (docs/results-schema.md) to --out.
Exit status 1 when --check-lossless finds a prompt whose greedy speculative output differs
from target-only greedy output.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import shlex
import sys
from pathlib import Path

import torch

from draftsmith.errors import UserError
from draftsmith.eval import proposers, results, runner, workloads
from draftsmith.eval.sampling import VERIFICATION_RULES, SamplingParams, rule_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="a training checkpoint dir (runs/NAME/final); omit with --proposer/--draft-model")
    p.add_argument("--target", help="target dir, HF id or builtin:NAME (required without a checkpoint PATH)")
    p.add_argument("--draft-model", help="a HF causal LM (dir or id) sharing the target's tokenizer, as the drafter")
    p.add_argument("--proposer", choices=sorted(proposers.PROPOSERS.names()),
                   help="proposer kind without a checkpoint (default: draft_lm with --draft-model)")
    p.add_argument("--ngram-max", type=int, default=3, help="ngram proposer: longest n-gram matched")
    p.add_argument("--ngram-min", type=int, default=1, help="ngram proposer: shortest n-gram matched")
    p.add_argument("--ngram-match", choices=["first", "last"], default="first", help="ngram: earliest or latest match")
    p.add_argument("--workloads", default="spec_bench",
                   help=f"comma-separated: {', '.join(sorted(set(workloads.WORKLOADS.names()) | set(workloads.GROUPS)))}, "
                        "jsonl:PATH")
    p.add_argument("--k", type=int, default=5, help="draft tokens per round")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy verification; > 0: exact stochastic")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=10, help="per workload (0: all)")
    p.add_argument("--warmup", type=int, default=1, help="prompts run untimed before each workload")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per prompt and mode (>= 3); the run with the median latency is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-lossless", action="store_true",
                   help="greedy speculative output must equal target-only greedy output on every prompt")
    p.add_argument("--data-dir", type=Path, default=None, help="workload data (default ../shared/data or $DRAFTSMITH_DATA)")
    p.add_argument("--prompt-format", choices=workloads.PROMPT_FORMATS, default="auto",
                   help="auto: chat template if the tokenizer has one, else raw text")
    p.add_argument("--dtype", default=None, help="target dtype (default float32, or the checkpoint's)")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=None, help="results JSON path (default results/<name>-<time>.json)")


def _load(args):
    """-> (target, proposer, drafter identity dict)."""
    from draftsmith import target as target_mod

    if args.path:
        if args.draft_model or args.proposer:
            raise UserError("give either a checkpoint PATH or --draft-model/--proposer, not both")
        from draftsmith.train.checkpoint import load_drafter

        device = None if args.device == "auto" else args.device
        loaded = load_drafter(args.path, device=device)
        drafter, target = loaded.drafter, loaded.target
        log = Path(args.path).parent / "metrics.jsonl"
        identity = {"kind": loaded.meta.get("kind", drafter.kind), "name": Path(args.path).resolve().parent.name,
                    "path": str(args.path), "fingerprint": results.module_fingerprint(drafter, drafter.state_dict_for_export()),
                    "num_params": sum(t.numel() for t in drafter.state_dict_for_export().values()),
                    "training_log": str(log) if log.exists() else None}
        return target, proposers.from_drafter(drafter, target), identity
    if not args.target:
        raise UserError("--target is required with --draft-model or --proposer (or give a checkpoint PATH)")
    kind = args.proposer or ("draft_lm" if args.draft_model else None)
    if kind is None:
        raise UserError("name a drafter: a checkpoint PATH, --draft-model DIR_OR_ID, or --proposer ngram")
    target = target_mod.load(args.target, dtype=args.dtype or "float32", device=args.device)
    if kind == "draft_lm":
        if not args.draft_model:
            raise UserError("--proposer draft_lm needs --draft-model DIR_OR_ID")
        draft = target_mod.load(args.draft_model, dtype=args.dtype or "float32", device=str(target.device))
        identity = {"kind": "draft_lm", **draft.identity(), "path": args.draft_model}
        return target, proposers.build("draft_lm", target, draft_model=draft), identity
    options = {"max_ngram": args.ngram_max, "min_ngram": args.ngram_min, "match": args.ngram_match}
    identity = {"kind": kind, "name": f"{kind}(max={args.ngram_max},min={args.ngram_min},{args.ngram_match})",
                "path": None, "fingerprint": None, "num_params": 0, "options": options}
    return target, proposers.build(kind, target, **options), identity


def check_args(args: argparse.Namespace) -> None:
    """Refuse out-of-range flags with one line naming the flag and the fix."""
    problems = [(args.k < 0, f"--k {args.k}: must be >= 0 (0 runs target-only decoding)"),
                (args.num_prompts < 0, f"--num-prompts {args.num_prompts}: must be >= 0 (0: every prompt)"),
                (args.max_new_tokens < 1, f"--max-new-tokens {args.max_new_tokens}: must be >= 1"),
                (args.warmup < 0, f"--warmup {args.warmup}: must be >= 0"),
                (args.repeats < 3, f"--repeats {args.repeats}: must be >= 3 (a median of fewer timings is noise)"),
                (args.temperature < 0, f"--temperature {args.temperature}: must be >= 0 (0: greedy)"),
                (args.top_k < 0, f"--top-k {args.top_k}: must be >= 0 (0: off)"),
                (not 0.0 < args.top_p <= 1.0, f"--top-p {args.top_p}: must lie in (0, 1] (1: off)")]
    for bad, message in problems:
        if bad:
            raise UserError(message)


def main(args: argparse.Namespace) -> int:
    check_args(args)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    names = workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()])
    target, proposer, drafter_id = _load(args)
    settings = runner.EvalSettings(
        k=args.k, max_new_tokens=args.max_new_tokens, sampling=sampling, num_prompts=args.num_prompts or None,
        warmup=args.warmup, seed=args.seed, prompt_format=args.prompt_format, data_dir=args.data_dir,
        check_lossless=args.check_lossless, repeats=args.repeats)
    rule = rule_name(sampling)
    config = {"k": args.k, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
              "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts, "seed": args.seed,
              "warmup": args.warmup, "repeats": args.repeats, "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
              "verification": rule, "lossless_rule": VERIFICATION_RULES[rule], "prompt_format": args.prompt_format,
              "eos_ids": target.eos_ids, "workloads": names, "first_turn_only": True}
    if args.path:
        config["recipe"] = _recipe_dict(args.path)
    torch.manual_seed(args.seed)
    per_workload = {}
    for name in names:
        print(f"[eval] {name}: {drafter_id['name']} k={args.k} ...", flush=True)
        per_workload[name] = runner.run_workload(target, proposer, name, settings)
    command = "draftsmith eval " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["eval"] else \
        "draftsmith eval (function call)"
    out = results.build(command, config, target.identity(), drafter_id, target.device, per_workload, args.check_lossless)
    print(results.table(out))
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.out or Path("results") / f"{drafter_id['kind']}-k{args.k}-t{args.temperature:g}-{stamp}.json"
    print(f"[eval] results written to {results.write(out, path)}")
    if args.check_lossless and not out["lossless"]["passed"]:
        print("[eval] --check-lossless FAILED: speculative greedy output differs from target-only output", file=sys.stderr)
        return 1
    return 0


def _recipe_dict(path: str) -> dict | None:
    import yaml

    recipe = Path(path) / "config.yaml"
    return yaml.safe_load(recipe.read_text()) if recipe.exists() else None
