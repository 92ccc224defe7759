"""Round by round: what draftsmith's block drafter drafts against what llama.cpp's draft-dflash drafts, on
the same prompt, and how close the draft's top-2 logits were wherever the two differ (a near tie that
the two f32 implementations break differently, or a real difference in what is computed).

    python benchmarks/lab/diag_llamacpp_rounds.py runs/dflash-stories260k/final exported/llamacpp-dflash \
        --workload mt_bench --ids mt_bench-81,mt_bench-121 --k 5 [--f32-cache]

llama-server runs with LLAMA_TRACE=1 and -v, whose log prints each drafted slot's top-3 candidates
("draft candidate C, pos P: ID (p)", common/speculative.cpp) and each round's "accepted A/N draft
tokens" (tools/server/server-context.cpp). Rounds are compared while both loops are on the same
trajectory (the first difference changes every later context). DFlash only (its slots are the block's
logits directly; DSpark adds the Markov chain).
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import torch

from draftsmith.checkpoint import load_drafter
from draftsmith.core.sampling import SamplingParams
from draftsmith.eval import proposers, workloads
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.export.llamacpp.layouts import read_export_dir
from draftsmith.export.llamacpp.tools import LlamaServer, find_llama_cpp


class TracedServer(LlamaServer):
    extra: list[str] = []

    def command(self) -> list[str]:
        return super().command() + ["-v", *self.extra]

    def complete_with_log(self, ids: list[int], max_tokens: int) -> tuple[dict, str]:
        reply = self.complete(ids, max_tokens)
        return reply, Path(self._log.name).read_text(errors="replace")


def engine_rounds(log: str) -> list[tuple[list[int], int]]:
    """(drafted ids, accepted) per round from a -v / LLAMA_TRACE=1 log."""
    drafts, current = [], []
    for cand, pos, tok in re.findall(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+)", log):
        if cand != "0":
            continue
        if pos == "0" and current:
            drafts.append(current)
            current = []
        current.append(int(tok))
    drafts.append(current)
    accepted = [int(a) for a in re.findall(r"\| accepted\s+(\d+)/\s*\d+ draft tokens\s*$", log, re.M)]
    return list(zip(drafts, accepted))


def draftsmith_rounds(target, proposer, ids, k: int, max_new: int):
    """(context, drafted ids, block logits [B, dv], accepted) per round of draftsmith's loop."""
    seen, original = [], proposer.propose

    def recording(context, kk, sampling, generator=None):
        draft = original(context, kk, sampling, generator)
        seen.append((context.clone(), draft.tokens.tolist(), proposer.block_logits(context).detach()))
        return draft

    proposer.propose = recording
    gen = generate(target, proposer, ids, LoopConfig(k=k, max_new_tokens=max_new, sampling=SamplingParams(), eos_ids=[]))
    proposer.propose = original
    return [(*s, r.accepted) for s, r in zip(seen, gen.rounds)], gen.tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("export_dir")
    p.add_argument("--workload", default="mt_bench")
    p.add_argument("--ids", required=True, help="comma-separated workload item ids")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--f32-cache", action="store_true", help="llama-server's KV caches in f32 (default f16)")
    args = p.parse_args()
    loaded = load_drafter(args.checkpoint)
    target, drafter = loaded.target, loaded.drafter
    fmt = workloads.training_prompt_format(workloads.checkpoint_recipe(args.checkpoint), target.tokenizer)
    proposer = proposers.from_drafter(drafter, target)
    side, tools = read_export_dir(args.export_dir), find_llama_cpp()
    os.environ["LLAMA_TRACE"] = "1"
    TracedServer.extra = ["-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32"] if args.f32_cache else []
    for item in workloads.load(args.workload, None, None):
        if item["id"] not in args.ids.split(","):
            continue
        ids, _ = workloads.encode(item, target.tokenizer, fmt, None)
        ours, tokens = draftsmith_rounds(target, proposer, ids, args.k, args.max_new_tokens)
        with TracedServer(tools, Path(side["target"]), draft=Path(side["draft"]), spec_type=side["spec_type"],
                          k=args.k) as srv:
            reply, log = srv.complete_with_log(ids.reshape(-1).tolist(), args.max_new_tokens)
        theirs = engine_rounds(log)
        print(f"{item['id']}: draftsmith {len(ours)} rounds, llama.cpp {len(theirs)}; "
              f"same output {tokens == reply['tokens']}")
        for r, ((context, drafted, logits, acc), (eng, eng_acc)) in enumerate(zip(ours, theirs)):
            n = min(len(drafted), len(eng))
            slot = next((i for i in range(n) if drafted[i] != eng[i]), None)
            if slot is None and acc == eng_acc:
                continue
            top = logits[1 + (slot or 0)].topk(2)  # DFlash: draft i is block slot i + 1
            margin = float(top.values[0] - top.values[1])
            print(f"  round {r} (context {len(context)}): draftsmith {drafted} accepted {acc} | llama.cpp {eng} "
                  f"accepted {eng_acc} | first differing slot {slot}, draftsmith's top-2 logit margin there "
                  f"{margin:.5f} (ids {top.indices.tolist()})")
            if acc != eng_acc:
                break  # a different number accepted: later rounds run on different contexts


if __name__ == "__main__":
    with torch.no_grad():
        main()
