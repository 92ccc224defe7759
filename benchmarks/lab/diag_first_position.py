"""Where a trained drafter's first draft token fails, beside the n-gram proposer, round by round.

Runs the drafter in the speculative loop at k = 1 (greedy), so every round drafts exactly the next
token after the committed context. For the same context it asks the n-gram proposer (prompt lookup,
the rule `draftsmith eval --proposer ngram` uses) for its first token, offline: the output is the
target's own greedy continuation either way (the loop is lossless), so both are judged against the
same token. Per workload it prints the 2 x 2 table of rounds (drafter right / wrong x n-gram right /
wrong / no n-gram match) and writes it as JSON.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/lab/diag_first_position.py \
        runs/eagle3-gemma3-270m-regen/final --num-prompts 5 --max-new-tokens 64 --out /tmp/first.json

"Copyable" rounds (n-gram right) that the drafter misses say it has not learned to copy from its
context; rounds neither gets say the token is hard for both. With --answers FILE (a regenerated
answers JSONL, e.g. runs/gemma3-regen/answers.jsonl) it also prints how often the n-gram proposer
predicts the next answer token of the TRAINING data in draftsmith's plain format (every
--answers-stride-th row): what a drafter that had learned to copy would get there.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from draftsmith.checkpoint import load_drafter
from draftsmith.core.sampling import SamplingParams
from draftsmith.eval import proposers, workloads
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.eval.proposers import NgramProposer


def round_table(gen, prompt: torch.Tensor, ngram: NgramProposer, in_vocab: set | None) -> Counter:
    """Counter over (drafter, ngram) outcomes of every round that drafted a token; with a draft
    vocabulary (in_vocab), also ("off_draft_vocab", ngram) for rounds whose right token lies outside it."""
    new = gen.tokens
    table: Counter = Counter()
    pos = 1  # new token 0 comes from the prefill
    for r in gen.rounds:
        if r.proposed and pos < len(new):
            context = torch.cat([prompt.view(-1), torch.tensor(new[:pos], dtype=torch.long)])
            guess = ngram.propose(context, 1, SamplingParams()).tokens
            ng = "none" if guess.numel() == 0 else ("right" if int(guess[0]) == new[pos] else "wrong")
            table[("right" if r.accepted else "wrong", ng)] += 1
            if in_vocab is not None and new[pos] not in in_vocab:
                table[("off_draft_vocab", ng)] += 1
        pos += r.committed
    return table


def ngram_on_answers(path: Path, tokenizer, stride: int) -> tuple[int, int]:
    """(positions, n-gram right) over the answer tokens after the first, of every stride-th row."""
    from draftsmith.data.chat import render_plain

    ngram, right, total = NgramProposer(), 0, 0
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows[::stride]:
        messages = row["messages"]
        prompt = render_plain(tokenizer, messages[:-1], add_generation_prompt=True)[0]
        start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        ids = torch.tensor(tokenizer(render_plain(tokenizer, messages)[0], add_special_tokens=False)["input_ids"])
        for pos in range(start + 1, ids.shape[0]):
            guess = ngram.propose(ids[:pos], 1, SamplingParams()).tokens
            total += 1
            right += int(guess.numel() > 0 and int(guess[0]) == int(ids[pos]))
    return total, right


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--workloads", default="humaneval,gsm8k,mt_bench,alpaca")
    p.add_argument("--num-prompts", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default=None, help="target dtype (default: the recipe's)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--answers", type=Path, default=None, help="regenerated answers JSONL (training data)")
    p.add_argument("--answers-stride", type=int, default=10)
    a = p.parse_args()
    loaded = load_drafter(a.checkpoint, dtype=a.dtype)
    target = loaded.target
    proposer = proposers.from_drafter(loaded.drafter, target)
    fmt = workloads.training_prompt_format(workloads.checkpoint_recipe(a.checkpoint), target.tokenizer)
    ngram = NgramProposer()
    draft_ids = getattr(loaded.drafter, "draft_ids", None)
    in_vocab = set(draft_ids().tolist()) if callable(draft_ids) else None
    report = {"checkpoint": a.checkpoint, "prompt_format": fmt, "k": 1, "workloads": {}}
    if a.answers:
        total, right = ngram_on_answers(a.answers, target.tokenizer, a.answers_stride)
        report["ngram_on_training_answers"] = {"file": str(a.answers), "stride": a.answers_stride,
                                               "positions": total, "right": right}
        print(f"training answers ({a.answers}, every {a.answers_stride}th row): n-gram predicts the next token "
              f"{right / total:.3f} of {total} positions", flush=True)
    for name in a.workloads.split(","):
        total: Counter = Counter()
        for item in workloads.load(name, None, a.num_prompts):
            ids = workloads.encode(item, target.tokenizer, fmt)[0]
            gen = generate(target, proposer, ids, LoopConfig(k=1, max_new_tokens=a.max_new_tokens))
            total += round_table(gen, ids, ngram, in_vocab)
        off = {g: total.pop(("off_draft_vocab", g)) for g in ("right", "wrong", "none") if ("off_draft_vocab", g) in total}
        n = sum(total.values())
        rows = {f"drafter_{d}/ngram_{g}": c for (d, g), c in sorted(total.items())}
        report["workloads"][name] = {"rounds": n, **rows,
                                     **{f"off_draft_vocab/ngram_{g}": c for g, c in off.items()}}
        right = sum(c for (d, _), c in total.items() if d == "right")
        ng_right = sum(c for (_, g), c in total.items() if g == "right")
        missed_copy = total[("wrong", "right")]
        print(f"{name}: {n} rounds; drafter right {right / n:.2f}, n-gram right {ng_right / n:.2f}; "
              f"n-gram right but drafter wrong {missed_copy / n:.2f}; drafter right but n-gram not "
              f"{(right - total[('right', 'right')]) / n:.2f}; both wrong {(n - right - ng_right + total[('right', 'right')]) / n:.2f}"
              + (f"; right token off the draft vocabulary {sum(off.values()) / n:.2f}" if in_vocab is not None else ""),
              flush=True)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
