"""What rolling a hybrid target's recurrent / conv state back costs, against the verification forward
it follows, at k = 5 (issue 42), for both rollback modes of the speculative loop
(draftsmith/targets/state_cache.py):

  verify    one cached forward of k + 1 = 6 tokens on a cache that records nothing (the cost of
            verification itself; chunked kernels over all 6 tokens);
  keep      the extra cost of keeping the state at each verified position: the same forward with
            recurrent_states_to_keep = 6 (the last 6 tokens run through the one-token recurrence),
            minus `verify`, plus the crop that takes the accepted state (a = 2 accepted, 3 rejected);
            negative when the one-token recurrence over 6 tokens is faster than the chunked kernel
            (transformers' CPU reference kernels, no fla / mamba_ssm);
  replay    snapshot of every state before the forward + restoring it + a second forward of the
            a + 1 = 3 accepted tokens.
Each is reported as a multiple of `verify` (the issue's bar: <= 1.5x). Random weights, float32, one
CPU thread, context --context tokens, medians over --repeats. Every hybrid of archs.TINY is run at a
"medium" width (hidden --hidden, the tiny model's layer pattern) so that the arithmetic, not Python,
dominates; the tiny widths are overhead-bound.

    PYTHONPATH=$PWD python benchmarks/bench_hybrid_rollback.py --out benchmarks/results/hybrid-rollback/cpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

K, ACCEPTED = 5, 2


def widened(arch: str, hidden: int):
    """The tiny config of `arch` with hidden size `hidden` and MLP / SSM widths scaled with it."""
    from draftsmith.targets import archs

    cfg = archs.TINY[arch][1]()
    scale = hidden // cfg.hidden_size
    cfg.hidden_size = hidden
    for name in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "shared_intermediate_size", "mamba_d_ssm"):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            setattr(cfg, name, value * scale)
    for name in ("mamba_d_head", "mamba_head_dim", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_head_dim", "head_dim"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not (name == "head_dim" and arch == "kimi-linear"):
            setattr(cfg, name, value * scale)
    if arch == "granite-4-hybrid":  # Mamba-2 inner width = expand * hidden = heads * head dim
        cfg.mamba_d_head = cfg.mamba_expand * hidden // cfg.mamba_n_heads
    cfg.vocab_size = 2048
    return cfg


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(arch: str, hidden: int, context: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.targets import archs, state_cache

    cfg = widened(arch, hidden)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, cfg.vocab_size, (1, context), generator=g)
    block = torch.randint(3, cfg.vocab_size, (1, K + 1), generator=g)
    rows = {"verify": [], "verify_keep": [], "crop": [], "snapshot": [], "restore": [], "replay_forward": []}
    with torch.no_grad():
        plain = archs.new_cache(cfg, state_rollback="replay")  # records nothing on its state layers
        model(input_ids=prompt, cache=plain, use_cache=True)
        kept = archs.new_cache(cfg, keep_states=K + 1, state_rollback="keep")
        model(input_ids=prompt, cache=kept, use_cache=True)
        state_cache.trim(kept)
        for _ in range(repeats):
            # replay mode: snapshot, verify, restore, forward the a + 1 accepted tokens, restore again
            snap = [None]
            rows["snapshot"].append(_time(lambda snap=snap: snap.__setitem__(0, state_cache.snapshot(plain))))
            rows["verify"].append(_time(lambda: model(input_ids=block, cache=plain, use_cache=True)))
            rows["restore"].append(_time(lambda snap=snap: state_cache.restore(plain, snap[0], K + 1)))
            rows["replay_forward"].append(_time(lambda: model(input_ids=block[:, :ACCEPTED + 1], cache=plain, use_cache=True)))
            state_cache.restore(plain, snap[0], ACCEPTED + 1)
            # keep mode: the verification forward keeps K + 1 states; the crop takes the accepted one
            back = state_cache.snapshot(kept)
            rows["verify_keep"].append(_time(lambda: model(input_ids=block, cache=kept, use_cache=True)))
            rows["crop"].append(_time(lambda: kept.crop(-(K - ACCEPTED))))
            state_cache.restore(kept, back, ACCEPTED + 1)
    med = {k: statistics.median(v) for k, v in rows.items()}
    keep_cost = med["verify_keep"] - med["verify"] + med["crop"]  # negative: the kept-state path is the faster one
    replay_cost = med["snapshot"] + med["restore"] + med["replay_forward"]
    return {"arch": arch, "params": params, "hidden": hidden, "context": context, "k": K, "accepted": ACCEPTED,
            "median_ms": {k: round(v, 3) for k, v in med.items()},
            "keep_over_verify": round(keep_cost / med["verify"], 3),
            "replay_over_verify": round(replay_cost / med["verify"], 3),
            "layer_types": sorted(set(state_cache.cache_layer_types(cfg)))}


def main() -> int:
    import torch

    from benchmarks.bench_verify_bounds import cpu_facts
    from draftsmith.targets import archs, state_cache

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--archs", default=None, help="comma-separated names of archs.TINY (default: every hybrid)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.archs.split(",") if args.archs else [n for n, (_, f) in archs.TINY.items() if state_cache.has_state_layers(f())]
    results = []
    for arch in names:
        row = measure(arch, args.hidden, args.context, args.repeats)
        results.append(row)
        m = row["median_ms"]
        print(f"{arch:18s} {row['params'] / 1e6:5.2f}M verify {m['verify']:7.2f} ms | keep: verify {m['verify_keep']:7.2f} "
              f"+ crop {m['crop']:.3f} -> {row['keep_over_verify']:.2f}x | replay: snapshot {m['snapshot']:.3f} + restore "
              f"{m['restore']:.3f} + forward {m['replay_forward']:.2f} -> {row['replay_over_verify']:.2f}x", flush=True)
    out = {"cpu": cpu_facts(), "threads": 1, "results": results}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
