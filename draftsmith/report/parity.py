"""The terminal lines of a train-to-serve parity section (the `engine` key of a workload in the
results JSON, written by `draftsmith eval CKPT --engine llama.cpp`, draftsmith/commands/eval_engine.py)."""
from __future__ import annotations


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
    for other, c in (e.get("compare") or {}).items():
        sp = c.get("decode_speedup") or {}
        lines.append(f"  {pad}  {e['name']} {other}: decode speedup {_f(sp.get('median'), '.2f')}x median, "
                     f"{_f(sp.get('p90'), '.2f')}x p90 | tau {_f(c['acceptance_length'])} ({c['draft_n_accepted']}/"
                     f"{c['draft_n']} drafts) | output == target-only on {c['output_equals_target_only']}/{c['num_requests']}")
    return lines
