"""`draftsmith eval`: run a drafter in the speculative loop on workloads and measure it.

    draftsmith eval runs/eagle3-stories260k/final --workloads spec_bench,mt_bench --k 5
    draftsmith eval runs/eagle3-stories260k/final --temperature 1.0 --check-lossless
    draftsmith eval --draft-model DIR_OR_ID --target ../shared/models/stories260K-hf --workloads mt_bench
    draftsmith eval --proposer ngram --target builtin:pycode-tiny --workloads pycode --k 4
    draftsmith eval runs/eagle3-stories260k/final --engine llama.cpp --workloads mt_bench --k 3   (cli_engine.py)

Prints a per-workload table and writes the results JSON (docs/results-schema.md) to --out.
Exit status 1 when --check-lossless finds a prompt whose greedy speculative output differs
from target-only greedy output.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import shlex
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import VERIFICATION_RULES, SamplingParams, rule_name
from draftsmith.eval import proposers, results, runner, workloads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="a training checkpoint dir (runs/NAME/final); omit with --proposer/--draft-model")
    p.add_argument("--target", help="target dir, HF id, .gguf file, installed:NAME or builtin:NAME (required without a checkpoint PATH; with one, "
                                    "the checkpoint runs on this copy after its fingerprint check)")
    p.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit) of --target")
    p.add_argument("--gguf-file", default=None, help="the GGUF file inside a --target directory holding several "
                                                     "(a .gguf --target names it already)")
    p.add_argument("--draft-model", help="a HF causal LM (dir or id) sharing the target's tokenizer, as the drafter")
    p.add_argument("--draft-revision", default=None, help="Hub revision (branch, tag or commit) of --draft-model")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the models' custom modelling code (never enabled by a checkpoint's config.yaml)")
    p.add_argument("--proposer", choices=sorted(proposers.PROPOSERS.names()),
                   help="proposer kind without a checkpoint (default: draft_lm with --draft-model)")
    p.add_argument("--ngram-max", type=int, default=3, help="ngram proposer: longest n-gram matched")
    p.add_argument("--ngram-min", type=int, default=1, help="ngram proposer: shortest n-gram matched")
    p.add_argument("--ngram-match", choices=["first", "last"], default="first", help="ngram: earliest or latest match")
    p.add_argument("--ngram-first", action="store_true",
                   help="with a checkpoint PATH: prompt lookup (--ngram-max/--ngram-min/--ngram-match) drafts every round "
                        "where it finds a match, the checkpoint's drafter only the rounds where it finds none (chains)")
    p.add_argument("--drafter-k", type=int, default=None,
                   help="--ngram-first: the drafter's rounds draft at most this many tokens, the lookup's up to --k "
                        "(default: --k for both; a long copy costs nothing to draft)")
    p.add_argument("--workloads", default="spec_bench",
                   help=f"comma-separated: {', '.join(sorted(set(workloads.WORKLOADS.names()) | set(workloads.GROUPS)))}, "
                        "jsonl:PATH")
    p.add_argument("--k", type=int, default=5, help="draft tokens per round (chain drafting), 1..64 (k = 0, target-only "
                                                  "decoding, is the baseline every run measures)")
    p.add_argument("--tree", choices=["dynamic", "static"], default=None,
                   help="tree drafting: dynamic = EAGLE-2 expand + rerank; static = Medusa sparse tree (eval/tree.py)")
    p.add_argument("--tree-depth", type=int, default=5, help="--tree: deepest draft position")
    p.add_argument("--tree-topk", type=int, default=4, help="--tree: children per expanded node (static: ranks per depth)")
    p.add_argument("--verify-budget", type=int, default=16, help="--tree: draft nodes verified per round")
    p.add_argument("--tree-calibrate", default=None, metavar="WORKLOAD",
                   help="--tree static: build the sparse tree from per-position top-k acceptance measured on "
                        "--num-prompts prompts of WORKLOAD (default: a stated prior); use prompts you do not evaluate on")
    p.add_argument("--batch-size", type=int, default=None,
                   help="also decode B requests together (batched rounds; chain drafting) and report tokens/s, TPOT, speedup")
    p.add_argument("--concurrency-sweep", default=None, help="comma-separated batch sizes, e.g. 1,2,4,8,16,32")
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
                   help="greedy speculative output must equal target-only greedy output on every prompt; a "
                        "divergence at a numerical near-tie (top-2 margin within one step of the dtype, in both "
                        "passes) is reported and counted apart, a real mismatch fails (docs/eval.md)")
    p.add_argument("--near-tie-steps", type=float, default=2.0,
                   help="--check-lossless: a divergence where the target's top-2 margin is within this many steps of "
                        "the logits' dtype in both passes is a numerical near-tie, not a failure (0: only exact ties)")
    p.add_argument("--verify-dtype", choices=["float32"], default=None,
                   help="run every verification forward (all layers, final norm, lm_head) in this dtype on an exact "
                        "upcast of the loaded weights, in the speculative and the target-only pass: greedy equality "
                        "for bf16/fp16 targets, at float32 speed")
    p.add_argument("--data-dir", type=Path, default=None, help="workload data (default ../shared/data or $DRAFTSMITH_DATA)")
    p.add_argument("--prompt-format", choices=workloads.PROMPT_FORMATS, default="auto",
                   help="auto: a checkpoint's training format (its recipe's chat template or draftsmith's "
                        "plain chat format; raw for text-trained drafters); other proposers: the chat template "
                        "if the tokenizer has one, else raw text")
    p.add_argument("--dtype", default=None, help="target dtype: float32, bfloat16 or float16 (default float32, or the "
                                                  "checkpoint's target.dtype); results record the dtype used")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=None, help="results JSON path (default results/<name>-<time>.json)")
    p.add_argument("--engine", choices=["llama.cpp"], default=None,
                   help="train-to-serve parity: also serve the drafter in this engine on the same prompts (cli_engine.py)")
    p.add_argument("--engine-export", default=None, metavar="DIR",
                   help="--engine: a `draftsmith export --to llama.cpp` directory (default: export into a temp dir)")
    p.add_argument("--target-gguf", default=None, help="--engine: the target's GGUF (default: converted by the export)")
    p.add_argument("--engine-threads", type=int, default=1,
                   help="--engine: threads of each llama-server (1: ggml's spinning threads lose badly on a busy 2-core machine)")


def _load(args):
    """-> (target, proposer, drafter identity dict)."""
    from draftsmith.targets import load as target_mod

    if args.revision and not args.target:
        raise UserError("--revision names a revision of --target; give --target too (a checkpoint's own target "
                         "loads at its recipe's target.revision)")
    if args.draft_revision and not args.draft_model:
        raise UserError("--draft-revision names a revision of --draft-model; give --draft-model too")
    if args.path:
        if args.draft_model or args.proposer:
            raise UserError("give either a checkpoint PATH or --draft-model/--proposer, not both")
        from draftsmith.checkpoint import load_drafter, read_config

        device = None if args.device == "auto" else args.device
        given = None
        if args.target:  # evaluate on this copy of the target; load_drafter checks its fingerprint
            dtype = read_config(args.path).target.dtype  # as trained: --dtype casts after the fingerprint check
            given = target_mod.load(args.target, dtype=dtype, device=args.device,
                                    revision=args.revision, trust_remote_code=args.trust_remote_code,
                                    gguf_file=args.gguf_file)
        loaded = load_drafter(args.path, device=device, target=given, trust_remote_code=args.trust_remote_code,
                              dtype=args.dtype)
        drafter, target = loaded.drafter, loaded.target
        log = Path(args.path).parent / "metrics.jsonl"
        name, lookup = Path(args.path).resolve().parent.name, None
        drafter_k = args.drafter_k if args.drafter_k is not None and args.drafter_k < args.k else None  # = --k: no cap
        if args.ngram_first:
            lookup = {"max_ngram": args.ngram_max, "min_ngram": args.ngram_min, "match": args.ngram_match}
            name += f"+ngram-first(max={args.ngram_max},min={args.ngram_min},{args.ngram_match}"
            name += f",drafter_k={drafter_k})" if drafter_k is not None else ")"
        identity = {"kind": loaded.meta.get("kind", drafter.kind), "name": name,
                    "path": str(args.path), "fingerprint": results.module_fingerprint(drafter, drafter.state_dict_for_export()),
                    "num_params": sum(t.numel() for t in drafter.state_dict_for_export().values()),
                    "trainable_params": sum(p.numel() for p in drafter.trainable_parameters()),
                    "training_log": str(log) if log.exists() else None,
                    "ngram_first": lookup and {**lookup, "drafter_k": drafter_k}}
        return target, proposers.from_drafter(drafter, target, ngram_first=lookup, drafter_k=drafter_k), identity
    if not args.target:
        raise UserError("--target is required with --draft-model or --proposer (or give a checkpoint PATH)")
    kind = args.proposer or ("draft_lm" if args.draft_model else None)
    if kind is None:
        raise UserError("name a drafter: a checkpoint PATH, --draft-model DIR_OR_ID, or --proposer ngram")
    target = target_mod.load(args.target, dtype=args.dtype or "float32", device=args.device, revision=args.revision,
                             trust_remote_code=args.trust_remote_code, gguf_file=args.gguf_file)
    if kind == "draft_lm":
        if not args.draft_model:
            raise UserError("--proposer draft_lm needs --draft-model DIR_OR_ID")
        draft = target_mod.load(args.draft_model, dtype=args.dtype or "float32", device=str(target.device),
                                revision=args.draft_revision, trust_remote_code=args.trust_remote_code)
        identity = {"kind": "draft_lm", **draft.identity(), "path": args.draft_model}
        return target, proposers.build("draft_lm", target, draft_model=draft), identity
    options = {"max_ngram": args.ngram_max, "min_ngram": args.ngram_min, "match": args.ngram_match}
    identity = {"kind": kind, "name": f"{kind}(max={args.ngram_max},min={args.ngram_min},{args.ngram_match})",
                "path": None, "fingerprint": None, "num_params": 0, "options": options}
    return target, proposers.build(kind, target, **options), identity


def check_args(args: argparse.Namespace) -> None:
    """Refuse out-of-range flags with one line naming the flag and the fix (before anything loads)."""
    from draftsmith.core import bounds
    from draftsmith.targets.load import DTYPES, resolve_device

    finite = all(math.isfinite(v) for v in (args.temperature, args.top_p))
    problems = [(not math.isfinite(args.temperature), f"--temperature {args.temperature}: must be a finite number >= 0"),
                (not math.isfinite(args.top_p), f"--top-p {args.top_p}: must lie in (0, 1] (1: off)"),
                (args.num_prompts < 0, f"--num-prompts {args.num_prompts}: must be >= 0 (0: every prompt)"),
                (args.max_new_tokens < 1, f"--max-new-tokens {args.max_new_tokens}: must be >= 1"),
                (args.warmup < 0, f"--warmup {args.warmup}: must be >= 0"),
                (args.repeats < 3, f"--repeats {args.repeats}: must be >= 3 (a median of fewer timings is noise)"),
                (args.near_tie_steps < 0, f"--near-tie-steps {args.near_tie_steps}: must be >= 0"),
                (finite and args.temperature < 0, f"--temperature {args.temperature}: must be >= 0 (0: greedy)"),
                (args.top_k < 0, f"--top-k {args.top_k}: must be >= 0 (0: off)"),
                (finite and not 0.0 < args.top_p <= 1.0, f"--top-p {args.top_p}: must lie in (0, 1] (1: off)"),
                (args.batch_size is not None and args.batch_size < 1, f"--batch-size {args.batch_size}: must be >= 1"),
                (args.ngram_first and not args.path,
                 "--ngram-first puts a checkpoint's drafter behind prompt lookup: give the checkpoint PATH "
                 "(for prompt lookup alone use --proposer ngram)"),
                (args.ngram_first and bool(args.tree), "--ngram-first drafts chains: drop --tree"),
                (args.drafter_k is not None and not args.ngram_first,
                 f"--drafter-k {args.drafter_k}: caps the drafter's rounds behind prompt lookup; add --ngram-first, "
                 "or set --k for a drafter alone"),
                (args.drafter_k is not None and not 1 <= args.drafter_k <= args.k,
                 f"--drafter-k {args.drafter_k}: must lie in 1..--k ({args.k}): with --ngram-first the lookup drafts up to --k"),
                (not [w for w in args.workloads.split(",") if w.strip()],
                 f"--workloads {args.workloads!r}: names no workload; give e.g. --workloads spec_bench,mt_bench"),
                (args.dtype is not None and args.dtype not in DTYPES,
                 f"--dtype {args.dtype!r}: choose one of {', '.join(DTYPES)}")]
    for bad, message in problems:
        if bad:
            raise UserError(message)
    if args.tree:
        bounds.check_tree(args.tree_depth, args.tree_topk, args.verify_budget)
    elif args.k == 0:
        raise UserError("--k 0: target-only decoding against itself measures nothing (every eval already runs k = 0 "
                        "as the baseline of its speedup); give --k >= 1")
    else:
        bounds.check_draft_tokens(args.k, "--k")
    resolve_device(args.device)  # --device cuda without CUDA: one line now, not after loading the target
    if args.out is not None:
        refuse_out_in_a_checkpoint(Path(args.out))


def refuse_out_in_a_checkpoint(out: Path) -> None:
    """--out must not write into a checkpoint or an export (eval --out CKPT/config.yaml breaks it)."""
    resolved = out.expanduser().resolve()
    for folder in (resolved, *resolved.parents):
        for marker, what in (("drafter.json", "checkpoint"), ("draftsmith.json", "draftsmith export")):
            if (folder / marker).is_file():
                raise UserError(f"--out {out}: lies inside the {what} {folder} (it holds {marker}); write results "
                                "elsewhere, e.g. --out results/NAME.json")


def check_target_bounds(args: argparse.Namespace, target) -> None:
    """k or the tree against the loaded target's positions."""
    from draftsmith.core import bounds

    if args.tree:
        bounds.check_tree(args.tree_depth, args.tree_topk, args.verify_budget, target.config)
    else:
        bounds.check_draft_tokens(args.k, "--k", target.config)


@dataclass
class EvalOptions:
    """Every option of `draftsmith eval`, typed, with the flags' defaults (tests/eval/test_eval_run.py checks
    they agree with add_arguments): run(EvalOptions(path="runs/x/final", workloads="mt_bench", k=4))."""

    path: Optional[str] = None
    target: Optional[str] = None
    revision: Optional[str] = None
    gguf_file: Optional[str] = None
    draft_model: Optional[str] = None
    draft_revision: Optional[str] = None
    trust_remote_code: bool = False
    proposer: Optional[str] = None
    ngram_max: int = 3
    ngram_min: int = 1
    ngram_match: str = "first"
    ngram_first: bool = False
    drafter_k: Optional[int] = None
    workloads: str = "spec_bench"
    k: int = 5
    tree: Optional[str] = None
    tree_depth: int = 5
    tree_topk: int = 4
    verify_budget: int = 16
    tree_calibrate: Optional[str] = None
    batch_size: Optional[int] = None
    concurrency_sweep: Optional[str] = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    num_prompts: int = 10
    warmup: int = 1
    repeats: int = 3
    seed: int = 0
    check_lossless: bool = False
    near_tie_steps: float = 2.0
    verify_dtype: Optional[str] = None
    data_dir: Optional[Path] = None
    prompt_format: str = "auto"
    dtype: Optional[str] = None
    device: str = "auto"
    out: Optional[Path] = None
    engine: Optional[str] = None  # `draftsmith eval --engine` runs cli_engine.main, which calls run() for draftsmith's side
    engine_export: Optional[str] = None
    target_gguf: Optional[str] = None
    engine_threads: int = 1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EvalOptions":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass
class EvalRun:
    results: dict  # the results JSON (docs/results-schema.md)
    path: Path  # where it was written
    passed: bool  # False when --check-lossless found a differing output


def main(args: argparse.Namespace) -> int:
    return 0 if run(EvalOptions.from_args(args)).passed else 1


def run(args: EvalOptions) -> EvalRun:
    """Run the drafter on the workloads, print the table, write the results JSON (`draftsmith eval`)."""
    check_args(args)
    if getattr(args, "engine", None):  # `draftsmith eval --engine` runs draftsmith.commands.eval_engine.main (above eval/ and export/)
        raise UserError("--engine: call draftsmith.commands.eval_engine.main(args) (the `draftsmith eval` command does)")
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    names = workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()])
    target, proposer, drafter_id = _load(args)
    check_target_bounds(args, target)
    weights_dtype = str(target.dtype).removeprefix("torch.")
    if args.verify_dtype and args.verify_dtype != weights_dtype:
        from draftsmith.eval.numerics import UpcastVerifier
        from draftsmith.targets.load import DTYPES

        target = UpcastVerifier(target, DTYPES[args.verify_dtype])  # the proposer keeps the loaded target
        print(f"[eval] verification in {args.verify_dtype} (weights loaded in {weights_dtype})", flush=True)
    recipe = workloads.checkpoint_recipe(args.path) if args.path else None
    prompt_format = args.prompt_format
    if args.path and prompt_format == "auto":  # the format the drafter was trained with
        prompt_format = workloads.training_prompt_format(recipe, target.tokenizer)
        print(f"[eval] prompt format: {prompt_format} (as in training; --prompt-format overrides)", flush=True)
    tree = None
    if args.tree:
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
        args.k = args.tree_depth  # k: the deepest draft position (per-position acceptance has that many entries)
    settings = runner.EvalSettings(
        tree=tree, k=args.k, max_new_tokens=args.max_new_tokens, sampling=sampling, num_prompts=args.num_prompts or None,
        warmup=args.warmup, seed=args.seed, prompt_format=prompt_format, data_dir=args.data_dir,
        check_lossless=args.check_lossless, repeats=args.repeats, near_tie_steps=args.near_tie_steps)
    rule = rule_name(sampling)
    config = {"k": args.k, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
              "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts, "seed": args.seed,
              "warmup": args.warmup, "repeats": args.repeats, "dtype": weights_dtype,
              "verify_dtype": args.verify_dtype or weights_dtype, "near_tie_steps": args.near_tie_steps,
              "device": str(target.device),
              "verification": rule, "lossless_rule": VERIFICATION_RULES[rule], "prompt_format": prompt_format,
              "eos_ids": target.eos_ids, "workloads": names, "first_turn_only": True,
              "tree": None if tree is None else vars(tree), "verify_budget": tree.budget if tree else args.k,
              "tree_budget": tree.budget if tree else None}
    if args.path:
        config["recipe"] = recipe
    batch_sizes = _batch_sizes(args)
    if batch_sizes and tree is not None:
        raise UserError("--batch-size/--concurrency-sweep decode chains: drop --tree for a batched run")
    config["batch_sizes"] = batch_sizes
    torch.manual_seed(args.seed)
    per_workload = {}
    for name in names:
        shape = f"tree={tree.kind} depth={tree.depth} topk={tree.topk} budget={tree.budget}" if tree else f"k={args.k}"
        print(f"[eval] {name}: {drafter_id['name']} {shape} ...", flush=True)
        hybrid = isinstance(proposer, proposers.NgramFirstProposer)
        before = dict(proposer.rounds) if hybrid else {}
        per_workload[name] = runner.run_workload(target, proposer, name, settings)
        if hybrid:
            split = {side: proposer.rounds[side] - before.get(side, 0) for side in ("ngram", "drafter")}
            per_workload[name]["ngram_first_rounds"] = split
            print(f"[eval] {name}: --ngram-first: prompt lookup drafted {split['ngram']} rounds, the drafter "
                  f"{split['drafter']} (every speculative run: warmup, repeats, lossless rerun)", flush=True)
        if batch_sizes:
            print(f"[eval] {name}: batched decoding, B in {batch_sizes} ...", flush=True)
            per_workload[name]["batched"] = runner.run_batched(target, proposer, name, settings, batch_sizes)
    command = "draftsmith eval " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["eval"] else \
        "draftsmith eval (function call)"
    out = results.build(command, config, target.identity(), drafter_id, target.device, per_workload, args.check_lossless)
    print(results.table(out))
    for line in _does_it_pay(out, args.k if tree is None else None):
        print(line)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    shape = f"tree{tree.budget}" if tree else f"k{args.k}"
    path = args.out or Path("results") / f"{drafter_id['kind']}-{shape}-t{args.temperature:g}-{stamp}.json"
    written = results.write(out, path)
    print(f"[eval] results written to {written}")
    if args.check_lossless and not all(r.get("lossless", True) for w in per_workload.values() for r in w.get("batched", [])):
        print("[eval] --check-lossless FAILED: batched greedy output differs from batch-1 target-only output", file=sys.stderr)
        return EvalRun(out, Path(written), passed=False)
    if args.check_lossless and not out["lossless"]["passed"]:
        print("[eval] --check-lossless FAILED: speculative greedy output differs from target-only output", file=sys.stderr)
        return EvalRun(out, Path(written), passed=False)
    if args.check_lossless and out["lossless"].get("near_ties"):
        print(f"[eval] --check-lossless: {len(out['lossless']['near_ties'])} prompt(s) diverged at a numerical near-tie "
              f"of the {weights_dtype} target (not a failure; --verify-dtype float32 verifies in float32)")
    return EvalRun(out, Path(written), passed=True)


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
