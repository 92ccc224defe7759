"""draftsmith's speculative loop vs Hugging Face transformers' assisted generation and prompt
lookup decoding: same target, same draft model, same prompts, greedy, fixed k.

    OMP_NUM_THREADS=2 python benchmarks/bench_eval_hf.py [--target ../shared/models/stories260K-hf]
        [--k 4] [--max-new-tokens 128] [--draft-layers 2] [--repeats 3] [--num-prompts 8]

Draft model: the target's first --draft-layers layers (draft_lm_mod.layer_truncated_copy).
HF settings: num_assistant_tokens=k, schedule "constant", assistant_confidence_threshold=0
(HF's default 0.4 cuts drafts short); prompt lookup with prompt_lookup_num_tokens=k and
max_matching_ngram_size=2 vs draftsmith's ngram proposer with max_ngram=2, match "first".
Prints per-method median tokens/s (and p10-p90 over prompts x repeats), the ratios, whether
every output is identical, and the loop's per-round overhead (time outside model forwards).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftsmith.eval import proposers
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads import draft_lm as draft_lm_mod
from draftsmith.targets import load as target_mod

PROMPTS = ["Once upon a time", "Tom and Lily went to the park. They saw", "The little dog was sad because",
           "One day, a girl named Sue found a", "The sun was hot and the bird", "Ben had a red ball. He",
           "Mom said, \"Let's go to the", "There was a big tree in the garden."]


def q(values, frac):
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), frac))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="../shared/models/stories260K-hf")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    args = ap.parse_args()
    t = target_mod.load(args.target, device="cpu")
    model, tok = t.model, t.tokenizer
    draft = draft_lm_mod.layer_truncated_copy(model, args.draft_layers)
    draft.generation_config.num_assistant_tokens = args.k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    ours_draft = draft_lm_mod.DraftModelProposer(draft, t.vocab_size)
    ours_ngram = proposers.NgramProposer(max_ngram=2, min_ngram=1, match="first")
    n = args.max_new_tokens
    eos = t.eos_ids

    def hf(ids, **kw):
        out = model.generate(ids[None], max_new_tokens=n, do_sample=False, eos_token_id=eos, **kw)
        return out[0, ids.shape[0]:].tolist()

    methods = {
        "target_only/ours": lambda ids: generate(t, None, ids, LoopConfig(k=0, max_new_tokens=n)),
        "target_only/hf": lambda ids: hf(ids),
        "draft_lm/ours": lambda ids: generate(t, ours_draft, ids, LoopConfig(k=args.k, max_new_tokens=n)),
        "draft_lm/hf": lambda ids: hf(ids, assistant_model=draft),
        "prompt_lookup/ours": lambda ids: generate(t, ours_ngram, ids, LoopConfig(k=args.k, max_new_tokens=n)),
        "prompt_lookup/hf": lambda ids: hf(ids, prompt_lookup_num_tokens=args.k, max_matching_ngram_size=2),
    }
    encoded = [tok(p, return_tensors="pt").input_ids[0] for p in PROMPTS[: args.num_prompts]]
    for fn in methods.values():  # warm-up
        fn(encoded[0])
    tps = {m: [] for m in methods}
    outputs = {m: {} for m in methods}
    overhead, rounds_stats = {"draft_lm/ours": [], "prompt_lookup/ours": []}, {}
    for rep in range(args.repeats):
        for i, ids in enumerate(encoded):
            order = list(methods) if (i + rep) % 2 == 0 else list(reversed(methods))
            for m in order:
                start = time.perf_counter()
                res = methods[m](ids)
                dt = time.perf_counter() - start
                toks = res if isinstance(res, list) else res.tokens
                tps[m].append(len(toks) / dt)
                outputs[m][i] = toks
                if m in overhead:
                    rs = res.rounds
                    overhead[m].append(sum(r.overhead_s for r in rs) / sum(r.total_s for r in rs))
                    rounds_stats[m] = rounds_stats.get(m, 0) + len(rs)
    ref = outputs["target_only/hf"]
    print(f"target {args.target}  k={args.k}  max_new_tokens={n}  draft=first {args.draft_layers} layers  "
          f"prompts={len(encoded)} x repeats={args.repeats}  threads={torch.get_num_threads()}")
    for m in methods:
        same = all(outputs[m][i] == ref[i] for i in ref)
        v = tps[m]
        print(f"{m:<20} tok/s median {statistics.median(v):8.1f}  p10 {q(v, .1):8.1f}  p90 {q(v, .9):8.1f}  "
              f"identical to HF greedy: {same}")
    for kind in ("target_only", "draft_lm", "prompt_lookup"):
        ours, theirs = tps[f"{kind}/ours"], tps[f"{kind}/hf"]
        ratios = [a / b for a, b in zip(ours, theirs)]
        print(f"ratio ours/hf {kind:<14} median {statistics.median(ratios):.2f}  p10 {q(ratios, .1):.2f}  "
              f"p90 {q(ratios, .9):.2f}")
    for m, v in overhead.items():
        print(f"loop overhead {m:<20} (time outside forwards and proposer calls, fraction of round) median "
              f"{statistics.median(v):.3f}  p90 {q(v, .9):.3f}")


if __name__ == "__main__":
    main()
