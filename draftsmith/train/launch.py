"""`draftsmith train RECIPE --nproc N`: re-launch the same command under torchrun on this node.

    draftsmith train recipes/eagle3-llama3.1-8b.yaml --nproc 8
is the same as
    torchrun --standalone --nproc-per-node 8 -m draftsmith train recipes/eagle3-llama3.1-8b.yaml
A recipe that names no train.backend runs with ddp under --nproc; one that sets single is refused.
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


def backend_given(recipe: str, overrides: list[str]) -> bool:
    """Whether the recipe file or an override sets train.backend (the default is single)."""
    from draftsmith.core.files import MAX_YAML_BYTES, read_received_text
    from draftsmith.core.safe_yaml import load as load_yaml

    raw = load_yaml(read_received_text(recipe, "recipe", MAX_YAML_BYTES), recipe) or {}
    in_file = isinstance(raw.get("train"), dict) and "backend" in raw["train"]
    return in_file or any(o.split("=", 1)[0].strip() == "train.backend" for o in overrides)


def relaunch_under_torchrun(nproc: int, recipe: str, overrides: list[str], overwrite: bool = False,
                            api_key_env: str | None = None) -> int:
    """Run the recipe on nproc processes of this node; returns torchrun's exit status."""
    if "WORLD_SIZE" in os.environ:
        print("--nproc given inside a torchrun launch; drop --nproc (torchrun already set the processes)",
              file=sys.stderr)
        return 2
    cfg = config.load(recipe, overrides)
    if cfg.train.backend == "single":
        if backend_given(recipe, overrides):
            print(f"{recipe}: --nproc {nproc} needs a distributed backend, but train.backend is single; set "
                  "train.backend=ddp (or fsdp2, deepspeed)", file=sys.stderr)
            return 2
        overrides = [*overrides, "train.backend=ddp"]  # the recipe names no backend: plain data parallel
        print(f"--nproc {nproc}: the recipe sets no train.backend; using train.backend=ddp", flush=True)
    cmd = torchrun_command(nproc, recipe, overrides, overwrite, api_key_env)
    print("launching: " + " ".join(cmd[1:]), flush=True)
    return subprocess.run(cmd, check=False).returncode
