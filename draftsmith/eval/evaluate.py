"""The eval stage as a function: run(EvalOptions) runs a drafter (a checkpoint, a draft model or a proposer) in the
speculative loop on workloads, prints the per-workload table and writes the results JSON (docs/results-schema.md).
`draftsmith eval` (commands/eval.py) parses the flags into EvalOptions and calls it.

    from draftsmith.eval.evaluate import run
    from draftsmith.eval.options import EvalOptions
    outcome = run(EvalOptions(path="runs/eagle3-stories260k/final", workloads="mt_bench", k=5))
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import SamplingParams
from draftsmith.eval import proposers, results, runner, workloads
from draftsmith.eval.options import EvalOptions, check_args
from draftsmith.eval.records import checkpoint_identity, command_line, results_config, write_results
from draftsmith.heads import draft_model_kind

__all__ = ["EvalRun", "run"]


def _load(args: EvalOptions):
    """-> (target, proposer, drafter identity dict)."""
    if args.revision and not args.target:
        raise UserError("--revision names a revision of --target; give --target too (a checkpoint's own target "
                         "loads at its recipe's target.revision)")
    if args.draft_revision and not args.draft_model:
        raise UserError("--draft-revision names a revision of --draft-model; give --draft-model too")
    if args.path:
        if args.draft_model or args.proposer:
            raise UserError("give either a checkpoint PATH or --draft-model/--proposer, not both")
        return _load_checkpoint(args)
    if not args.target:
        raise UserError("--target is required with --draft-model or --proposer (or give a checkpoint PATH)")
    return _load_proposer(args)


def _load_checkpoint(args: EvalOptions):
    """A checkpoint PATH's drafter (behind prompt lookup with --ngram-first) on its target, or on --target."""
    from draftsmith.checkpoint import load_drafter, read_config
    from draftsmith.targets import load as target_mod

    device = None if args.device == "auto" else args.device
    given = None
    if args.target:  # evaluate on this copy of the target; load_drafter checks its fingerprint
        dtype = read_config(args.path).target.dtype  # as trained: --dtype casts after the fingerprint check
        given = target_mod.load(args.target, dtype=dtype, device=args.device,
                                revision=args.revision, trust_remote_code=args.trust_remote_code,
                                gguf_file=args.gguf_file)
    loaded = load_drafter(args.path, device=device, target=given, trust_remote_code=args.trust_remote_code,
                          dtype=args.dtype)
    name, lookup = Path(args.path).resolve().parent.name, None
    ngram = args.ngram
    drafter_k = ngram.drafter_k if ngram.drafter_k is not None and ngram.drafter_k < args.k else None  # = --k: no cap
    if ngram.first:
        lookup = ngram.lookup()
        name += f"+ngram-first(max={ngram.max},min={ngram.min},{ngram.match}"
        name += f",drafter_k={drafter_k})" if drafter_k is not None else ")"
    identity = checkpoint_identity(loaded, args.path, name, lookup and {**lookup, "drafter_k": drafter_k})
    proposer = proposers.from_drafter(loaded.drafter, loaded.target, ngram_first=lookup, drafter_k=drafter_k)
    return loaded.target, proposer, identity


def _load_proposer(args: EvalOptions):
    """--draft-model (any causal LM as the drafter) or --proposer NAME, on --target."""
    from draftsmith.targets import load as target_mod

    draft_kind = draft_model_kind()
    kind = args.proposer or (draft_kind if args.draft_model else None)
    if kind is None:
        raise UserError("name a drafter: a checkpoint PATH, --draft-model DIR_OR_ID, or --proposer ngram")
    target = target_mod.load(args.target, dtype=args.dtype or "float32", device=args.device, revision=args.revision,
                             trust_remote_code=args.trust_remote_code, gguf_file=args.gguf_file)
    if kind == draft_kind:
        if not args.draft_model:
            raise UserError(f"--proposer {kind} needs --draft-model DIR_OR_ID")
        draft = target_mod.load(args.draft_model, dtype=args.dtype or "float32", device=str(target.device),
                                revision=args.draft_revision, trust_remote_code=args.trust_remote_code)
        identity = {"kind": kind, **draft.identity(), "path": args.draft_model}
        return target, proposers.build(kind, target, draft_model=draft), identity
    ngram, options = args.ngram, args.ngram.lookup()
    identity = {"kind": kind, "name": f"{kind}(max={ngram.max},min={ngram.min},{ngram.match})",
                "path": None, "fingerprint": None, "num_params": 0, "options": options}
    return target, proposers.build(kind, target, **options), identity


def check_target_bounds(args: EvalOptions, target) -> None:
    """k or the tree against the loaded target's positions."""
    from draftsmith.core import bounds

    if args.tree:
        bounds.check_tree(args.tree_depth, args.tree_topk, args.verify_budget, target.config)
    else:
        bounds.check_draft_tokens(args.k, "--k", target.config)


@dataclass
class EvalRun:
    results: dict  # the results JSON (docs/results-schema.md)
    path: Path  # where it was written
    passed: bool  # False when --check-lossless found a differing output



def run(args: EvalOptions) -> EvalRun:
    """Run the drafter on the workloads, print the table, write the results JSON (`draftsmith eval`)."""
    check_args(args)
    if getattr(args, "engine", None):  # `draftsmith eval --engine` runs draftsmith.commands.eval_engine.main (above eval/ and export/)
        raise UserError("--engine: call draftsmith.commands.eval_engine.main(args) (the `draftsmith eval` command does)")
    names = workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()])
    target, proposer, drafter_id = _load(args)
    check_target_bounds(args, target)
    weights_dtype = str(target.dtype).removeprefix("torch.")
    target = _verifying_target(args, target, weights_dtype)
    recipe = workloads.checkpoint_recipe(args.path) if args.path else None
    prompt_format = args.prompt_format
    if args.path and prompt_format == "auto":  # the format the drafter was trained with
        prompt_format = workloads.training_prompt_format(recipe, target.tokenizer)
        print(f"[eval] prompt format: {prompt_format} (as in training; --prompt-format overrides)", flush=True)
    tree = _tree(args, target, proposer, prompt_format)
    if tree is not None:
        args.k = args.tree_depth  # k: the deepest draft position (per-position acceptance has that many entries)
    settings = runner.EvalSettings(
        tree=tree, k=args.k, max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts or None,
        sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p),
        warmup=args.warmup, seed=args.seed, prompt_format=prompt_format, data_dir=args.data_dir,
        check_lossless=args.check_lossless, repeats=args.repeats, near_tie_steps=args.near_tie_steps)
    batch_sizes = _batch_sizes(args)
    if batch_sizes and tree is not None:
        raise UserError("--batch-size/--concurrency-sweep decode chains: drop --tree for a batched run")
    config = results_config(args, weights_dtype=weights_dtype, device=str(target.device), eos_ids=target.eos_ids,
                            prompt_format=prompt_format, names=names, tree=tree, recipe=recipe, batch_sizes=batch_sizes)
    torch.manual_seed(args.seed)
    per_workload = {name: _run_workload(target, proposer, name, settings, drafter_id["name"], batch_sizes)
                    for name in names}
    out = results.build(command_line("draftsmith eval (function call)"), config, target.identity(), drafter_id,
                        target.device, per_workload, args.check_lossless)
    print(results.table(out))
    for line in _does_it_pay(out, args.k if tree is None else None):
        print(line)
    shape = f"tree{tree.budget}" if tree else f"k{args.k}"
    written = write_results(out, args.out, f"{drafter_id['kind']}-{shape}-t{args.temperature:g}")
    return EvalRun(out, written, passed=_lossless_verdict(args, out, weights_dtype))


def _verifying_target(args: EvalOptions, target, weights_dtype: str):
    """--verify-dtype: the target whose verification forwards run upcast (the proposer keeps the loaded one)."""
    if not args.verify_dtype or args.verify_dtype == weights_dtype:
        return target
    from draftsmith.eval.numerics import UpcastVerifier
    from draftsmith.targets.load import DTYPES

    print(f"[eval] verification in {args.verify_dtype} (weights loaded in {weights_dtype})", flush=True)
    return UpcastVerifier(target, DTYPES[args.verify_dtype])


def _tree(args: EvalOptions, target, proposer, prompt_format: str):
    """--tree's TreeConfig (None without --tree); --tree-calibrate measures the static tree's acceptance."""
    if not args.tree:
        return None
    from draftsmith.eval.tree import TreeConfig

    tree = TreeConfig(args.tree, depth=args.tree_depth, topk=args.tree_topk, budget=args.verify_budget)
    if args.tree_calibrate:
        if args.tree != "static":
            raise UserError("--tree-calibrate builds a static tree: use it with --tree static")
        from draftsmith.eval.tree_calibration import measure_topk_acceptance

        limit = getattr(target.config, "max_position_embeddings", None) or 10**9
        items = workloads.load(args.tree_calibrate, args.data_dir, args.num_prompts or None)
        calib = [workloads.encode(i, target.tokenizer, prompt_format, limit - args.max_new_tokens)[0] for i in items]
        tree.acceptance = measure_topk_acceptance(target, proposer, calib, args.tree_depth, args.tree_topk,
                                                  args.max_new_tokens)
        print("[eval] static tree from measured top-k acceptance on " + args.tree_calibrate + ": " +
              " | ".join(" ".join(f"{a:.2f}" for a in row) for row in tree.acceptance), flush=True)
    return tree


def _run_workload(target, proposer, name: str, settings, drafter_name: str, batch_sizes: list) -> dict:
    """One workload's results; --ngram-first's split of rounds; the batched runs."""
    tree = settings.tree
    shape = f"tree={tree.kind} depth={tree.depth} topk={tree.topk} budget={tree.budget}" if tree else f"k={settings.k}"
    print(f"[eval] {name}: {drafter_name} {shape} ...", flush=True)
    hybrid = isinstance(proposer, proposers.NgramFirstProposer)
    before = dict(proposer.rounds) if hybrid else {}
    section = runner.run_workload(target, proposer, name, settings)
    if hybrid:
        split = {side: proposer.rounds[side] - before.get(side, 0) for side in ("ngram", "drafter")}
        section["ngram_first_rounds"] = split
        print(f"[eval] {name}: --ngram-first: prompt lookup drafted {split['ngram']} rounds, the drafter "
              f"{split['drafter']} (every speculative run: warmup, repeats, lossless rerun)", flush=True)
    if batch_sizes:
        print(f"[eval] {name}: batched decoding, B in {batch_sizes} ...", flush=True)
        section["batched"] = runner.run_batched(target, proposer, name, settings, batch_sizes)
    return section


def _lossless_verdict(args: EvalOptions, out: dict, weights_dtype: str) -> bool:
    """--check-lossless: False (and why, on stderr) when an output differs; near-ties are said, not failed."""
    if not args.check_lossless:
        return True
    if not all(r.get("lossless", True) for w in out["workloads"].values() for r in w.get("batched", [])):
        print("[eval] --check-lossless FAILED: batched greedy output differs from batch-1 target-only output", file=sys.stderr)
        return False
    if not out["lossless"]["passed"]:
        print("[eval] --check-lossless FAILED: speculative greedy output differs from target-only output", file=sys.stderr)
        return False
    if out["lossless"].get("near_ties"):
        print(f"[eval] --check-lossless: {len(out['lossless']['near_ties'])} prompt(s) diverged at a numerical near-tie "
              f"of the {weights_dtype} target (not a failure; --verify-dtype float32 verifies in float32)")
    return True


def _does_it_pay(out: dict, k: int | None) -> list[str]:
    """Say plainly, per workload, when speculation does not pay here: the measured median speedup is
    below 1, or the speedup model (report/speedup_model.py, from this run's costs) puts the best k at 0."""
    from draftsmith.report import speedup_model

    lines = []
    for name, w in out["workloads"].items():
        a = w["aggregate"]
        measured = (a.get("speedup") or {}).get("median")
        best = None
        costs = speedup_model.costs_from_aggregate(a, k) if k else None
        if costs is not None and a.get("per_position_acceptance"):
            best = speedup_model.best_k(speedup_model.predict_all(a["per_position_acceptance"], costs, k)).k
        if best == 0 or (measured is not None and measured < 1.0):
            why = f"measured median speedup {measured:.2f}" if measured is not None else "no measured speedup"
            model = f"; the speedup model's best k is {best}" if best is not None else ""
            lines.append(f"[eval] {name}: speculation does not pay here ({why}{model}): target-only decoding is faster")
    return lines


def _batch_sizes(args) -> list[int]:
    sizes = [args.batch_size] if args.batch_size is not None else []
    if args.concurrency_sweep:
        try:
            sizes += [int(x) for x in args.concurrency_sweep.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--concurrency-sweep {args.concurrency_sweep!r}: give comma-separated integers, e.g. 1,2,4,8") from None
    if any(b < 1 for b in sizes):
        raise UserError(f"batch sizes must be >= 1, got {sizes}")
    return sorted(set(sizes))
