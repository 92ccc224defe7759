"""Write schema-conforming result files (docs/results-schema.md) for the report tests."""
from __future__ import annotations

import json
from pathlib import Path

HW_CPU = {"device": "cpu", "device_name": None, "cpu": "Test Xeon", "num_threads": 2, "memory_gb": 23.4}
HW_GPU = {"device": "cuda", "device_name": "NVIDIA H200", "cpu": "Test EPYC", "num_threads": 16, "memory_gb": 128}


def workload(tau: float, per_position: list[float], speedup: float | None = 1.2, alpha: float | None = None,
             costs: dict | None = None, time_split: dict | None = None) -> dict:
    """One workload entry; speed numbers are derived from `speedup` so that rows differ predictably."""
    agg = {
        "acceptance_length": {"pooled": tau, "mean": tau, "median": tau, "p10": tau - 0.3, "p90": tau + 0.3},
        "acceptance_rate": alpha if alpha is not None else (tau - 1) / len(per_position),
        "per_position_acceptance": per_position,
        "target_tokens_per_s": {"median": 100.0, "p90": 110.0},
        "time_split": time_split or {"draft": 0.3, "verify": 0.6, "overhead": 0.1},
        "costs": costs or {"draft_step_s": 0.001, "verify_forward_s": 0.004, "target_step_s": 0.004},
        "peak_memory_mb": 512.0,
    }
    if speedup is not None:
        agg.update({
            "spec_tokens_per_s": {"median": 100.0 * speedup, "p90": 110.0 * speedup},
            "speedup": {"median": speedup, "p10": speedup - 0.1, "p90": speedup + 0.1},
            "latency_s": {"median": 1.0 / speedup, "p90": 1.3 / speedup},
            "ttft_s": {"median": 0.010, "p90": 0.012},
            "tpot_s": {"median": 0.01 / speedup, "p90": 0.012 / speedup},
        })
    return {"num_requests": 4, "aggregate": agg, "requests": []}


def make_result(*, target: str = "stories260K", drafter: str = "eagle3-a", kind: str = "eagle3", k: int = 3,
                temperature: float = 0.0, hardware: dict = HW_CPU, workloads: dict | None = None,
                definitions: str = "draftsmith-v1", schema_version: int = 1, training_log: str | None = None) -> dict:
    workloads = workloads or {"spec_bench": workload(2.0, [0.8, 0.5, 0.4][:k] + [0.3] * max(0, k - 3))}
    return {
        "schema": "draftsmith.eval-results", "schema_version": schema_version, "definitions": definitions,
        "created": "2026-11-29T22:00:00Z",
        "command": f"draftsmith eval runs/{drafter}/final --workloads {','.join(workloads)} --k {k}",
        "config": {"k": k, "temperature": temperature, "top_k": 0, "top_p": 1.0, "max_new_tokens": 64,
                   "num_prompts": 4, "seed": 0, "warmup": 1, "dtype": "float32", "device": hardware["device"],
                   "verification": "greedy" if temperature == 0 else "stochastic"},
        "target": {"name": target, "fingerprint": "f" * 8, "architectures": ["LlamaForCausalLM"], "num_params": 260000,
                   "vocab_size": 512, "hidden_size": 64, "num_layers": 5},
        "drafter": {"kind": kind, "name": drafter, "path": f"runs/{drafter}/final", "fingerprint": "d" * 8,
                    "num_params": 1000},
        "hardware": hardware,
        "software": {"python": "3.11", "torch": "2.13.0", "transformers": "5.24", "draftsmith": "0.1.0"},
        "training_log": training_log,
        "workloads": workloads,
    }


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path
