"""The speculative loop against its physical bound, on a 350M-class Llama in bf16 (random
weights: only timing matters here).

    OMP_NUM_THREADS=2 python benchmarks/bench_eval_bound.py [--k 2 4] [--miss 0.0 0.3]
        [--prompts 2] [--prompt-len 32] [--max-new-tokens 32] [--layers 24] [--hidden 1024]

A replay proposer proposes the target's own greedy continuation (from a k = 0 run) and is made
to miss each token with probability --miss. For each (k, miss):
  measured speedup  = decode tokens/s of the speculative run / decode tokens/s of k = 0
                      (decode = after the first token; prefill is the same in both)
  predicted bound   = tau * T_step / T_round, from measured times: T_step = median k = 0
                      forward, T_round = median verification forward over k+1 tokens + median
                      proposer time per round (replay: ~0)
  efficiency        = measured / predicted (1.0: the loop adds nothing beyond the forwards)
"""
from __future__ import annotations

import argparse
import statistics
from types import SimpleNamespace

import torch

from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.eval.proposers import ReplayProposer
from draftsmith.targets.load import Target


def build_target(layers: int, hidden: int, vocab: int, seed: int = 0, device: str = "cpu") -> Target:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 2.75), num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
    return Target(model, SimpleNamespace(eos_token_id=None), name=f"random-llama-{layers}x{hidden}-bf16")


def decode_tps(g) -> float:
    return (len(g.tokens) - 1) / (g.latency_s - g.ttft_s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--miss", type=float, nargs="+", default=[0.0, 0.3])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (scripts/device_check.sh uses cuda)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = ap.parse_args()
    t = build_target(args.layers, args.hidden, args.vocab, device=args.device)
    rows = []
    n_params = sum(p.numel() for p in t.model.parameters())
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, args.vocab, (args.prompt_len,), generator=gen) for _ in range(args.prompts)]
    base_cfg = LoopConfig(k=0, max_new_tokens=args.max_new_tokens, eos_ids=[])
    generate(t, None, prompts[0], base_cfg)  # warm-up
    refs = {}
    for p in prompts:
        g = generate(t, None, p, base_cfg)
        refs[tuple(p.tolist())] = p.tolist() + g.tokens
    print(f"target {t.name} ({n_params / 1e6:.0f}M params), prompts={args.prompts}x{args.prompt_len} tokens, "
          f"max_new_tokens={args.max_new_tokens}, threads={torch.get_num_threads()}")
    print(f"{'k':>2} {'miss':>5} {'tau':>5} {'T_step ms':>9} {'T_verify ms':>11} {'T_draft ms':>10} "
          f"{'overhead/round':>14} {'predicted':>9} {'measured':>8} {'efficiency':>10}")
    for k in args.k:
        for miss in args.miss:
            proposer = ReplayProposer(refs, args.vocab, miss_rate=miss, seed=0)
            cfg = LoopConfig(k=k, max_new_tokens=args.max_new_tokens, eos_ids=[])
            steps, verifies, drafts, overheads, totals, speedups, taus = [], [], [], [], [], [], []
            for i, p in enumerate(prompts):
                runs = [(0, None), (k, proposer)] if i % 2 == 0 else [(k, proposer), (0, None)]
                out = {kk: generate(t, prop, p, cfg if kk else base_cfg) for kk, prop in runs}
                base, spec = out[0], out[k]
                steps += [r.verify_s for r in base.rounds]
                verifies += [r.verify_s for r in spec.rounds if r.proposed == k]
                drafts += [r.draft_s for r in spec.rounds]
                overheads += [r.overhead_s for r in spec.rounds]
                totals += [r.total_s for r in spec.rounds]
                speedups.append(decode_tps(spec) / decode_tps(base))
                taus.append(sum(r.committed for r in spec.rounds) / len(spec.rounds))
            t_step, t_ver, t_draft = (statistics.median(v) for v in (steps, verifies, drafts))
            tau = statistics.mean(taus)
            predicted = tau * t_step / (t_ver + t_draft)
            measured = statistics.median(speedups)
            print(f"{k:>2} {miss:>5.2f} {tau:>5.2f} {t_step * 1e3:>9.1f} {t_ver * 1e3:>11.1f} {t_draft * 1e3:>10.2f} "
                  f"{sum(overheads) / sum(totals):>14.3f} {predicted:>9.2f} {measured:>8.2f} {measured / predicted:>10.2f}")
            rows.append({"k": k, "miss": miss, "tau": tau, "t_step_ms": t_step * 1e3, "t_verify_ms": t_ver * 1e3,
                         "predicted": predicted, "measured": measured, "params": n_params, "device": args.device})
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
