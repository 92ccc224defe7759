"""Train-to-serve parity: the same drafter in draftsmith's loop and in a real engine (llama.cpp),
on the same prompts, side by side.

    draftsmith eval runs/eagle3-stories260k/final --engine llama.cpp --workloads mt_bench --k 3 \
        [--engine-export exported/llamacpp] [--target-gguf F.gguf] [--engine-threads 2]

Per workload:
  1. draftsmith: each prompt (token ids encoded exactly as `draftsmith eval` does, in the drafter's
     training prompt format) speculative at k and target-only, greedy, exactly max_new_tokens new
     tokens (EOS ignored on both sides, so both decode the same number of tokens).
  2. llama.cpp: two llama-servers on 127.0.0.1 (target + drafter with --spec-draft-n-max k, and the
     target alone), the same token ids as the prompt, greedy, n_predict = max_new_tokens, ignore_eos;
     requests interleaved (the order alternates per prompt) after one warm-up request each.
  3. Engine tau, counted as draftsmith counts: the first token comes from the prompt pass and belongs
     to no round; every later target forward (a round) commits its accepted drafts + 1, so
       rounds = tokens_predicted - 1 - draft_n_accepted,   tau = (tokens_predicted - 1) / rounds
     (tools/server/server-context.cpp: each decode step drafts at most min(k, remaining - 1) tokens and
     adds accepted + 1 to n_decoded; timings.draft_n_accepted sums the accepted drafts).
  4. Verdict: engine tau within TOLERANCE of draftsmith's tau -> "agree"; otherwise "disagree" with the
     likely causes, narrowed by what was checked (same prompt length, same target-only output, the
     draft GGUF's metadata against the drafter's options).
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

TOLERANCE = 0.05  # |engine tau / draftsmith tau - 1| within this: agree (the issue's 5 %)

CAUSES_TARGET = ("prompt format or tokenization (the engine counted a different prompt length)",
                 "the engine's target decodes differently (GGUF conversion of the target, its rope or norms, "
                 "or near-tie numerics of a different kernel)")
CAUSES_DRAFTER = ("aux ids (the draft GGUF's extract_layers against drafter.aux_layer_ids)",
                  "norms (norm_before_residual, hidden_norm / input_layernorm placement)",
                  "rope (the draft layer's rope_theta / scaling in the GGUF)",
                  "vocabulary mapping (d2t offsets, a reduced draft vocabulary)",
                  "chat template or prompt format the drafter was trained with (both sides got the same ids here)")


# ---------------------------------------------------------------- engine accounting (unit-tested)

def engine_request(reply: dict, prompt_len: int) -> dict:
    """One llama-server /completion reply -> draftsmith's counts (see step 3 of the module doc)."""
    timings = reply.get("timings") or {}
    new = int(reply["tokens_predicted"])
    accepted = int(timings.get("draft_n_accepted", 0) or 0)
    drafted = int(timings.get("draft_n", 0) or 0)
    rounds = max(new - 1 - accepted, 0)
    if new > 1 and rounds == 0:
        raise ValueError(f"llama-server reported {accepted} accepted drafts for {new} tokens: more than a round "
                         "can commit; the reply is not one request's")
    return {"new_tokens": new, "accepted": accepted, "proposed": drafted, "rounds": rounds,
            "committed": max(new - 1, 0),
            "acceptance_length": (new - 1) / rounds if rounds else float("nan"),
            "tokens": [int(t) for t in reply.get("tokens") or []],
            "prompt_tokens": int(reply.get("tokens_evaluated", prompt_len)), "prompt_tokens_sent": prompt_len,
            "decode_tokens_per_s": float(timings.get("predicted_per_second") or float("nan")),
            "decode_ms": float(timings.get("predicted_ms") or float("nan"))}


def pool(requests: list[dict]) -> dict:
    """Workload numbers from engine_request dicts: pooled tau (sum committed / sum rounds) and alpha."""
    rounds = sum(r["rounds"] for r in requests)
    proposed = sum(r["proposed"] for r in requests)
    taus = [r["acceptance_length"] for r in requests if r["acceptance_length"] == r["acceptance_length"]]
    return {"acceptance_length": sum(r["committed"] for r in requests) / rounds if rounds else float("nan"),
            "acceptance_length_mean": statistics.fmean(taus) if taus else float("nan"),
            "acceptance_rate": sum(r["accepted"] for r in requests) / proposed if proposed else float("nan"),
            "draft_n": proposed, "draft_n_accepted": sum(r["accepted"] for r in requests), "rounds": rounds,
            "new_tokens": sum(r["new_tokens"] for r in requests)}


def verdict(draftsmith_tau: float, engine_tau: float, prompt_lengths_match: bool, target_outputs_agree: bool,
            gguf_problems: list[str]) -> dict:
    """agree / disagree (beyond TOLERANCE) and the likely causes, narrowed by the checks made."""
    gap = engine_tau / draftsmith_tau - 1.0 if draftsmith_tau and math.isfinite(engine_tau) else float("nan")
    if math.isfinite(gap) and abs(gap) <= TOLERANCE:
        return {"gap": gap, "verdict": "agree", "likely_causes": []}
    causes = list(gguf_problems)
    if not prompt_lengths_match:
        causes.append(CAUSES_TARGET[0])
    if not target_outputs_agree:
        causes.append(CAUSES_TARGET[1])
    if not causes:  # the target side checks out: the drafter is read differently
        causes.extend(CAUSES_DRAFTER)
    return {"gap": gap, "verdict": "disagree", "likely_causes": causes}


def gguf_problems(draft_gguf: Path, drafter) -> list[str]:
    """The draft GGUF's EAGLE-3 metadata against the trained drafter's options (via the gguf package)."""
    if drafter.kind != "eagle3":
        return []
    from gguf import GGUFReader

    reader = GGUFReader(str(draft_gguf))
    fields = {name: f.contents() for name, f in reader.fields.items() if name.startswith("eagle3.")}
    problems = []
    layers = next((v for k, v in fields.items() if k.endswith(".target_layers") or k.endswith(".extract_layers")), None)
    if layers is not None and list(layers) != list(drafter.aux_layer_ids):
        problems.append(f"aux ids: the draft GGUF extracts target layers {list(layers)}, the drafter was trained on "
                        f"{list(drafter.aux_layer_ids)}")
    nbr = fields.get("eagle3.norm_before_residual")
    if nbr is not None and bool(nbr) != bool(drafter.cfg.norm_before_residual):
        problems.append(f"norms: the draft GGUF has norm_before_residual={bool(nbr)}, the drafter was trained with "
                        f"{bool(drafter.cfg.norm_before_residual)}")
    return problems


def spread(values: list[float]) -> dict:
    from draftsmith.eval.metrics import spread as _spread

    return _spread([v for v in values if v == v])


# ---------------------------------------------------------------- the two sides

def draftsmith_side(target, proposer, prompts: list, k: int, max_new_tokens: int) -> tuple[list[dict], list[list[int]]]:
    """draftsmith's loop on the prompts, greedy, EOS ignored -> (request metrics, target-only outputs)."""
    from draftsmith.eval import metrics
    from draftsmith.eval.loop import LoopConfig, generate
    from draftsmith.eval.runner import first_difference
    from draftsmith.sampling import SamplingParams

    requests, base_tokens = [], []
    for ids in prompts:
        spec = generate(target, proposer, ids, LoopConfig(k=k, max_new_tokens=max_new_tokens, sampling=SamplingParams(),
                                                          eos_ids=[]))
        base = generate(target, None, ids, LoopConfig(k=0, max_new_tokens=max_new_tokens, sampling=SamplingParams(),
                                                      eos_ids=[]))
        req = metrics.request_metrics(spec, base, k)
        req["lossless"] = spec.tokens == base.tokens
        pos = first_difference(spec.tokens, base.tokens)
        req["_mismatch"] = None if pos is None else {
            "position": pos, "spec_token": spec.tokens[pos] if pos < len(spec.tokens) else None,
            "target_token": base.tokens[pos] if pos < len(base.tokens) else None}
        requests.append(req)
        base_tokens.append(base.tokens)
    return requests, base_tokens


def engine_side(tools, files: dict, prompts: list, k: int, max_new_tokens: int, threads: int) -> tuple[list, list]:
    """Both llama-servers up at once, requests interleaved -> (speculative replies, target-only replies)."""
    from draftsmith.export.llamacpp_tools import LlamaServer

    ids = [p.reshape(-1).tolist() for p in prompts]
    bound = 2 * len(ids) + 2  # every prompt once per server, plus one warm-up each
    spec_srv = LlamaServer(tools, Path(files["target"]), draft=Path(files["draft"]), spec_type=files["spec_type"], k=k,
                           threads=threads, max_requests=bound)
    base_srv = LlamaServer(tools, Path(files["target"]), threads=threads, max_requests=bound)
    spec, base = [], []
    with spec_srv, base_srv:
        spec_srv.complete(ids[0], max_new_tokens)  # warm-up, untimed
        base_srv.complete(ids[0], max_new_tokens)
        for i, prompt in enumerate(ids):
            order = (spec_srv, base_srv) if i % 2 else (base_srv, spec_srv)
            for srv in order:
                reply = engine_request(srv.complete(prompt, max_new_tokens), len(prompt))
                (spec if srv is spec_srv else base).append(reply)
    return spec, base


def compare_workload(ds_requests: list[dict], ds_base: list[list[int]], spec: list[dict], base: list[dict],
                     k: int, problems: list[str]) -> tuple[dict, dict]:
    """(the workload's `engine` section of the results JSON, draftsmith's aggregate)."""
    from draftsmith.eval import metrics

    ds = metrics.aggregate([{**r, "_costs": r.get("_costs", {})} for r in ds_requests], k)
    ds_tau = ds["acceptance_length"]["pooled"]
    eng = pool(spec)
    equal = [s["tokens"] == b["tokens"] for s, b in zip(spec, base)]
    agree_target = [b["tokens"] == t for b, t in zip(base, ds_base)]
    lengths = all(r["prompt_tokens"] == r["prompt_tokens_sent"] for r in spec + base)
    speedups = [s["decode_tokens_per_s"] / b["decode_tokens_per_s"] for s, b in zip(spec, base)
                if b["decode_tokens_per_s"] and b["decode_tokens_per_s"] == b["decode_tokens_per_s"]]
    out = {
        "name": "llama.cpp", **eng,
        "draftsmith_acceptance_length": ds_tau, "draftsmith_acceptance_rate": ds["acceptance_rate"],
        "draftsmith_per_position_acceptance": ds["per_position_acceptance"],
        "decode_tokens_per_s": spread([s["decode_tokens_per_s"] for s in spec]),
        "target_decode_tokens_per_s": spread([b["decode_tokens_per_s"] for b in base]),
        "decode_speedup": spread(speedups),
        "output_equals_target_only": sum(equal), "num_requests": len(spec),
        "target_only_equals_draftsmith": sum(agree_target), "prompt_lengths_match": lengths,
        "requests": [{"acceptance_length": s["acceptance_length"], "accepted": s["accepted"], "proposed": s["proposed"],
                      "rounds": s["rounds"], "new_tokens": s["new_tokens"], "output_equals_target_only": e,
                      "draftsmith_acceptance_length": d["acceptance_length"]}
                     for s, e, d in zip(spec, equal, ds_requests)],
    }
    out.update(verdict(ds_tau, eng["acceptance_length"], lengths, all(agree_target), problems))
    return out, ds


def _f(x, spec: str = ".3f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def parity_lines(name: str, e: dict) -> list[str]:
    """The terminal lines of one workload's comparison (from the results JSON's `engine` section)."""
    pos = " ".join(_f(a, ".2f") for a in e["draftsmith_per_position_acceptance"])
    speed = e.get("decode_speedup") or {}
    pad = " " * len(name)
    lines = [f"  {name}: draftsmith tau {_f(e['draftsmith_acceptance_length'])} (alpha {_f(e['draftsmith_acceptance_rate'])}; "
             f"per position {pos}) | {e['name']} tau {_f(e['acceptance_length'])} (alpha {_f(e['acceptance_rate'])}; "
             f"{e['draft_n_accepted']}/{e['draft_n']} drafts) | gap {_f(e['gap'], '+.1%')} -> {e['verdict'].upper()}",
             f"  {pad}  {e['name']} decode speedup {_f(speed.get('median'), '.2f')}x median, {_f(speed.get('p90'), '.2f')}x "
             f"p90 | output with draft == without on {e['output_equals_target_only']}/{e['num_requests']} | "
             f"{e['name']} target-only == draftsmith target-only on {e['target_only_equals_draftsmith']}/{e['num_requests']}"]
    if e["verdict"] == "disagree":
        lines.append(f"  {pad}  likely causes: " + "; ".join(e["likely_causes"]))
    return lines


# ---------------------------------------------------------------- `draftsmith eval CKPT --engine llama.cpp`

def check_engine_args(args) -> None:
    from draftsmith.errors import UserError

    problems = [(not args.path, "--engine llama.cpp needs a checkpoint PATH (the drafter to serve)"),
                (args.temperature != 0, f"--engine llama.cpp compares greedy decoding; drop --temperature {args.temperature}"),
                (args.tree is not None, "--engine llama.cpp drafts chains (--spec-draft-n-max); drop --tree"),
                (bool(args.batch_size or args.concurrency_sweep), "--engine llama.cpp runs batch 1; drop --batch-size / "
                                                                  "--concurrency-sweep"),
                (args.k < 1, f"--k {args.k}: --engine llama.cpp needs k >= 1"),
                (args.engine_threads < 1, f"--engine-threads {args.engine_threads}: must be >= 1")]
    for bad, message in problems:
        if bad:
            raise UserError(message)


def engine_files(args, loaded, work: Path) -> dict:
    """The GGUF files to serve: --engine-export DIR, else a fresh --to llama.cpp export into `work`."""
    from draftsmith.errors import UserError
    from draftsmith.export.llamacpp import export_llamacpp, read_export_dir

    if args.engine_export:
        side = read_export_dir(args.engine_export)
        if side.get("drafter_kind") != loaded.drafter.kind:
            raise UserError(f"--engine-export {args.engine_export} holds a {side.get('drafter_kind')} drafter, the "
                            f"checkpoint a {loaded.drafter.kind}; export this checkpoint with --to llama.cpp")
        if args.target_gguf:
            side["target"] = str(Path(args.target_gguf).resolve())
        return side
    result = export_llamacpp(args.path, work / "llamacpp", target_gguf=args.target_gguf, k=args.k, loaded=loaded)
    return {"draft": str(result.draft), "target": str(result.target), "spec_type": result.spec_type,
            "exported_to": "a temporary directory (pass --engine-export DIR to keep one)"}


def main(args) -> int:
    """Run both sides per workload, print the comparison, write the results JSON (`engine` keys)."""
    import datetime as _dt
    import shlex
    import sys
    import tempfile

    import torch

    from draftsmith.checkpoint import load_drafter
    from draftsmith.errors import UserError
    from draftsmith.eval import proposers, results, workloads
    from draftsmith.export.llamacpp import refusal
    from draftsmith.export.llamacpp_tools import find_llama_cpp

    check_engine_args(args)
    loaded = load_drafter(args.path, trust_remote_code=args.trust_remote_code)
    why = refusal(loaded)
    if why:
        raise UserError(why.replace("--to llama.cpp", "--engine llama.cpp"))
    tools = find_llama_cpp()
    target, drafter = loaded.target, loaded.drafter
    recipe = workloads.checkpoint_recipe(args.path)
    prompt_format = args.prompt_format
    if prompt_format == "auto":
        prompt_format = workloads.training_prompt_format(recipe, target.tokenizer)
    names = workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()])
    proposer = proposers.from_drafter(drafter, target)
    limit = getattr(target.config, "max_position_embeddings", None)
    max_prompt = None if limit is None else limit - args.max_new_tokens
    torch.manual_seed(args.seed)
    per_workload, printed = {}, []
    with tempfile.TemporaryDirectory(prefix="draftsmith-engine-") as work:
        files = engine_files(args, loaded, Path(work))
        problems = gguf_problems(Path(files["draft"]), drafter)
        for name in names:
            items = workloads.load(name, args.data_dir, args.num_prompts or None)
            encoded = [workloads.encode(item, target.tokenizer, prompt_format, max_prompt) for item in items]
            prompts = [ids for ids, _ in encoded]
            print(f"[eval --engine llama.cpp] {name}: {len(prompts)} prompts, k={args.k}, "
                  f"{args.max_new_tokens} tokens each (greedy, EOS ignored) ...", flush=True)
            ds_requests, ds_base = draftsmith_side(target, proposer, prompts, args.k, args.max_new_tokens)
            spec, base = engine_side(tools, files, prompts, args.k, args.max_new_tokens, args.engine_threads)
            section, aggregate = compare_workload(ds_requests, ds_base, spec, base, args.k, problems)
            mismatches = []
            for item, r, (_, truncated) in zip(items, ds_requests, encoded):
                r.pop("_costs", None)
                r["id"], r["prompt_truncated"] = item["id"], truncated
                mismatch = r.pop("_mismatch")
                if mismatch:
                    mismatches.append({"id": item["id"], **mismatch})
            per_workload[name] = {"num_requests": len(prompts), "num_truncated_prompts": sum(t for _, t in encoded),
                                  "aggregate": aggregate, "lossless_mismatches": mismatches, "requests": ds_requests,
                                  "engine": section}
            printed += parity_lines(name, section)
    config = {"k": args.k, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": args.max_new_tokens,
              "num_prompts": args.num_prompts, "seed": args.seed, "warmup": 1, "repeats": 1,
              "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device), "verification": "greedy",
              "lossless_rule": True, "prompt_format": prompt_format, "eos_ids": [], "eos_ignored": True,
              "workloads": names, "first_turn_only": True, "tree": None, "verify_budget": args.k, "tree_budget": None,
              "batch_sizes": [], "recipe": recipe,
              "engine": {"name": "llama.cpp", "version": tools.version(), "server": str(tools.server),
                         "spec_type": files["spec_type"], "threads": args.engine_threads,
                         "draft_gguf": files["draft"], "target_gguf": files["target"],
                         "gguf_problems": problems}}
    identity = {"kind": drafter.kind, "name": Path(args.path).resolve().parent.name, "path": str(args.path),
                "fingerprint": results.module_fingerprint(drafter, drafter.state_dict_for_export()),
                "num_params": sum(t.numel() for t in drafter.state_dict_for_export().values()),
                "trainable_params": sum(p.numel() for p in drafter.trainable_parameters()), "training_log": None}
    command = "draftsmith eval " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["eval"] else \
        "draftsmith eval --engine llama.cpp (function call)"
    out = results.build(command, config, target.identity(), identity, target.device, per_workload, True)
    print(f"train-to-serve parity ({drafter.kind} on {target.identity().get('name')}, k={args.k}, greedy, "
          f"{args.max_new_tokens} tokens; llama.cpp {files['spec_type']}, tolerance {TOLERANCE:.0%}):")
    for line in printed:
        print(line)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.out or Path("results") / f"{drafter.kind}-k{args.k}-llamacpp-{stamp}.json"
    print(f"[eval] results written to {results.write(out, path)}")
    unequal = [n for n, w in per_workload.items() if w["engine"]["output_equals_target_only"] != w["num_requests"]]
    if args.check_lossless and unequal:
        print(f"[eval] --check-lossless FAILED: llama.cpp's output with the drafter differs from its output without "
              f"on {', '.join(unequal)}", file=sys.stderr)
        return 1
    return 0
