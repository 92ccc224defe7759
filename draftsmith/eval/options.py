"""Every option of `draftsmith eval`, declared once: each EvalOptions field is one flag (core/flags.py), with
its name, type, default and help, so adding an eval option is one edit here; the n-gram and llama.cpp options
sit in their own groups (NgramOptions, LlamacppOptions), flat on the command line. `check_args` refuses
out-of-range values with one line naming the flag and the fix, before anything loads."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from draftsmith.core.errors import UserError
from draftsmith.core.files import check_output_file
from draftsmith.core.flags import add_flags, flag, from_namespace, group
from draftsmith.eval.proposers import PROPOSERS
from draftsmith.eval.workloads import GROUPS, PROMPT_FORMATS, WORKLOADS


def _workloads_help() -> str:
    return f"comma-separated: {', '.join(sorted(set(WORKLOADS.names()) | set(GROUPS)))}, jsonl:PATH"


@dataclass(frozen=True)
class NgramOptions:
    """Prompt lookup: the n-gram proposer's options (--proposer ngram, or the lookup --ngram-first puts in front of
    a checkpoint's drafter); each field is its flag, named apart: `ngram.max` is --ngram-max."""

    max: int = flag(3, name="ngram_max", help="ngram proposer: longest n-gram matched")
    min: int = flag(1, name="ngram_min", help="ngram proposer: shortest n-gram matched")
    match: str = flag("first", name="ngram_match", choices=["first", "last"], help="ngram: earliest or latest match")
    first: bool = flag(False, name="ngram_first",
                       help="with a checkpoint PATH: prompt lookup (--ngram-max/--ngram-min/--ngram-match) drafts "
                            "every round where it finds a match, the checkpoint's drafter only the rounds where it "
                            "finds none (chains)")
    drafter_k: Optional[int] = flag(None, help="--ngram-first: the drafter's rounds draft at most this many tokens, the "
                                               "lookup's up to --k (default: --k for both; a long copy costs nothing to draft)")

    def lookup(self) -> dict:
        """The n-gram proposer's keywords (NgramProposer's, and the results' record of the lookup)."""
        return {"max_ngram": self.max, "min_ngram": self.min, "match": self.match}


@dataclass(frozen=True)
class LlamacppOptions:
    """What `--engine llama.cpp` serves and how (commands/eval_engine.py); each field is its flag, named apart:
    `llamacpp.threads` is --engine-threads."""

    export: Optional[str] = flag(None, name="engine_export", metavar="DIR",
                                 help="--engine: a `draftsmith export --to llama.cpp` directory (default: export into "
                                      "a temp dir)")
    target_gguf: Optional[str] = flag(None, help="--engine: the target's GGUF (default: converted by the export)")
    threads: int = flag(1, name="engine_threads", help="--engine: threads of each llama-server (1: ggml's spinning "
                                                       "threads lose badly on a busy 2-core machine)")
    compare: str = flag("", name="engine_compare", metavar="TYPES",
                        help="--engine: also serve llama.cpp's own proposers on the same prompts, each against the "
                             "same target-only server: comma-separated --spec-type values (ngram-simple, ngram-map-k, "
                             "ngram-map-k4v, ngram-mod, ngram-cache), `draft+T` for the drafter chained with T "
                             "(llama.cpp tries T first), or `ngram` for all five and their chains")


@dataclass
class EvalOptions:
    """Every option of `draftsmith eval`, typed; each field is its flag (the field's default is the flag's), the
    n-gram and llama.cpp ones in their groups: run(EvalOptions(path="runs/x/final", workloads="mt_bench", k=4,
    ngram=NgramOptions(first=True)))."""

    path: Optional[str] = flag(None, positional=True, nargs="?",
                               help="a training checkpoint dir (runs/NAME/final); omit with --proposer/--draft-model")
    target: Optional[str] = flag(None, help="target dir, HF id, .gguf file, installed:NAME or builtin:NAME (required "
                                            "without a checkpoint PATH; with one, the checkpoint runs on this copy "
                                            "after its fingerprint check)")
    revision: Optional[str] = flag(None, help="Hub revision (branch, tag or commit) of --target")
    gguf_file: Optional[str] = flag(None, help="the GGUF file inside a --target directory holding several "
                                               "(a .gguf --target names it already)")
    draft_model: Optional[str] = flag(None, help="a HF causal LM (dir or id) sharing the target's tokenizer, as the drafter")
    draft_revision: Optional[str] = flag(None, help="Hub revision (branch, tag or commit) of --draft-model")
    trust_remote_code: bool = flag(False, help="run the models' custom modelling code (never enabled by a checkpoint's "
                                               "config.yaml)")
    proposer: Optional[str] = flag(None, choices=lambda: sorted(PROPOSERS.names()),
                                   help="proposer kind without a checkpoint (default: draft_lm with --draft-model)")
    ngram: NgramOptions = group(NgramOptions)
    workloads: str = flag("spec_bench", help=_workloads_help)
    k: int = flag(5, help="draft tokens per round (chain drafting), 1..64 (k = 0, target-only decoding, is the baseline "
                          "every run measures)")
    tree: Optional[str] = flag(None, choices=["dynamic", "static"],
                               help="tree drafting: dynamic = EAGLE-2 expand + rerank; static = Medusa sparse tree (eval/tree.py)")
    tree_depth: int = flag(5, help="--tree: deepest draft position")
    tree_topk: int = flag(4, help="--tree: children per expanded node (static: ranks per depth)")
    verify_budget: int = flag(16, help="--tree: draft nodes verified per round")
    tree_calibrate: Optional[str] = flag(None, metavar="WORKLOAD",
                                         help="--tree static: build the sparse tree from per-position top-k acceptance "
                                              "measured on --num-prompts prompts of WORKLOAD (default: a stated prior); "
                                              "use prompts you do not evaluate on")
    batch_size: Optional[int] = flag(None, help="also decode B requests together (batched rounds; chain drafting) and "
                                                "report tokens/s, TPOT, speedup")
    concurrency_sweep: Optional[str] = flag(None, help="comma-separated batch sizes, e.g. 1,2,4,8,16,32")
    temperature: float = flag(0.0, help="0: greedy verification; > 0: exact stochastic")
    top_k: int = flag(0)
    top_p: float = flag(1.0)
    max_new_tokens: int = flag(128)
    num_prompts: int = flag(10, help="per workload (0: all)")
    warmup: int = flag(1, help="prompts run untimed before each workload")
    repeats: int = flag(3, help="timed runs per prompt and mode (>= 3); the run with the median latency is kept")
    seed: int = flag(0)
    check_lossless: bool = flag(False, help="greedy speculative output must equal target-only greedy output on every "
                                            "prompt; a divergence at a numerical near-tie (top-2 margin within one step "
                                            "of the dtype, in both passes) is reported and counted apart, a real "
                                            "mismatch fails (docs/eval.md)")
    near_tie_steps: float = flag(2.0, help="--check-lossless: a divergence where the target's top-2 margin is within "
                                           "this many steps of the logits' dtype in both passes is a numerical near-tie, "
                                           "not a failure (0: only exact ties)")
    verify_dtype: Optional[str] = flag(None, choices=["float32"],
                                       help="run every verification forward (all layers, final norm, lm_head) in this "
                                            "dtype on an exact upcast of the loaded weights, in the speculative and the "
                                            "target-only pass: greedy equality for bf16/fp16 targets, at float32 speed")
    data_dir: Optional[Path] = flag(None, help="workload data (default ../shared/data or $DRAFTSMITH_DATA)")
    prompt_format: str = flag("auto", choices=PROMPT_FORMATS,
                              help="auto: a checkpoint's training format (its recipe's chat template or draftsmith's "
                                   "plain chat format; raw for text-trained drafters); other proposers: the chat "
                                   "template if the tokenizer has one, else raw text")
    dtype: Optional[str] = flag(None, help="target dtype: float32, bfloat16 or float16 (default float32, or the "
                                           "checkpoint's target.dtype); results record the dtype used")
    device: str = flag("auto")
    out: Optional[Path] = flag(None, help="results JSON path (default results/<name>-<time>.json)")
    # `draftsmith eval --engine` runs commands/eval_engine.py, which runs draftsmith's side and the engine's
    engine: Optional[str] = flag(None, choices=["llama.cpp"],
                                 help="train-to-serve parity: also serve the drafter in this engine on the same prompts "
                                      "(commands/eval_engine.py)")
    llamacpp: LlamacppOptions = group(LlamacppOptions)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EvalOptions":
        return from_namespace(cls, args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flags(p, EvalOptions)


def short_int(value: int) -> str:
    """An integer flag in a message: 400 digits are shown as their count."""
    return f"(an integer of {len(str(abs(value)))} digits)" if abs(value) > 10**30 else str(value)


def check_args(args: EvalOptions) -> None:
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
                (not 0 <= args.seed < 2**32, f"--seed {short_int(args.seed)}: must lie in [0, 2**32)"),
                (not math.isfinite(args.near_tie_steps) or args.near_tie_steps < 0,
                 f"--near-tie-steps {args.near_tie_steps}: must be a finite number >= 0"),
                (finite and args.temperature < 0, f"--temperature {args.temperature}: must be >= 0 (0: greedy)"),
                (args.top_k < 0, f"--top-k {args.top_k}: must be >= 0 (0: off)"),
                (finite and not 0.0 < args.top_p <= 1.0, f"--top-p {args.top_p}: must lie in (0, 1] (1: off)"),
                (args.batch_size is not None and args.batch_size < 1, f"--batch-size {args.batch_size}: must be >= 1"),
                (args.ngram.first and not args.path,
                 "--ngram-first puts a checkpoint's drafter behind prompt lookup: give the checkpoint PATH "
                 "(for prompt lookup alone use --proposer ngram)"),
                (args.ngram.first and bool(args.tree), "--ngram-first drafts chains: drop --tree"),
                (args.ngram.drafter_k is not None and not args.ngram.first,
                 f"--drafter-k {args.ngram.drafter_k}: caps the drafter's rounds behind prompt lookup; add --ngram-first, "
                 "or set --k for a drafter alone"),
                (args.ngram.drafter_k is not None and not 1 <= args.ngram.drafter_k <= args.k,
                 f"--drafter-k {args.ngram.drafter_k}: must lie in 1..--k ({args.k}): with --ngram-first the lookup "
                 "drafts up to --k"),
                (not [w for w in args.workloads.split(",") if w.strip()],
                 f"--workloads {args.workloads!r}: names no workload; give e.g. --workloads spec_bench,mt_bench"),
                (args.dtype is not None and args.dtype not in DTYPES,
                 f"--dtype {args.dtype!r}: choose one of {', '.join(DTYPES)}")]
    llamacpp = args.llamacpp
    engine_only = [name for name, given in (("--engine-export", llamacpp.export), ("--target-gguf", llamacpp.target_gguf),
                                            ("--engine-threads", llamacpp.threads != 1),
                                            ("--engine-compare", llamacpp.compare)) if given]
    problems.append((bool(engine_only) and not args.engine,
                     f"{' and '.join(engine_only)} set up the engine run: add --engine llama.cpp, or drop "
                     f"{'them' if len(engine_only) > 1 else 'it'}"))
    for bad, message in problems:
        if bad:
            raise UserError(message)
    bounds.check_count(args.repeats, "--repeats", bounds.MAX_REPEATS, minimum=3)
    bounds.check_count(args.warmup, "--warmup", bounds.MAX_REPEATS, minimum=0)
    if args.tree:
        bounds.check_tree(args.tree_depth, args.tree_topk, args.verify_budget)
    elif args.k == 0:
        raise UserError("--k 0: target-only decoding against itself measures nothing (every eval already runs k = 0 "
                        "as the baseline of its speedup); give --k >= 1")
    else:
        bounds.check_draft_tokens(args.k, "--k")
    if args.batch_size is not None:
        bounds.check_batch_sizes(args.batch_size, "--batch-size")
    resolve_device(args.device)  # --device cuda without CUDA: one line now, not after loading the target
    if args.out is not None:
        check_output_file(args.out, "--out")  # a device node, FIFO or socket: refused before anything loads
        refuse_out_in_a_checkpoint(Path(args.out))


def refuse_out_in_a_checkpoint(out: Path) -> None:
    """--out must not write into a checkpoint or an export (eval --out CKPT/config.yaml breaks it)."""
    resolved = out.expanduser().resolve()
    for folder in (resolved, *resolved.parents):
        for marker, what in (("drafter.json", "checkpoint"), ("draftsmith.json", "draftsmith export")):
            if (folder / marker).is_file():
                raise UserError(f"--out {out}: lies inside the {what} {folder} (it holds {marker}); write results "
                                "elsewhere, e.g. --out results/NAME.json")
