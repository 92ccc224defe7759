"""`draftsmith train RECIPE --nproc N`: re-launch the same command under torchrun on this node.

    draftsmith train recipes/eagle3-llama3.1-8b.yaml --nproc 8
is the same as
    torchrun --standalone --nproc-per-node 8 -m draftsmith train recipes/eagle3-llama3.1-8b.yaml
Multi-node runs call torchrun directly (see docs/distributed.md).
"""
from __future__ import annotations

import os
import subprocess
import sys

from draftsmith import config


def torchrun_command(nproc: int, recipe: str, overrides: list[str], overwrite: bool = False,
                     api_key_env: str | None = None) -> list[str]:
    """The torchrun command line `--nproc N` runs (one node, a free rendezvous port)."""
    flags = (["--overwrite"] if overwrite else []) + (["--api-key-env", api_key_env] if api_key_env else [])
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "draftsmith", "train", recipe, *flags, *overrides]


def relaunch_under_torchrun(nproc: int, recipe: str, overrides: list[str], overwrite: bool = False,
                            api_key_env: str | None = None) -> int:
    """Run the recipe on nproc processes of this node; returns torchrun's exit status."""
    if "WORLD_SIZE" in os.environ:
        print("--nproc given inside a torchrun launch; drop --nproc (torchrun already set the processes)",
              file=sys.stderr)
        return 2
    cfg = config.load(recipe, overrides)
    if cfg.train.backend == "single":
        print(f"{recipe}: --nproc {nproc} needs a distributed backend; add train.backend=ddp (or fsdp2, deepspeed)",
              file=sys.stderr)
        return 2
    cmd = torchrun_command(nproc, recipe, overrides, overwrite, api_key_env)
    print("launching: " + " ".join(cmd[1:]), flush=True)
    return subprocess.run(cmd, check=False).returncode
