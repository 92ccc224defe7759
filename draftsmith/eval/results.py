"""The results JSON (docs/results-schema.md) and its terminal table."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
from pathlib import Path

import torch

from draftsmith.core import files

SCHEMA = "draftsmith.eval-results"
SCHEMA_VERSION = 1
DEFINITIONS = "draftsmith-v1"


def module_fingerprint(module: torch.nn.Module, state: dict | None = None) -> str:
    """sha256 over each tensor's name, shape and first 4096 values (as Target.fingerprint does)."""
    h = hashlib.sha256()
    for name, t in sorted((state if state is not None else module.state_dict()).items()):
        h.update(f"{name}:{tuple(t.shape)}".encode())
        h.update(t.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def hardware(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gb = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory_gb = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    return {"device": device.type, "device_name": name, "cpu": cpu, "num_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "memory_gb": memory_gb}


def software() -> dict:
    import transformers

    from draftsmith import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "draftsmith": __version__}


def _clean(obj):
    """NaN/inf -> None (JSON has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def build(command: str, config: dict, target_identity: dict, drafter_identity: dict, device: torch.device,
          workload_results: dict, lossless_checked: bool) -> dict:
    mismatches = [{"workload": w, **m} for w, r in workload_results.items() for m in r["lossless_mismatches"]]
    near_ties = [{"workload": w, **m} for w, r in workload_results.items() for m in r.get("lossless_near_ties", [])]
    identical = sum(1 for r in workload_results.values() for q in r["requests"]
                    if q.get("lossless") and not q.get("lossless_near_tie"))
    return _clean({
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "definitions": DEFINITIONS,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "config": config,
        "target": target_identity,
        "drafter": drafter_identity,
        "hardware": hardware(device),
        "software": software(),
        "training_log": drafter_identity.get("training_log"),
        # passed: no real mismatch; a divergence at a numerical near-tie (eval/numerics.py) is counted apart
        "lossless": {"checked": lossless_checked, "passed": (not mismatches) if lossless_checked else None,
                     "mismatches": mismatches, "near_ties": near_ties,
                     "num_identical": identical if lossless_checked else None,
                     "num_near_ties": len(near_ties) if lossless_checked else None,
                     "num_mismatches": len(mismatches) if lossless_checked else None},
        "workloads": workload_results,
    })


def write(results: dict, path: Path | str) -> Path:
    """Write atomically (a temporary file beside `path`, then one rename): on a full disk or a kill the
    previous results file stays whole."""
    return write_text_atomically(Path(path), json.dumps(results, indent=1) + "\n")


def write_text_atomically(path: Path, text: str, what: str = "--out") -> Path:
    """core.files.write_text_atomically: refuses a device node, FIFO or socket; a full disk is one line."""
    return files.write_text_atomically(path, text, what)


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def lossless_summary(ll: dict, cfg: dict) -> str:
    """One line: PASSED / PASSED up to numerical near-ties / FAILED, with the counts."""
    ties = ll.get("near_ties") or []
    where = f" (weights {cfg.get('dtype')}, verified in {cfg.get('verify_dtype') or cfg.get('dtype')})"
    if not ll["passed"]:
        extra = f", plus {len(ties)} divergence(s) at numerical near-ties" if ties else ""
        return f"FAILED on {len(ll['mismatches'])} prompt(s): a real mismatch{extra}{where}"
    if not ties:
        return "PASSED on every prompt" + where
    steps = ", ".join(f"{t['id']} at token {t['position']} (margin {max(t['speculative_pass']['margin'], t['target_only_pass']['margin']):.4g}, "
                      f"{t['dtype']} step {max(t['speculative_pass']['step'], t['target_only_pass']['step']):.4g})" for t in ties)
    return (f"PASSED up to numerics: {ll.get('num_identical')} prompt(s) identical, {len(ties)} diverged at a numerical "
            f"near-tie{where}: {steps}")


def table(results: dict) -> str:
    """A readable per-workload table: tau, alpha, per-position acceptance, tokens/s, end-to-end speedup,
    decode-only (TPOT) speedup, latency."""
    cfg = results["config"]
    tree = cfg.get("tree")
    shape = f"tree={tree['kind']} depth={tree['depth']} topk={tree['topk']} budget={tree['budget']}" if tree else f"k={cfg['k']}"
    head = (f"{results['drafter'].get('name')} on {results['target'].get('name')}  {shape} "
            f"T={cfg['temperature']} top_k={cfg['top_k']} top_p={cfg['top_p']} max_new={cfg['max_new_tokens']} "
            f"({cfg['verification']}, {'lossless' if cfg['lossless_rule'] else 'LOSSY'})")
    cols = f"{'workload':<26}{'n':>4}{'tau':>6}{'alpha':>7}  {'per-position':<24}{'tgt tok/s':>10}{'spec tok/s':>11}" \
           f"{'speedup':>8}{'p90':>6}{'TPOT sp':>8}{'lat med':>9}{'lat p90':>9}"
    lines = [head, cols, "-" * len(cols)]
    for name, w in results["workloads"].items():
        a = w["aggregate"]
        pos = " ".join(_fmt(p, ".2f") for p in a["per_position_acceptance"][:6])
        lines.append(
            f"{name:<26}{w['num_requests']:>4}{_fmt(a['acceptance_length'].get('pooled', a['acceptance_length']['mean'])):>6}{_fmt(a['acceptance_rate']):>7}  "
            f"{pos:<24}{_fmt(a['target_tokens_per_s']['median'], '.1f'):>10}{_fmt(a['spec_tokens_per_s']['median'], '.1f'):>11}"
            f"{_fmt(a['speedup']['median']):>8}{_fmt(a['speedup']['p90']):>6}"
            f"{_fmt((a.get('tpot_speedup') or {}).get('median')):>8}"
            f"{_fmt(a['latency_s']['median'], '.3f'):>9}{_fmt(a['latency_s']['p90'], '.3f'):>9}")
    split = [f"{n}: draft {_fmt(w['aggregate']['time_split']['draft'])} verify {_fmt(w['aggregate']['time_split']['verify'])} "
             f"overhead {_fmt(w['aggregate']['time_split']['overhead'])}" for n, w in results["workloads"].items()]
    lines += ["time split of speculative rounds:"] + ["  " + s for s in split]
    for n, w in results["workloads"].items():
        ctx = w["aggregate"].get("by_context")
        if ctx and len(ctx) > 1:
            lines.append(f"tau by context ({n}): " + "  ".join(f"{b['lo']}-{b['hi']}: {b['acceptance_length']:.2f}"
                                                               for b in ctx))
    ll = results["lossless"]
    if ll["checked"]:
        lines.append("lossless check: " + lossless_summary(ll, cfg))
    return "\n".join(lines)
