"""Run by test_meta_load.py under torchrun: load the target in one way, report the peak memory.

    torchrun --standalone --nproc-per-node N tests/distributed/meta_load_worker.py TARGET_DIR OUT.json MODE

MODE replicate: target.load (every rank the whole model); fsdp2: sharded_load.load_target_sharded.
Peak memory = the rise of this process's peak RSS (ru_maxrss) over the load and a read of every
weight the rank holds (a loader may leave files memory-mapped until first use), after all imports.
Rank 0 writes {"peaks": [bytes per rank], "fingerprint", "logits": [first values of a forward]}.
"""
from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard  # noqa: F401  (imported before the baseline)
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from draftsmith.targets import load as target_mod  # noqa: E402
from draftsmith.train import sharded_load  # noqa: E402
from draftsmith.train.parallel import destroy_process_group  # noqa: E402


def main() -> None:
    target_dir, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    tcfg = SimpleNamespace(path=target_dir, dtype="float32", device="cpu", revision=None, trust_remote_code=False,
                           gguf_file=None)
    with torch.device("meta"):  # warm-up: lazy imports (modeling code, tokenizer) happen before the baseline
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(target_dir))
    AutoTokenizer.from_pretrained(target_dir)
    dist.barrier()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if mode == "replicate":
        target = target_mod.load(target_dir, "float32", "cpu")
    else:
        target = sharded_load.load_target_sharded(SimpleNamespace(device=torch.device("cpu")), tcfg)
    touched = 0.0
    for p in target.model.parameters():  # read every weight this rank holds (a loader may leave files mmapped)
        touched += float((p.to_local() if hasattr(p, "to_local") else p).float().sum())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    ids = torch.arange(3, 19).view(1, -1)
    logits = target.forward(ids).logits[0, :4, :8].flatten().tolist()
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"peaks": peaks, "fingerprint": target.fingerprint, "logits": logits}))
    destroy_process_group()


if __name__ == "__main__":
    main()
