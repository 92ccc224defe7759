"""`draftsmith plan RUN [--goal-tau T] [--k K]`: the run's learning curve (held-out acceptance per draft
position against training tokens, from RUN/metrics.jsonl), tau and speedup per k, and how many more
tokens and hours a tau goal needs (draftsmith/report/learning_curve.py has the model).

    draftsmith plan runs/eagle3-stories260k
    draftsmith plan runs/eagle3-stories260k --goal-tau 2.5 --k 3
    draftsmith plan runs/NAME --upto-tokens 250000      # fit the first part of a run only
    draftsmith plan runs/NAME --plot curve.png           # the points, the fitted curves and their bands
    draftsmith plan runs/NAME --workload mt_bench --goal-tau 1.8   # the loop's contexts (train.workload_eval)

The speedup column needs costs: RUN/speedup_profile.json or RUN/final/speedup_profile.json
(`draftsmith profile RUN/final`), read at batch 1 for its first workload (with --workload, that workload's
entry; none when the profile did not measure it).
"""
from __future__ import annotations

from pathlib import Path

from draftsmith.core.bounds import check_draft_tokens
from draftsmith.core.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("run", help="a training run directory (train.output_dir) holding metrics.jsonl")
    p.add_argument("--goal-tau", type=float, default=None, help="the acceptance length wanted (tau, 1..k+1)")
    p.add_argument("--k", type=int, default=None, help="draft tokens per round for the goal (default: 3, or the "
                                                       "profile's recommended k)")
    p.add_argument("--upto-tokens", type=float, default=None,
                   help="fit only the evaluations at or below this many tokens seen, and print the fit's prediction "
                        "against the run's last evaluation (to check a prediction)")
    p.add_argument("--workload", default=None, metavar="NAME",
                   help="fit the drafter's acceptance on this workload's prompts (the target's own greedy answers, the "
                        "contexts draftsmith's loop sees; logged when the recipe sets train.workload_eval) instead of "
                        "the held-out rows")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="also draw the held-out points and each position's fitted curve with its band to this PNG")


def main(args) -> int:
    from draftsmith.report import learning_curve as lc

    run = Path(args.run)
    if args.k is not None:
        check_draft_tokens(args.k, "--k")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        raise UserError(f"--plot {args.plot}: the picture is a PNG; give a path ending in .png")
    if args.goal_tau is not None and not args.goal_tau >= 1:
        raise UserError(f"--goal-tau {args.goal_tau}: must be >= 1 (tau counts the committed tokens per round)")
    points, speed = lc.read_points(run, args.workload)
    series = args.workload or "held-out"
    later = []
    if args.upto_tokens is not None:
        later = [p for p in points if p.tokens > args.upto_tokens]
        points = [p for p in points if p.tokens <= args.upto_tokens]
    speedup_at, k_default = _profile_speedup(run, args.workload)
    k = args.k or k_default or 3
    if args.goal_tau is not None and args.goal_tau > k + 1:
        raise UserError(f"--goal-tau {args.goal_tau:g}: above k + 1 = {k + 1}, the most tau a round of k={k} can commit")
    plan = lc.make_plan(points, speed, sorted({1, 2, 3, 4, 5, k}), args.goal_tau, k, speedup_at, where=str(run),
                        series=series)
    print(lc.report(plan))
    for line in lc.check_lines(plan, later):
        print(line)
    if args.plot is not None:
        from draftsmith.report import plots

        goal = plan.goal_tokens if plan.goal_tokens and plan.goal_tokens < 100 * points[-1].tokens else None
        print(f"picture: {plots.learning_curve(plan, later, args.plot, f'{run.name}: {series} acceptance', goal)}")
    return 0


def _profile_speedup(run: Path, workload: str | None = None):
    """(speedup_at(acceptance, k) at batch 1 from the run's speedup profile, its recommended k), or (None, None).
    The profile's entry for `workload` when it measured one, else its first."""
    from draftsmith.checkpoint import read_speedup_profile
    from draftsmith.eval import profile as profile_mod

    found = next(((w, p) for w in (run, run / "final") if w.is_dir() for p in [read_speedup_profile(w)] if p), None)
    if found is None:  # the run's own profile first, then its final checkpoint's
        return None, None
    where, profile = found
    try:
        measured = profile["acceptance"]
        if workload is not None:  # that workload's entry, or no speedup (another workload's costs would mislead)
            from draftsmith.report.learning_curve import metric_key

            name = next((n for n in measured if metric_key(n) == metric_key(workload)), None)
            if name is None:
                return None, None
        else:
            name = next(iter(measured))
        acc = measured[name]
        context = profile["recommendation"][name]["context"]
        table = profile["verify_cost"]
        k_max = int(profile["settings"]["k_max"])
    except (KeyError, TypeError, StopIteration, ValueError) as exc:
        raise UserError(f"{where}/speedup_profile.json: no acceptance / verify_cost / recommendation to read "
                        f"({exc!r:.60}); rerun `draftsmith profile`") from None

    def speedup_at(acceptance, k):
        if k > k_max:  # the profile measured verification widths up to k_max + 1 only
            return float("nan")
        return profile_mod.predict({**acc, "per_position": acceptance}, table, 1, k, context)["speedup"]

    return speedup_at, profile.get("recommended_num_speculative_tokens") or None
