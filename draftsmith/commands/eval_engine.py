"""`draftsmith eval CKPT --engine llama.cpp`: train-to-serve parity (the counting and the verdict are in
eval/engine.py; this module runs both sides, so it sits above eval/ and export/).

    draftsmith eval runs/eagle3-stories260k/final --engine llama.cpp --workloads mt_bench --k 3 \
        [--engine-export exported/llamacpp] [--target-gguf F.gguf] [--engine-threads 2]

draftsmith/cli.py hands `eval --engine` here; the flags are EvalOptions' (eval_options.py), and the results'
identity and config are built by eval_results.py, as for `draftsmith eval`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

from draftsmith.eval import proposers, results, workloads
from draftsmith.eval.engine import TOLERANCE, compare_setups, compare_workload, draftsmith_side, engine_request
from draftsmith.eval.options import EvalOptions, short_int
from draftsmith.eval.records import checkpoint_identity, command_line, results_config, write_results
from draftsmith.export.llamacpp.layouts import engine_drafter_options, gguf_problems
from draftsmith.report.parity import parity_lines


def engine_side(tools, files: dict, prompts: list, k: int, max_new_tokens: int, threads: int,
                setups: list[dict] = ()) -> tuple[list, list, dict]:
    """All llama-servers up at once, requests interleaved (the order rotates per prompt) ->
    (speculative replies, target-only replies, {--engine-compare name: replies})."""
    from draftsmith.export.llamacpp.tools import LlamaServer

    ids = [p.reshape(-1).tolist() for p in prompts]
    bound = 2 * len(ids) + 2  # every prompt once per server, plus one warm-up each
    target, draft = Path(files["target"]), Path(files["draft"])
    servers = {"spec": LlamaServer(tools, target, draft=draft, spec_type=files["spec_type"], k=k, threads=threads,
                                   max_requests=bound),
               "base": LlamaServer(tools, target, threads=threads, max_requests=bound)}
    for s in setups:
        servers[s["name"]] = LlamaServer(tools, target, draft=draft if s["draft"] else None, spec_type=s["spec_type"],
                                         k=k, threads=threads, max_requests=bound)
    replies = serve_interleaved(servers, ids, max_new_tokens)
    spec, base = replies.pop("spec"), replies.pop("base")
    return spec, base, replies


def serve_interleaved(servers: dict, ids: list[list[int]], max_new_tokens: int) -> dict[str, list[dict]]:
    """Start every LlamaServer, warm each up with the first prompt (untimed), then send each prompt to every
    server, the order rotating per prompt (no server always goes first) -> {name: engine_request dicts}."""
    replies = {name: [] for name in servers}
    with contextlib.ExitStack() as stack:
        for srv in servers.values():
            stack.enter_context(srv)
        for srv in servers.values():
            srv.complete(ids[0], max_new_tokens)
        names = list(servers)
        for i, prompt in enumerate(ids):
            for name in names[i % len(names):] + names[:i % len(names)]:
                replies[name].append(engine_request(servers[name].complete(prompt, max_new_tokens), len(prompt)))
    return replies


def apply_engine_rules(drafter) -> dict:
    """Set the drafter options under which draftsmith's loop applies the rule llama.cpp applies
    (the llama.cpp layout's engine_drafter_options: DSpark's whole block, as --spec-draft-p-min 0); what changed."""
    changed = {}
    for option, value in engine_drafter_options(drafter.kind).items():
        before = getattr(drafter.cfg, option)
        if before != value:
            setattr(drafter.cfg, option, value)
            changed[option] = {"trained": before, "compared": value}
            print(f"[eval --engine llama.cpp] draftsmith's side runs drafter.{option}={value} (trained {before}): "
                  f"llama.cpp's {drafter.kind} with --spec-draft-p-min 0 sends every slot of the block", flush=True)
    return changed


# ---------------------------------------------------------------- `draftsmith eval CKPT --engine llama.cpp`

def check_engine_args(args: EvalOptions) -> None:
    from draftsmith.core.errors import UserError
    from draftsmith.core.files import refuse_special_file

    problems = [(not args.path, "--engine llama.cpp needs a checkpoint PATH (the drafter to serve)"),
                (args.temperature != 0, f"--engine llama.cpp compares greedy decoding; drop --temperature {args.temperature}"),
                (args.tree is not None, "--engine llama.cpp drafts chains (--spec-draft-n-max); drop --tree"),
                (bool(args.batch_size or args.concurrency_sweep), "--engine llama.cpp runs batch 1; drop --batch-size / "
                                                                  "--concurrency-sweep"),
                (args.k < 1, f"--k {args.k}: --engine llama.cpp needs k >= 1"),
                (args.ngram.first,
                 "--ngram-first runs in draftsmith's loop only (no engine serves it): drop --engine or --ngram-first"),
                (args.ngram.drafter_k is not None,
                 "--drafter-k caps a drafter behind --ngram-first, which no engine serves: drop --engine or --drafter-k"),
                (args.llamacpp.threads < 1, f"--engine-threads {args.llamacpp.threads}: must be >= 1"),
                (not 0 <= args.seed < 2**32, f"--seed {short_int(args.seed)}: must lie in [0, 2**32)")]
    for bad, message in problems:
        if bad:
            raise UserError(message)
    if args.llamacpp.target_gguf:  # a FIFO, device or directory was called "no such file"
        refuse_special_file(args.llamacpp.target_gguf, "--target-gguf")


def engine_files(args: EvalOptions, loaded, work: Path) -> dict:
    """The GGUF files to serve: --engine-export DIR, else a fresh --to llama.cpp export into `work`."""
    from draftsmith.core.errors import UserError
    from draftsmith.export.llamacpp.layouts import export_llamacpp, layout_of, read_export_dir

    llamacpp = args.llamacpp
    if llamacpp.export:
        side = read_export_dir(llamacpp.export)
        if side["drafter_kind"] != loaded.drafter.kind:
            raise UserError(f"--engine-export {llamacpp.export} holds a {side['drafter_kind'][:40]} drafter, the "
                            f"checkpoint a {loaded.drafter.kind}; export this checkpoint with --to llama.cpp")
        expected = layout_of(loaded.drafter.kind).spec_type
        if side["spec_type"] != expected:
            raise UserError(f"--engine-export {llamacpp.export}: draftsmith.json says spec_type "
                            f"{side['spec_type'][:40]!r}, a {loaded.drafter.kind} export serves as {expected!r}; "
                            "export this checkpoint again with --to llama.cpp")
        if llamacpp.target_gguf:
            side["target"] = str(Path(llamacpp.target_gguf).resolve())
        return side
    result = export_llamacpp(args.path, work / "llamacpp", target_gguf=llamacpp.target_gguf, k=args.k, loaded=loaded)
    return {"draft": str(result.draft), "target": str(result.target), "spec_type": result.spec_type,
            "exported_to": "a temporary directory (pass --engine-export DIR to keep one)"}


def main(args) -> int:
    """`draftsmith eval CKPT --engine llama.cpp` (args: the parsed flags, or an EvalOptions); 1 when
    --check-lossless finds llama.cpp's output with the drafter differing from its output without."""
    return run(args if isinstance(args, EvalOptions) else EvalOptions.from_args(args))


def run(args: EvalOptions) -> int:
    """Run both sides per workload, print the comparison, write the results JSON (`engine` keys)."""
    from draftsmith.checkpoint import load_drafter
    from draftsmith.core.errors import UserError
    from draftsmith.export.llamacpp.layouts import check_k, refusal
    from draftsmith.export.llamacpp.tools import find_llama_cpp

    check_engine_args(args)
    loaded = load_drafter(args.path, trust_remote_code=args.trust_remote_code)
    why = refusal(loaded)
    if why:
        raise UserError(why.replace("--to llama.cpp", "--engine llama.cpp"))
    check_k(loaded.drafter, args.k)
    compare_setups(args.llamacpp.compare, "draft")  # a bad --engine-compare fails here, before any decoding
    tools = find_llama_cpp()
    target, drafter = loaded.target, loaded.drafter
    applied = apply_engine_rules(drafter)
    recipe = workloads.checkpoint_recipe(args.path)
    prompt_format = args.prompt_format
    if prompt_format == "auto":
        prompt_format = workloads.training_prompt_format(recipe, target.tokenizer)
    names = workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()])
    proposer = proposers.from_drafter(drafter, target)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="draftsmith-engine-") as work:
        files = engine_files(args, loaded, Path(work))
        problems = gguf_problems(Path(files["draft"]), drafter)  # what llama.cpp reads differently
        setups = compare_setups(args.llamacpp.compare, files["spec_type"])
        per_workload = {name: compare_on_workload(args, tools, files, target, proposer, name, prompt_format, problems,
                                                  setups)
                        for name in names}
    config = engine_results_config(args, target, prompt_format, names, recipe)
    config["engine"] = {"name": "llama.cpp", "version": tools.version(), "server": str(tools.server),
                        "spec_type": files["spec_type"], "threads": args.llamacpp.threads,
                        "draft_gguf": files["draft"], "target_gguf": files["target"],
                        "gguf_problems": problems, "draftsmith_drafter_options": applied,
                        "compare": setups}
    identity = checkpoint_identity(loaded, args.path)
    out = results.build(command_line("draftsmith eval --engine llama.cpp (function call)"), config, target.identity(),
                        identity, target.device, per_workload, True)
    print(f"train-to-serve parity ({drafter.kind} on {target.identity().get('name')}, k={args.k}, greedy, "
          f"{args.max_new_tokens} tokens; llama.cpp {files['spec_type']}, tolerance {TOLERANCE:.0%}):")
    for name, section in per_workload.items():
        for line in parity_lines(name, section["engine"]):
            print(line)
    write_results(out, args.out, f"{drafter.kind}-k{args.k}-llamacpp")
    unequal = [n for n, w in per_workload.items() if w["engine"]["output_equals_target_only"] != w["num_requests"]]
    if args.check_lossless and unequal:
        print(f"[eval] --check-lossless FAILED: llama.cpp's output with the drafter differs from its output without "
              f"on {', '.join(unequal)}", file=sys.stderr)
        return 1
    return 0


def engine_results_config(args: EvalOptions, target, prompt_format: str, names: list, recipe) -> dict:
    """The results `config` of an engine comparison: eval's, under the settings both sides run (greedy, batch 1,
    one untimed warm-up and one timed request per prompt, EOS ignored, verification in the weights' dtype)."""
    compared = dataclasses.replace(args, temperature=0.0, top_k=0, top_p=1.0, warmup=1, repeats=1, verify_dtype=None)
    config = results_config(compared, weights_dtype=str(target.dtype).removeprefix("torch."), device=str(target.device),
                            eos_ids=[], prompt_format=prompt_format, names=names, recipe=recipe)
    config["eos_ignored"] = True
    return config


def compare_on_workload(args: EvalOptions, tools, files: dict, target, proposer, name: str, prompt_format: str,
                        problems: list, setups: list[dict] = ()) -> dict:
    """One workload through draftsmith's loop and llama.cpp's servers: its results section (`engine` inside)."""
    limit = getattr(target.config, "max_position_embeddings", None)
    max_prompt = None if limit is None else limit - args.max_new_tokens
    items = workloads.load(name, args.data_dir, args.num_prompts or None)
    encoded = [workloads.encode(item, target.tokenizer, prompt_format, max_prompt) for item in items]
    prompts = [ids for ids, _ in encoded]
    print(f"[eval --engine llama.cpp] {name}: {len(prompts)} prompts, k={args.k}, "
          f"{args.max_new_tokens} tokens each (greedy, EOS ignored) ...", flush=True)
    ds_requests, ds_base = draftsmith_side(target, proposer, prompts, args.k, args.max_new_tokens)
    spec, base, others = engine_side(tools, files, prompts, args.k, args.max_new_tokens, args.llamacpp.threads,
                                      setups)
    section, aggregate = compare_workload(ds_requests, ds_base, spec, base, args.k, problems, others)
    mismatches = []
    for item, r, (_, truncated) in zip(items, ds_requests, encoded):
        r.pop("_costs", None)
        r["id"], r["prompt_truncated"] = item["id"], truncated
        mismatch = r.pop("_mismatch")
        if mismatch:
            mismatches.append({"id": item["id"], **mismatch})
    return {"num_requests": len(prompts), "num_truncated_prompts": sum(t for _, t in encoded),
            "aggregate": aggregate, "lossless_mismatches": mismatches, "requests": ds_requests, "engine": section}
