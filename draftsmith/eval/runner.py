"""Run a proposer on workloads: every prompt `repeats` times target-only (k = 0) and `repeats`
times speculative (default 3 each), interleaved (base, spec, base, spec, ...; the order alternates
per prompt so that drift favours neither), after warm-up. Each mode keeps its run with the median
end-to-end latency, whose timings and round log enter the metrics (the repeats decode the same
tokens: same prompt, same seed). Greedy outputs are compared for --check-lossless; where they differ,
both greedy runs are repeated with the target's top-2 logits recorded, and the first difference is
classified as a numerical near-tie or a real mismatch (eval/numerics.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import SamplingParams
from draftsmith.eval import bins, metrics, numerics, workloads
from draftsmith.eval.loop import Generation, LoopConfig, generate
from draftsmith.eval.tree import TreeConfig


@dataclass
class EvalSettings:
    k: int = 5
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    num_prompts: Optional[int] = 10  # per workload; None: all
    warmup: int = 1  # prompts run untimed (both modes) before each workload
    seed: int = 0
    prompt_format: str = "auto"
    data_dir: Optional[Path] = None
    check_lossless: bool = False
    eos_ids: Optional[list[int]] = None
    tree: Optional[TreeConfig] = None  # tree drafting (k is then the tree depth)
    repeats: int = 3  # timed runs per prompt and mode; the median-latency run is kept (`draftsmith eval` needs >= 3)
    near_tie_steps: float = numerics.NEAR_TIE_STEPS  # --check-lossless: a margin within this many dtype steps is numerics


def first_difference(a: list[int], b: list[int]) -> Optional[int]:
    """First position where two token lists differ (the shorter length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _run(target, proposer, ids: torch.Tensor, k: int, s: EvalSettings, sampling: SamplingParams,
         seed: int, record_top2: bool = False, media: dict | None = None) -> Generation:
    gen = torch.Generator(device=target.device).manual_seed(seed)
    cfg = LoopConfig(k=k, max_new_tokens=s.max_new_tokens, sampling=sampling, eos_ids=s.eos_ids,
                     tree=s.tree if k else None, record_top2=record_top2)
    return generate(target, proposer if k else None, ids, cfg, gen, media=media)


def encode_item(item: dict, target, s: EvalSettings, max_prompt: int | None) -> tuple[torch.Tensor, bool, dict | None]:
    """A workload item -> (prompt ids, truncated, media): an item with images through the target's processor
    (eval/image_workloads.py), any other through workloads.encode (media None)."""
    if item.get("images"):
        from draftsmith.eval import image_workloads

        return image_workloads.encode(item, target, max_prompt)
    return (*workloads.encode(item, target.tokenizer, s.prompt_format, max_prompt), None)


def median_run(runs: list[Generation]) -> Generation:
    """The run with the median end-to-end latency (the lower middle one for an even count)."""
    return sorted(runs, key=lambda g: g.latency_s)[(len(runs) - 1) // 2]


def _timed_pair(target, proposer, ids: torch.Tensor, s: EvalSettings, seed: int,
                base_first: bool, media: dict | None = None) -> tuple[Generation, Generation]:
    """(speculative, target-only): the median-latency run of s.repeats interleaved runs per mode."""
    specs, bases = [], []
    for _ in range(s.repeats):
        if base_first:
            bases.append(_run(target, proposer, ids, 0, s, s.sampling, seed, media=media))
        specs.append(_run(target, proposer, ids, s.k, s, s.sampling, seed, media=media))
        if not base_first:
            bases.append(_run(target, proposer, ids, 0, s, s.sampling, seed, media=media))
    return median_run(specs), median_run(bases)


def _lossless(target, proposer, item_id: str, ids, spec: Generation, base: Generation, s: EvalSettings,
              seed: int, media: dict | None = None) -> Optional[dict]:
    """None if greedy speculative output equals greedy target-only output, else the difference: its first
    position, tokens, the target's top-2 margins there in both passes and its kind ("near_tie": within
    one step of the logits' dtype in both passes; "mismatch": a real failure), eval/numerics.py."""
    greedy = SamplingParams()
    if not s.sampling.greedy:  # the check is greedy: run both again with temperature 0
        spec = _run(target, proposer, ids, s.k, s, greedy, seed, media=media)
        base = _run(target, None, ids, 0, s, greedy, seed, media=media)
    pos = first_difference(spec.tokens, base.tokens)
    if pos is None:
        return None
    # the same two greedy runs again (greedy decoding is deterministic), keeping the top-2 logits per token
    spec = _run(target, proposer, ids, s.k, s, greedy, seed, record_top2=True, media=media)
    base = _run(target, None, ids, 0, s, greedy, seed, record_top2=True, media=media)
    pos = first_difference(spec.tokens, base.tokens)
    if pos is None:  # not reproduced: a nondeterministic kernel, never a near-tie
        return {"id": item_id, "position": None, "spec_token": None, "target_token": None, "kind": "mismatch",
                "note": "the difference did not reproduce when both runs were repeated (nondeterministic decoding)"}
    return {"id": item_id, **numerics.diagnose(pos, spec, base, s.near_tie_steps)}


def run_workload(target, proposer, name: str, s: EvalSettings, log: Callable[[str], None] = print) -> dict:
    """One workload -> its results section (docs/results-schema.md)."""
    if s.repeats < 1:
        raise UserError(f"repeats must be >= 1 (timed runs per prompt and mode), got {s.repeats}")
    items = workloads.load(name, s.data_dir, s.num_prompts)
    if not items:
        raise UserError(f"workload {name!r} has no prompts")
    from draftsmith.targets.archs import text_config

    limit = getattr(text_config(target.config), "max_position_embeddings", None)  # a VLM: its language model's
    max_prompt = None if limit is None else limit - s.max_new_tokens
    if max_prompt is not None and max_prompt < 1:
        raise UserError(f"--max-new-tokens {s.max_new_tokens} leaves no room for a prompt in {limit} positions")
    encoded = [(item, *encode_item(item, target, s, max_prompt)) for item in items]
    for _item, ids, _, media in encoded[: s.warmup]:
        _run(target, proposer, ids, 0, s, s.sampling, s.seed, media=media)
        _run(target, proposer, ids, s.k, s, s.sampling, s.seed, media=media)
    requests, mismatches, near_ties = [], [], []
    for i, (item, ids, truncated, media) in enumerate(encoded):
        seed = s.seed + i
        spec, base = _timed_pair(target, proposer, ids, s, seed, base_first=i % 2 == 0, media=media)
        req = {"id": item["id"], **metrics.request_metrics(spec, base, s.k), "prompt_truncated": truncated,
               "_rounds": bins.round_records(spec)}
        req["lossless"], req["lossless_near_tie"] = None, None
        if s.check_lossless:
            diff = _lossless(target, proposer, item["id"], ids, spec, base, s, seed, media)
            near = diff is not None and diff["kind"] == "near_tie"
            req["lossless"], req["lossless_near_tie"] = diff is None or near, near  # a near-tie is not a failure
            if near:
                near_ties.append(diff)
                log(f"  lossless up to numerics {name} {item['id']}: {numerics.describe(diff)}")
            elif diff:
                mismatches.append(diff)
                note = diff.get("note") or numerics.describe(diff)
                log(f"  LOSSLESS MISMATCH {name} {item['id']}: {note}")
        requests.append(req)
    aggregate = metrics.aggregate(requests, s.k)
    aggregate.update(bins.aggregate(requests))  # acceptance by context, output position, prompt length
    aggregate["peak_memory_mb"], aggregate["peak_memory_source"] = metrics.peak_memory_mb(target.device)
    for req in requests:
        req.pop("_costs")
        req.pop("_rounds")
    return {"num_requests": len(requests), "num_truncated_prompts": sum(r["prompt_truncated"] for r in requests),
            "aggregate": aggregate, "lossless_mismatches": mismatches, "lossless_near_ties": near_ties,
            "requests": requests}


# ---------------------------------------------------------------- batched decoding (--batch-size, --concurrency-sweep)
def _batched_pass(target, proposer, ids_list: list, k: int, s: EvalSettings, seed: int) -> tuple[list[Generation], float]:
    """One batch through loop.generate_batch -> (generations, wall seconds including the prefills)."""
    import copy

    from draftsmith.eval.loop import clock, generate_batch

    cfg = LoopConfig(k=k, max_new_tokens=s.max_new_tokens, sampling=s.sampling, eos_ids=s.eos_ids)
    props = [copy.copy(proposer) if k else None for _ in ids_list]  # one proposer per request (shared weights)
    gens = [torch.Generator(device=target.device).manual_seed(seed + i) for i in range(len(ids_list))]
    start = clock(target.device)
    out = generate_batch(target, props, ids_list, cfg, gens)
    return out, clock(target.device) - start


def run_batched(target, proposer, name: str, s: EvalSettings, batch_sizes: list[int],
                log: Callable[[str], None] = print) -> list[dict]:
    """For each B: max(B, num_prompts) requests (prompts reused cyclically when B exceeds them), in
    batches of B, target-only (k = 0) and speculative through the same batched code, interleaved per
    batch (order alternating), after one warm-up batch of each. Greedy outputs are compared per row
    with batch-1 target-only output when s.check_lossless."""
    items = workloads.load(name, s.data_dir, s.num_prompts)
    if any(item.get("images") for item in items):
        raise UserError(f"workload {name}: batched decoding (--batch-size, --concurrency-sweep) runs text prompts only; "
                        "evaluate image prompts one request at a time (drop --batch-size)")
    limit = getattr(target.config, "max_position_embeddings", None)
    max_prompt = None if limit is None else limit - s.max_new_tokens
    encoded = [workloads.encode(item, target.tokenizer, s.prompt_format, max_prompt)[0] for item in items]
    reference = None
    if s.check_lossless and s.sampling.greedy:
        reference = [_run(target, None, ids, 0, s, s.sampling, s.seed).tokens for ids in encoded]
    rows = []
    for B in batch_sizes:
        n = max(B, len(encoded))
        order = [i % len(encoded) for i in range(n)]
        for k in (0, s.k):  # warm-up
            _batched_pass(target, proposer, [encoded[i] for i in order[:B]], k, s, s.seed)
        runs = {0: ([], 0.0), s.k: ([], 0.0)}
        decode = {0: 0.0, s.k: 0.0}  # decode wall: the batch's rounds, prefills excluded
        for g, start in enumerate(range(0, n, B)):
            chunk = order[start:start + B]
            for k in ((0, s.k) if g % 2 == 0 else (s.k, 0)):
                gens, wall = _batched_pass(target, proposer, [encoded[i] for i in chunk], k, s, s.seed + start)
                runs[k] = (runs[k][0] + list(zip(chunk, gens)), runs[k][1] + wall)
                decode[k] += max(x.latency_s - x.ttft_s for x in gens)
        row = {"batch_size": B, "requests": n}
        for label, k in (("target", 0), ("spec", s.k)):
            gens = [g for _, g in runs[k][0]]
            tokens = sum(len(g.tokens) for g in gens)
            tpots = [(g.latency_s - g.ttft_s) / (len(g.tokens) - 1) for g in gens if len(g.tokens) > 1]
            row[f"{label}_tokens_per_s"] = tokens / runs[k][1]
            row[f"{label}_decode_tokens_per_s"] = sum(len(g.tokens) - 1 for g in gens) / decode[k]
            row[f"{label}_tpot_s"] = metrics.spread(tpots)
        rounds = [r for _, g in runs[s.k][0] for r in g.rounds]
        row["acceptance_length"] = sum(r.committed for r in rounds) / len(rounds) if rounds else float("nan")
        row["speedup"] = row["spec_tokens_per_s"] / row["target_tokens_per_s"]  # end to end, prefills included
        row["decode_speedup"] = row["spec_decode_tokens_per_s"] / row["target_decode_tokens_per_s"]
        if reference is not None:
            bad = [i for k in (0, s.k) for i, g in runs[k][0] if g.tokens != reference[i]]
            row["lossless"] = not bad
            if bad:
                log(f"  LOSSLESS MISMATCH {name} batch {B}: {len(bad)} row(s) differ from batch-1 target-only output")
        log(f"  {name} B={B:<3} target {row['target_tokens_per_s']:.1f} tok/s  spec {row['spec_tokens_per_s']:.1f} tok/s  "
            f"speedup {row['speedup']:.2f} (decode {row['decode_speedup']:.2f})  tau {row['acceptance_length']:.2f}  "
            f"TPOT spec {row['spec_tpot_s']['median'] * 1e3:.1f} ms")
        rows.append(row)
    return rows
