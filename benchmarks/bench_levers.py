"""The learn-fast levers of issue 41 on stories260K at equal tokens: each lever trains EAGLE-3 from
recipes/debug/eagle3-stories260k.yaml (the same regenerated answers, seed, steps and batch), held-out
acc_0 / acc_1 / acc_2 at a third, two thirds and the end of the run, wall time, training tokens/s,
tau(k=3) from the last held-out acc_i, and `draftsmith plan`'s prediction of the end-of-run acc_0 from
the evaluations in the first third of the tokens (report/learning_curve.py).

    OMP_NUM_THREADS=1 python benchmarks/bench_levers.py --regenerated runs/learnfast/regenerated.jsonl
    python benchmarks/bench_levers.py --levers base anchors_0.25 --steps 30     # smoke run

A lever whose run directory already holds a final checkpoint is not retrained (delete it to redo it).

--step-cost times one training step (EAGLE-3 forward_loss + backward, batch 8 x 160 tokens of the
stories260K target's own features, recipe shape: 5 TTT steps) per drafter option set, interleaved,
minimum and median of --repeats: robust to other jobs on the machine, unlike a run's tokens/s.

    OMP_NUM_THREADS=1 python benchmarks/bench_levers.py --step-cost --repeats 20

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
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 384, 512])
    args = ap.parse_args()
    if args.coverage:
        coverage(args)
        return 0
    if args.step_cost:
        step_cost(args.repeats)
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
