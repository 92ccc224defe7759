"""The learn-fast levers of issue 41 on stories260K at equal tokens: each lever trains EAGLE-3 from
recipes/debug/eagle3-stories260k.yaml (the same regenerated answers, seed, steps and batch), held-out
acc_0 / acc_1 / acc_2 at a third, two thirds and the end of the run, wall time, training tokens/s,
tau(k=3) from the last held-out acc_i, and `draftsmith plan`'s prediction of the end-of-run acc_0 from
the evaluations in the first third of the tokens (report/learning_curve.py).

    OMP_NUM_THREADS=1 python benchmarks/bench_levers.py --regenerated runs/learnfast/regenerated.jsonl
    python benchmarks/bench_levers.py --levers base anchors_0.25 --steps 30     # smoke run

A lever whose run directory already holds a final checkpoint is not retrained (delete it to redo it).
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
}


def train(name: str, overrides: list[str], args) -> float:
    out = Path(args.out) / name
    if (out / "final").exists():
        return json.loads((out / "wall.json").read_text())["wall_s"]
    cmd = [sys.executable, "-m", "draftsmith", "train", args.recipe, f"train.output_dir={out}",
           f"regenerate.output={args.regenerated}", f"train.max_steps={args.steps}",
           f"train.log_every={args.eval_every}", f"train.eval_every={args.eval_every}", "--overwrite", *overrides]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    ap.add_argument("--recipe", default="recipes/debug/eagle3-stories260k.yaml")
    ap.add_argument("--regenerated", default="runs/learnfast/regenerated.jsonl")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--out", default="runs/levers")
    args = ap.parse_args()
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
