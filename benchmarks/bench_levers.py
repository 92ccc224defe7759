"""The learn-fast levers of issue 41 on stories260K at equal tokens: each lever trains EAGLE-3 from
recipes/debug/eagle3-stories260k.yaml (the same regenerated answers, seed, steps and batch), held-out
acc_0 / acc_1 / acc_2 at a third, two thirds and the end of the run, wall time, training tokens/s,
tau(k=3) from the last held-out acc_i, and `draftsmith plan`'s prediction of the end-of-run acc_0 from
the evaluations in the first third of the tokens (report/learning_curve.py).

    OMP_NUM_THREADS=1 python benchmarks/bench_levers.py --regenerated runs/learnfast/regenerated.jsonl
    python benchmarks/bench_levers.py --levers base anchors_0.25 --steps 30     # smoke run

--text-agreement CACHE reads a top-K feature cache (features.label_topk) and says how far its answers stand from
the target that built it (docs/training.md "On-policy rounds"): the share of answer positions whose next token is
the cached target argmax, how many answers stay on that greedy path to their end, and where the others leave it.

    python benchmarks/bench_levers.py --text-agreement runs/smollm2-regen128/features-top20 --first-rows 1584

A lever whose run directory already holds a final checkpoint is not retrained (delete it to redo it).

--step-cost times one training step (EAGLE-3 forward_loss + backward, batch 8 x 160 tokens of the
stories260K target's own features, recipe shape: 5 TTT steps) per drafter option set, interleaved,
minimum and median of --repeats: robust to other jobs on the machine, unlike a run's tokens/s.

    OMP_NUM_THREADS=1 python benchmarks/bench_levers.py --step-cost --repeats 20

--topk-cost K times one EAGLE-3 training step from offline features with and without features.label_topk K:
the lm_head replay (features.complete -> [b, s, V] logits -> soft_labels) against the cached top-K
(features.complete -> TopKLogits -> soft_labels), each followed by forward_loss + backward, interleaved, on a
SmolLM2-135M-shaped random target (vocab 49,152, hidden 576, 4 layers: depth does not enter the step; draft
vocabulary 8,192, 3 TTT steps, as recipes/cpu/eagle3-smollm2-135m.yaml) and on stories260K (vocab 512). The
"labels" columns time the label part alone (features.complete + soft_labels).

    OMP_NUM_THREADS=1 python benchmarks/bench_levers.py --topk-cost 20 --repeats 10 --batch 4 --length 256
    OMP_NUM_THREADS=1 python benchmarks/bench_levers.py --topk-cost 20 --precision bf16   # the SmolLM2 recipe's

--precision bf16 runs forward_loss under bf16 autocast as train.precision bf16 does (features.complete, the
replay included, stays outside it, as in train/loop.py).

--coverage prints, per draft vocabulary size, the share of the training and held-out label tokens (the
target's regenerated answers) that the draft vocabulary (the most frequent training labels) holds: an
upper bound of what a drafter with that vocabulary can ever be accepted on.

    python benchmarks/bench_levers.py --coverage --sizes 64 128 256 384 512
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.report import learning_curve as lc  # noqa: E402
from draftsmith.report.speedup_model import expected_tau  # noqa: E402

LEVERS = {
    "base": [],                                                     # the recipe: soft/hard mix w = 0.5, T = 1
    "warm_target_zeros": ["drafter.layer_init=target"],            # (a) q/k/v embedding half zeros
    "warm_target_copy": ["drafter.layer_init=target", "drafter.layer_init_embed_half=copy"],
    "soft_only": ["drafter.hard_label_weight=0.0"],                # (b) teacher signal
    "hard_only": ["drafter.hard_label_weight=1.0"],
    "soft_T2": ["drafter.hard_label_weight=0.0", "drafter.label_temperature=2.0"],
    "anchors_0.25": ["drafter.ttt_anchor_fraction=0.25"],          # (d) compute per token
    "anchors_0.5": ["drafter.ttt_anchor_fraction=0.5"],
    "vocab_256": ["drafter.draft_vocab_size=256"],                 # (e) draft vocabulary (full: 512)
    "warm_anchors_0.25": ["drafter.layer_init=target", "drafter.ttt_anchor_fraction=0.25"],  # (a) + (d)
}


def train(name: str, overrides: list[str], args) -> float:
    out = Path(args.out) / name
    if (out / "final").exists():
        return json.loads((out / "wall.json").read_text())["wall_s"]
    cmd = [sys.executable, "-m", "draftsmith", "train", args.recipe, f"train.output_dir={out}",
           f"regenerate.output={args.regenerated}", f"train.max_steps={args.steps}",
           f"train.log_every={args.eval_every}", f"train.eval_every={args.eval_every}", f"train.seed={args.seed}",
           "--overwrite", *overrides]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    (out / "wall.json").write_text(json.dumps({"wall_s": wall, "command": cmd}))
    return wall


def at_fraction(points, fraction):
    goal = points[-1].tokens * fraction
    return min(points, key=lambda p: abs(p.tokens - goal))


def row(name: str, wall: float, args) -> dict:
    run = Path(args.out) / name
    points, _ = lc.read_points(run)
    speeds = [json.loads(line).get("tokens_per_s_total") for line in (run / "metrics.jsonl").read_text().splitlines()]
    speed = statistics.median(s for s in speeds if isinstance(s, (int, float)))
    end = points[-1]
    first = [p for p in points if p.tokens <= end.tokens / 3 + 1]
    try:
        predicted = lc.make_plan(first, speed, [3]).curves[0].at(end.tokens)
    except Exception as exc:  # too few points in the first third
        predicted = float("nan")
        print(f"{name}: no prediction ({exc})", file=sys.stderr)
    return {"lever": name, "overrides": LEVERS[name], "tokens": end.tokens, "wall_s": wall, "tokens_per_s": speed,
            "acc_third": list(at_fraction(points, 1 / 3).acc[:3]), "acc_two_thirds": list(at_fraction(points, 2 / 3).acc[:3]),
            "acc_end": list(end.acc[:3]), "tau_k3": expected_tau(list(end.acc), 3)[0],
            "acc0_end_predicted_from_first_third": predicted}


STEP_COST = {"base": {}, "anchors_0.5": {"ttt_anchor_fraction": 0.5}, "anchors_0.25": {"ttt_anchor_fraction": 0.25},
             "vocab_256": {"draft_vocab_size": 256}}


def step_cost(repeats: int) -> None:
    import torch

    from draftsmith.data import features
    from draftsmith.heads.eagle3 import Eagle3Drafter
    from draftsmith.targets import load

    target = load.load(str(REPO.parent / "shared" / "models" / "stories260K-hf"))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, target.vocab_size, (8, 160), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    drafters = {}
    for name, options in STEP_COST.items():
        torch.manual_seed(0)
        d = Eagle3Drafter.from_target(Eagle3Drafter.Config(ttt_steps=5, **options), target, torch.ones(target.vocab_size))
        drafters[name] = (d, features.complete(target, dict(batch), set(d.required_features), d.feature_layers()))
    times = {name: [] for name in drafters}
    for r in range(repeats + 2):
        for name, (d, b) in drafters.items():  # interleaved: a burst of load hits every option alike
            t0 = time.perf_counter()
            d.forward_loss(b).loss.backward()
            if r >= 2:
                times[name].append(time.perf_counter() - t0)
            d.zero_grad(set_to_none=True)
    base = min(times["base"])
    for name, ts in times.items():
        print(f"| {name} | {min(ts) * 1e3:.1f} ms | {statistics.median(ts) * 1e3:.1f} ms | {min(ts) / base:.2f} |")


def smollm2_shaped_target(num_layers: int = 4):
    """A random Llama shaped like SmolLM2-135M (vocab 49,152, hidden 576, 9 heads / 3 kv heads, intermediate
    1,536, tied embeddings) with num_layers layers: the lm_head replay costs what SmolLM2's does."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.targets.load import Target
    from draftsmith.testing import byte_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=num_layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return Target(LlamaForCausalLM(cfg).eval(), byte_tokenizer(), name=f"smollm2-shaped-{num_layers}x576")


def topk_cost(k: int, repeats: int, batch: int, length: int, precision: str = "fp32") -> None:
    """Per-step cost of an EAGLE-3 step from offline features, lm_head replay against cached top-K logits."""
    import contextlib

    import torch

    from draftsmith.data import features
    from draftsmith.heads import vocab_loss
    from draftsmith.heads.eagle3 import Eagle3Drafter
    from draftsmith.targets import load

    shapes = {"smollm2-shaped": (smollm2_shaped_target, 8192, 3),
              "stories260K": (lambda: load.load(str(REPO.parent / "shared" / "models" / "stories260K-hf")), None, 5)}
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    print(f"batch {batch} x {length} tokens, K = {k}, target float32, drafter {precision}, "
          f"torch threads {torch.get_num_threads()}")
    print("| target | V | step, replay (min / median) | step, top-K (min / median) | step ratio "
          "| labels, replay | labels, top-K | labels ratio |")
    for name, (make, dv, ttt) in shapes.items():
        target = make()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, target.vocab_size, (batch, length), generator=g)
        base = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
        torch.manual_seed(0)
        d = Eagle3Drafter.from_target(Eagle3Drafter.Config(ttt_steps=ttt, draft_vocab_size=dv), target,
                                      torch.arange(target.vocab_size, 0, -1).float())
        required, layers = set(d.required_features), d.feature_layers()
        with torch.no_grad():  # what the offline cache holds for these rows
            out = target.forward(ids, attention_mask=base["attention_mask"])
            aux = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
            top_ids, top_values = features.top_logits(out.logits, k)
            cached = {"dense": {**base, "aux_hidden_states": aux, "last_hidden_state": out.hidden_states[-1]},
                      "topk": {**base, "aux_hidden_states": aux, "label_topk_ids": top_ids,
                               "label_topk_values": top_values}}
            del out
        step = {v: [] for v in cached}
        labels = {v: [] for v in cached}
        for r in range(repeats + 2):
            for variant, rows in cached.items():  # interleaved: a burst of load hits both alike
                t0 = time.perf_counter()
                b = features.complete(target, dict(rows), required, layers)
                vocab_loss.soft_labels(b["target_logits"], d.draft_ids(), d.cfg.loss_chunk or length)
                t1 = time.perf_counter()
                b = features.complete(target, dict(rows), required, layers)
                with autocast():
                    loss = d.forward_loss(b).loss
                loss.backward()
                t2 = time.perf_counter()
                d.zero_grad(set_to_none=True)
                if r >= 2:
                    labels[variant].append(t1 - t0)
                    step[variant].append(t2 - t1)
        cell = {v: f"{min(t) * 1e3:.0f} / {statistics.median(t) * 1e3:.0f} ms" for v, t in step.items()}
        lab = {v: f"{statistics.median(t) * 1e3:.1f} ms" for v, t in labels.items()}
        print(f"| {name} | {target.vocab_size:,} | {cell['dense']} | {cell['topk']} | "
              f"{statistics.median(step['dense']) / statistics.median(step['topk']):.2f} | {lab['dense']} | "
              f"{lab['topk']} | {statistics.median(labels['dense']) / statistics.median(labels['topk']):.1f} |",
              flush=True)


def coverage(args) -> None:

    from draftsmith import config, data
    from draftsmith.data import draft_vocab
    from draftsmith.targets import load

    cfg = config.load(args.recipe, [f"regenerate.output={args.regenerated}"])
    target = load.load(cfg.target.path)
    train_set, heldout, _ = data.build_dataset(data.training_data_config(cfg), target.tokenizer)
    counts = data.token_counts(train_set, target.vocab_size)
    held = data.token_counts(heldout, target.vocab_size)
    for dv in args.sizes:
        _, t2d = draft_vocab.build(counts, dv)
        print(f"| {dv} | {float(counts[t2d].sum() / counts.sum()):.4f} | {float(held[t2d].sum() / held.sum()):.4f} |")


def text_agreement(rows) -> dict:
    """rows: items with input_ids [s], loss_mask [s] and label_topk_ids [s, K] (the cache's). The target's argmax at
    position j (label_topk_ids[j, 0]) against the text's token j + 1, at every answer position (loss_mask[j + 1]):
    the share that agree, the answers that agree at all their positions, and, for the others, the quartiles of the
    answer-token index (0-based, among the row's answer positions) of the first disagreement. Rows without an
    answer position are counted apart."""
    agree = total = whole = empty = 0
    first_miss = []
    for item in rows:
        answer = item["loss_mask"][1:].bool()
        if not bool(answer.any()):
            empty += 1
            continue
        same = (item["label_topk_ids"][:-1, 0].long() == item["input_ids"][1:].long())[answer]
        agree, total = agree + int(same.sum()), total + same.numel()
        if bool(same.all()):
            whole += 1
        else:
            first_miss.append(int((~same).nonzero()[0]))
    return {"answer_tokens": total, "argmax_agreement": agree / max(total, 1), "rows": whole + len(first_miss),
            "rows_without_answer": empty, "rows_on_the_greedy_path": whole,
            "first_departure_quartiles": statistics.quantiles(first_miss, n=4) if len(first_miss) > 1 else first_miss}


def text_agreement_of_cache(cache_dir: str, first_rows: int | None = None) -> None:
    from draftsmith.data import feature_cache, feature_manifest

    root = Path(cache_dir)
    manifest = feature_manifest.read_manifest(root)
    if manifest is None or manifest.get("label_topk") is None:
        raise SystemExit(f"{root}: not a feature cache with top-K logits (build one with features.label_topk: K)")
    # ids are int32: any bound above 2**31 only checks that they are not negative
    rows = feature_cache.CachedDataset(root, manifest, topk_vocab=2 ** 31)
    if first_rows is not None:
        rows = rows.subset(0, min(first_rows, len(rows)))
    print(json.dumps({"cache": str(root), "target": manifest.get("target"), "rows_read": len(rows),
                      "build_dtype": sorted({s.get("build_dtype") for s in manifest["shards"]} - {None}),
                      **text_agreement(rows)}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    ap.add_argument("--recipe", default="recipes/debug/eagle3-stories260k.yaml")
    ap.add_argument("--regenerated", default="runs/learnfast/regenerated.jsonl")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--out", default="runs/levers")
    ap.add_argument("--seed", type=int, default=0, help="train.seed (the recipe's default is 0)")
    ap.add_argument("--step-cost", action="store_true", help="time one training step per option set (no training)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--coverage", action="store_true", help="draft vocabulary coverage per --sizes (no training)")
    ap.add_argument("--topk-cost", type=int, metavar="K", help="time an EAGLE-3 step, lm_head replay against "
                    "features.label_topk K (no training)")
    ap.add_argument("--batch", type=int, default=4, help="--topk-cost: rows per step")
    ap.add_argument("--length", type=int, default=256, help="--topk-cost: tokens per row")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="--topk-cost: the drafter's autocast")
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 384, 512])
    ap.add_argument("--text-agreement", metavar="CACHE", help="a top-K feature cache: its answers against the "
                    "argmax of the target that built it (no training)")
    ap.add_argument("--first-rows", type=int, help="--text-agreement: only the cache's first N rows (e.g. the "
                    "training rows, without the held-out ones at the end)")
    args = ap.parse_args()
    if args.text_agreement:
        text_agreement_of_cache(args.text_agreement, args.first_rows)
        return 0
    if args.coverage:
        coverage(args)
        return 0
    if args.step_cost:
        step_cost(args.repeats)
        return 0
    if args.topk_cost:
        topk_cost(args.topk_cost, args.repeats, args.batch, args.length, args.precision)
        return 0
    rows = []
    for name in args.levers:
        rows.append(row(name, train(name, LEVERS[name], args), args))
        r = rows[-1]
        print(f"| {name} | {r['tokens'] / 1e6:.3f}M | " + " | ".join("/".join(f"{a:.3f}" for a in r[k])
              for k in ("acc_third", "acc_two_thirds", "acc_end")) +
              f" | {r['tau_k3']:.2f} | {r['wall_s']:.0f} s | {r['tokens_per_s']:.0f} | "
              f"{r['acc0_end_predicted_from_first_third']:.3f} |", flush=True)
    Path(args.out, "levers.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
