"""Per-request and per-workload metrics, with the definitions of docs/design.md:

  acceptance length tau  committed tokens per round (accepted drafts + 1), from token ids; the
                         first token (from the prefill) belongs to no round and is not counted
                         pooled over a workload: sum of committed tokens / sum of rounds (the
                         number the speedup model uses and the leaderboard shows)
  acceptance rate alpha  accepted drafts / proposed drafts (pooled over rounds); drafts after an EOS
                         the round committed are not counted (see `counted`)
  per-position           P(draft position i accepted | positions < i accepted), pooled, same rule
  speedup                per request: spec tokens/s / target-only (k = 0) tokens/s, same prompt
  TPOT speedup           per request: target-only TPOT / speculative TPOT (decode only, no prefill)
  tokens/s               new tokens / end-to-end latency (prefill included, as Spec-Bench times it)
  TTFT                   prefill forward + first token; TPOT (latency - TTFT) / (new tokens - 1)
Timings come from the median-latency run of each prompt and mode (eval/runner.py repeats them).
"""
from __future__ import annotations

import statistics

import torch

from draftsmith.eval.loop import Generation, RoundStats


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), q).item())


def spread(values: list[float], p10: bool = False) -> dict:
    out = {"median": quantile(values, 0.5), "p90": quantile(values, 0.9)}
    if p10:
        out["p10"] = quantile(values, 0.1)
    return out


def counted(r: RoundStats) -> tuple[int, int]:
    """(proposed, accepted) drafts of one round as acceptance counts them.

    A round cut at an EOS among its accepted drafts (committed < accepted + 1) ends the request
    there: the drafts after that EOS were verified but can never be used, so they count neither as
    proposed nor as accepted; the drafts up to and including the EOS count as accepted. Drafts past
    max_new_tokens are never proposed (the loop caps a round at max_new_tokens - generated - 1).
    """
    if r.committed < r.accepted + 1:
        return r.committed, r.committed
    return r.proposed, r.accepted


def tpot(gen: Generation) -> float:
    """Decode-only seconds per token: (latency - TTFT) / (new tokens - 1); NaN for 1-token outputs."""
    n = len(gen.tokens)
    return (gen.latency_s - gen.ttft_s) / (n - 1) if n > 1 else float("nan")


def request_metrics(spec: Generation, base: Generation, k: int) -> dict:
    """One request: the speculative run `spec` against the k = 0 run `base` on the same prompt."""
    rounds = spec.rounds
    accepted_by_position, reached_position = [0] * k, [0] * k
    proposed_total = accepted_total = 0
    for r in rounds:
        proposed, accepted = counted(r)
        proposed_total, accepted_total = proposed_total + proposed, accepted_total + accepted
        for i in range(min(proposed, k)):  # a tree round proposes more nodes than its depth k
            if i <= accepted:  # positions < i were all accepted, so position i was tested
                reached_position[i] += 1
            if i < accepted:
                accepted_by_position[i] += 1
    new = len(spec.tokens)
    spec_tps = new / spec.latency_s
    base_tps = len(base.tokens) / base.latency_s
    spec_tpot, base_tpot = tpot(spec), tpot(base)
    return {
        "prompt_tokens": len(spec.prompt_ids),
        "new_tokens": new,
        "stop": spec.stop,
        "rounds": len(rounds),
        "accepted": accepted_total,
        "proposed": proposed_total,
        "committed": sum(r.committed for r in rounds),
        "verify_lengths": [r.proposed for r in rounds],  # drafts sent to verification, per round (<= k)
        "acceptance_length": sum(r.committed for r in rounds) / len(rounds) if rounds else float("nan"),
        "accepted_by_position": accepted_by_position,
        "reached_position": reached_position,
        "spec_tokens_per_s": spec_tps,
        "target_tokens_per_s": base_tps,
        "speedup": spec_tps / base_tps,
        "latency_s": spec.latency_s,
        "target_latency_s": base.latency_s,
        "ttft_s": spec.ttft_s,
        "tpot_s": spec_tpot,
        "target_tpot_s": base_tpot,
        "tpot_speedup": base_tpot / spec_tpot if spec_tpot > 0 else float("nan"),  # NaN when either is NaN
        "time_s": {"draft": sum(r.draft_s for r in rounds), "verify": sum(r.verify_s for r in rounds),
                   "overhead": sum(r.overhead_s for r in rounds), "rounds": sum(r.total_s for r in rounds)},
        "_costs": {  # per-round samples for the aggregate medians; dropped before writing
            "draft_step_s": [r.draft_s / r.proposed for r in rounds if r.proposed],
            "verify_forward_s": [r.verify_s for r in rounds if r.proposed >= k],  # full rounds (a tree: > k nodes)
            "target_step_s": [r.verify_s for r in base.rounds],
        },
    }


def aggregate(requests: list[dict], k: int) -> dict:
    """Workload numbers from request_metrics dicts (pooled counts, spreads over requests)."""
    def col(key):
        return [r[key] for r in requests if r[key] == r[key]]  # drops NaN (e.g. tpot of 1-token outputs)

    accepted, proposed = sum(r["accepted"] for r in requests), sum(r["proposed"] for r in requests)
    acc_pos = [sum(r["accepted_by_position"][i] for r in requests) for i in range(k)]
    reach_pos = [sum(r["reached_position"][i] for r in requests) for i in range(k)]
    times = {part: sum(r["time_s"][part] for r in requests) for part in ("draft", "verify", "overhead", "rounds")}
    n_rounds = sum(r["rounds"] for r in requests)
    costs = {name: [v for r in requests for v in r["_costs"][name]] for name in requests[0]["_costs"]} if requests else {}
    taus = col("acceptance_length")
    committed = sum(r["committed"] for r in requests)
    return {
        # pooled: sum committed / sum rounds (the headline; short requests weigh by their rounds);
        # mean, median, p10, p90: over requests, each its own committed / rounds
        "acceptance_length": {"pooled": committed / n_rounds if n_rounds else float("nan"),
                              "mean": statistics.fmean(taus) if taus else float("nan"), **spread(taus, p10=True)},
        "acceptance_rate": accepted / proposed if proposed else float("nan"),
        "per_position_acceptance": [a / n if n else float("nan") for a, n in zip(acc_pos, reach_pos)],
        "target_tokens_per_s": spread(col("target_tokens_per_s")),
        "spec_tokens_per_s": spread(col("spec_tokens_per_s")),
        "speedup": spread(col("speedup"), p10=True),
        "latency_s": spread(col("latency_s")),
        "ttft_s": spread(col("ttft_s")),
        "tpot_s": spread(col("tpot_s")),
        "target_tpot_s": spread(col("target_tpot_s")),
        "tpot_speedup": spread(col("tpot_speedup"), p10=True),  # decode only: target TPOT / speculative TPOT
        "time_split": {part: (times[part] / times["rounds"] if times["rounds"] else float("nan"))
                       for part in ("draft", "verify", "overhead")},
        "time_per_round_s": {part: (times[part] / n_rounds if n_rounds else float("nan"))
                             for part in ("draft", "verify", "overhead")},
        "costs": {name: quantile(values, 0.5) for name, values in costs.items()},
        "new_tokens": sum(r["new_tokens"] for r in requests),
        "rounds": n_rounds,
    }


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(peak MB, what was measured): CUDA max allocated, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_memory_allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_max_rss"
