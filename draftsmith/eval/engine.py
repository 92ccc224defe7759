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
  3b. --engine-compare: llama.cpp's own proposers (the ngram spec types, llama.cpp's defaults) and the
     drafter chained with one (`--spec-type draft-eagle3,ngram-mod`: common/speculative.cpp tries the
     ngram types first and the drafter when they find nothing), each its own server in the same
     interleaving, each against the same target-only server: decode speedup, equal outputs, tau.
  4. Verdict: engine tau within TOLERANCE of draftsmith's tau -> "agree"; otherwise "disagree" with the
     likely causes, narrowed by what was checked (same prompt length, same target-only output, the
     draft GGUF's metadata against the drafter's options).
"""
from __future__ import annotations

import math
import statistics

from draftsmith.core.errors import UserError

TOLERANCE = 0.05  # |engine tau / draftsmith tau - 1| within this: agree (the 5 %)
# llama.cpp's draftless proposers (--spec-type values of the llama-cpp-python 0.3.36 build, common/arg.cpp)
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")

CAUSES_TARGET = ("prompt format or tokenization (the engine counted a different prompt length)",
                 "the engine's target decodes differently (GGUF conversion of the target, its rope or norms, "
                 "or near-tie numerics of a different kernel)")
CAUSES_DRAFTER = ("aux ids (the draft GGUF's extract_layers against drafter.aux_layer_ids)",
                  "norms (norm_before_residual, hidden_norm / input_layernorm placement)",
                  "rope (the draft layer's rope_theta / scaling in the GGUF)",
                  "vocabulary mapping (d2t offsets, a reduced draft vocabulary)",
                  "chat template or prompt format the drafter was trained with (both sides got the same ids here)")


# ---------------------------------------------------------------- engine accounting (unit-tested)

def compare_setups(text: str, draft_spec_type: str) -> list[dict]:
    """--engine-compare "ngram-mod,draft+ngram-mod" -> [{"name", "spec_type" (llama-server's value),
    "draft" (serve the drafter too)}], in the order given; `ngram` stands for every type alone and chained."""
    setups: list[dict] = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        names = [n for t in NGRAM_TYPES for n in (t, f"draft+{t}")] if item == "ngram" else [item]
        for name in names:
            ngram = name.removeprefix("draft+")
            if ngram not in NGRAM_TYPES:
                raise UserError(f"--engine-compare {item!r}: {ngram!r} is not one of llama.cpp's draftless spec types "
                                f"({', '.join(NGRAM_TYPES)}); chain the drafter with one as draft+TYPE, or give ngram")
            draft = name.startswith("draft+")
            if all(s["name"] != name for s in setups):
                setups.append({"name": name, "spec_type": f"{draft_spec_type},{ngram}" if draft else ngram,
                               "draft": draft})
    return setups


def speedups(spec: list[dict], base: list[dict]) -> list[float]:
    """Per prompt: decode tokens/s with the proposer over tokens/s of the same prompt without."""
    return [s["decode_tokens_per_s"] / b["decode_tokens_per_s"] for s, b in zip(spec, base)
            if b["decode_tokens_per_s"] and b["decode_tokens_per_s"] == b["decode_tokens_per_s"]]


def compare_section(replies: list[dict], base: list[dict]) -> dict:
    """One --engine-compare server's numbers against the target-only server on the same prompts."""
    return {**pool(replies), "decode_tokens_per_s": spread([r["decode_tokens_per_s"] for r in replies]),
            "decode_speedup": spread(speedups(replies, base)),
            "output_equals_target_only": sum(r["tokens"] == b["tokens"] for r, b in zip(replies, base)),
            "num_requests": len(replies)}


def engine_request(reply: dict, prompt_len: int) -> dict:
    """One llama-server /completion reply -> draftsmith's counts (see step 3 of the module doc)."""
    timings = reply.get("timings") or {}
    new = int(reply["tokens_predicted"])
    accepted = int(timings.get("draft_n_accepted", 0) or 0)
    drafted = int(timings.get("draft_n", 0) or 0)
    rounds = max(new - 1 - accepted, 0)
    if new > 1 and rounds == 0:
        raise UserError(f"llama-server reported {accepted} accepted drafts for {new} tokens: more than a round "
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


def spread(values: list[float]) -> dict:
    from draftsmith.eval.metrics import spread as _spread

    return _spread([v for v in values if v == v])


# ---------------------------------------------------------------- the two sides

def draftsmith_side(target, proposer, prompts: list, k: int, max_new_tokens: int) -> tuple[list[dict], list[list[int]]]:
    """draftsmith's loop on the prompts, greedy, EOS ignored -> (request metrics, target-only outputs)."""
    from draftsmith.core.sampling import SamplingParams
    from draftsmith.eval import metrics
    from draftsmith.eval.loop import LoopConfig, generate
    from draftsmith.eval.runner import first_difference

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


def compare_workload(ds_requests: list[dict], ds_base: list[list[int]], spec: list[dict], base: list[dict],
                     k: int, problems: list[str], others: dict | None = None) -> tuple[dict, dict]:
    """(the workload's `engine` section of the results JSON, draftsmith's aggregate)."""
    from draftsmith.eval import metrics

    ds = metrics.aggregate([{**r, "_costs": r.get("_costs", {})} for r in ds_requests], k)
    ds_tau = ds["acceptance_length"]["pooled"]
    eng = pool(spec)
    equal = [s["tokens"] == b["tokens"] for s, b in zip(spec, base)]
    agree_target = [b["tokens"] == t for b, t in zip(base, ds_base)]
    lengths = all(r["prompt_tokens"] == r["prompt_tokens_sent"] for r in spec + base)
    out = {
        "name": "llama.cpp", **eng,
        "draftsmith_acceptance_length": ds_tau, "draftsmith_acceptance_rate": ds["acceptance_rate"],
        "draftsmith_per_position_acceptance": ds["per_position_acceptance"],
        "decode_tokens_per_s": spread([s["decode_tokens_per_s"] for s in spec]),
        "target_decode_tokens_per_s": spread([b["decode_tokens_per_s"] for b in base]),
        "decode_speedup": spread(speedups(spec, base)),
        "output_equals_target_only": sum(equal), "num_requests": len(spec),
        "target_only_equals_draftsmith": sum(agree_target), "prompt_lengths_match": lengths,
        "requests": [{"acceptance_length": s["acceptance_length"], "accepted": s["accepted"], "proposed": s["proposed"],
                      "rounds": s["rounds"], "new_tokens": s["new_tokens"], "output_equals_target_only": e,
                      "draftsmith_acceptance_length": d["acceptance_length"]}
                     for s, e, d in zip(spec, equal, ds_requests)],
    }
    out.update(verdict(ds_tau, eng["acceptance_length"], lengths, all(agree_target), problems))
    if others:
        out["compare"] = {name: compare_section(replies, base) for name, replies in others.items()}
    return out, ds
