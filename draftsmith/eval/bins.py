"""Acceptance by context length and by position in the output.

Each round is recorded with the output position at which it starts (new tokens already emitted,
the prefill's first token included) and its context (prompt tokens + that position: what the
target attends to when it verifies). Rounds are pooled into power-of-two bins; per bin:
tau = committed / rounds and alpha = accepted / proposed (docs/design.md, "Definitions"). Requests are
also binned by prompt length (tau pooled over their rounds).
"""
from __future__ import annotations

EDGES = (0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def round_records(gen) -> list[tuple[int, int, int, int, int]]:
    """-> per round (output position, context, proposed, accepted, committed)."""
    out, pos, prompt = [], 1, len(gen.prompt_ids)
    for r in gen.rounds:
        out.append((pos, prompt + pos, r.proposed, r.accepted, r.committed))
        pos += r.committed
    return out


def _bin(value: int) -> tuple[int, int]:
    for lo, hi in zip(EDGES, EDGES[1:]):
        if lo <= value < hi:
            return lo, hi
    return EDGES[-1], 2 * EDGES[-1]


def binned(records: list[tuple[int, int, int, int, int]], field: int) -> list[dict]:
    """Pool rounds by the bin of record[field] (0: output position, 1: context)."""
    sums: dict[tuple[int, int], list[int]] = {}
    for rec in records:
        s = sums.setdefault(_bin(rec[field]), [0, 0, 0, 0])
        s[0] += 1
        s[1] += rec[2]
        s[2] += rec[3]
        s[3] += rec[4]
    return [{"lo": lo, "hi": hi, "rounds": n, "acceptance_length": committed / n,
             "acceptance_rate": accepted / proposed if proposed else None}
            for (lo, hi), (n, proposed, accepted, committed) in sorted(sums.items())]


def aggregate(requests: list[dict]) -> dict:
    """requests carry "_rounds" (round_records) and "prompt_tokens" -> the three binnings."""
    records = [rec for r in requests for rec in r["_rounds"]]
    by_prompt: dict[tuple[int, int], list[int]] = {}
    for r in requests:
        s = by_prompt.setdefault(_bin(r["prompt_tokens"]), [0, 0, 0])
        s[0] += 1
        s[1] += len(r["_rounds"])
        s[2] += sum(rec[4] for rec in r["_rounds"])
    return {"by_context": binned(records, 1), "by_output_position": binned(records, 0),
            "by_prompt_length": [{"lo": lo, "hi": hi, "requests": n, "rounds": rounds,
                                  "acceptance_length": committed / rounds if rounds else None}
                                 for (lo, hi), (n, rounds, committed) in sorted(by_prompt.items())]}
