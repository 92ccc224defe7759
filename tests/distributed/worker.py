"""Run under torchrun by test_multiprocess.py: trains the same tiny recipe with one backend on N ranks.

    torchrun --standalone --nproc-per-node 2 tests/distributed/worker.py WORKDIR BACKEND [ZERO_STAGE]

Writes WORKDIR/result-BACKEND.json on rank 0: the uninterrupted losses, the losses of a run
interrupted after step 3 and resumed from its step-2 checkpoint, the final checkpoint path, and the
wall time and tokens/s of the uninterrupted run.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_setup import recipe  # noqa: E402

from draftsmith.train import parallel  # noqa: E402
from draftsmith.train.loop import Trainer  # noqa: E402


def main() -> None:
    workdir, backend = Path(sys.argv[1]), sys.argv[2]
    extra = [f"train.deepspeed.zero_stage={sys.argv[3]}"] if len(sys.argv) > 3 else []
    torch.set_num_threads(1)
    name = backend + (f"-z{sys.argv[3]}" if extra else "")
    over = [f"train.backend={backend}", *extra]

    start = time.perf_counter()
    full_trainer = Trainer(recipe(workdir, f"{name}-full", *over))
    full = full_trainer.run()
    wall = time.perf_counter() - start
    tokens = full_trainer.ctx.all_reduce_sum(torch.tensor(float(full_trainer.stream.position)))  # sanity: ranks ran

    Trainer(recipe(workdir, f"{name}-cut", *over, "train.save_every=2")).run(stop_after=3)
    resumed = Trainer(recipe(workdir, f"{name}-cut", *over, "train.save_every=2", "train.resume=true")).run()

    sharded = None
    if backend == "fsdp2":  # the frozen target sharded with FSDP2 per decoder layer
        from draftsmith.targets import load as target_mod

        cfg = recipe(workdir, f"{name}-sharded-target", *over)
        ctx = parallel.setup(cfg.train, torch.device("cpu"))
        target = target_mod.from_config(cfg.target)
        parallel.shard_target(ctx, target)
        sharded = Trainer(cfg, target).run().losses

    if full_trainer.ctx.is_main:
        out = {"losses": full.losses, "resumed": resumed.losses, "final": str(full.final_checkpoint),
               "sharded_target": sharded, "wall_s": wall, "world_size": full_trainer.ctx.world_size,
               "positions": float(tokens), "tokens_per_s": full.last_metrics.get("tokens_per_s"),
               "tokens_per_s_total": full.last_metrics.get("tokens_per_s_total")}
        (workdir / f"result-{name}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
