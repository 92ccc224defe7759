"""Training's evaluation on the loop's own contexts (train.workload_eval).

The held-out rows measure a drafter on the rows it was trained like; draftsmith's loop runs it on a workload's
prompts, whose answers can be harder (SmolLM2-135M-Instruct, 9,440 steps: held-out tau(k=3) 2.44 against 1.80 on
MT-bench in the loop). This module measures the drafter where the loop does, at every held-out evaluation:

  1. once, when training starts: the first num_prompts prompts of each workload, encoded as `draftsmith eval`
     encodes them for a checkpoint of this recipe (workloads.encode; prompt_format auto: the format the drafter
     trains on, workloads.training_prompt_format), and the target's greedy answer to each from the loop itself
     with no drafter (eval/loop.generate, k = 0: the output a lossless speculative run must reproduce),
     max_new_tokens long;
  2. at each evaluation: the drafter's teacher-forced accuracy per draft position on those answers (the loss
     mask covers the answer), with the target's features computed online as the loop computes them.

A chain drafter's acc_i there stands for the loop's conditional acceptance at draft position i on the same text, so
tau = 1 + sum_i prod_{j<=i} acc_j is the loop's acceptance length before it runs. It averages every position,
where the loop's rounds start after the tokens it accepted or corrected: on SmolLM2-135M it stood 0.01-0.10 above
the loop's tau on four workloads, where the held-out rows stood 0.65 above on MT-bench (docs/training.md "The
loop's own contexts"). Prompts are cut as `draftsmith eval` cuts them (their last tokens, to leave max_new_tokens
of the target's positions). The rows are rebuilt on resume (greedy decoding gives the same answers).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from draftsmith.core.errors import UnknownNameError, UserError
from draftsmith.report.learning_curve import metric_key, metric_name


@dataclass(frozen=True)
class WorkloadRows:
    name: str                # the workload as the recipe names it (mt_bench, spec_bench/qa, jsonl:PATH)
    key: str                 # its part of the logged metric names: eval_<key>/acc_0
    rows: list[dict]         # {"id", "input_ids" [n], "loss_mask" [n]} tensors: the prompt, then the target's answer
    answer_tokens: int


def prompts(wc) -> dict[str, list[dict]]:
    """{concrete workload: its first num_prompts items} for wc (a WorkloadEvalConfig; groups expanded). An unknown
    name, a missing prompt file or two workloads that would log under one name is one line naming it. Training
    asks before it reads any data."""
    from draftsmith.eval import workloads

    where = "train.workload_eval.workloads"
    if not wc.workloads:
        return {}
    try:
        concrete = workloads.expand(list(wc.workloads))
    except (FileNotFoundError, UnknownNameError) as exc:
        raise UserError(f"{where}: {exc}") from None
    by_key: dict[str, str] = {}
    for name in concrete:
        other = by_key.setdefault(metric_key(name), name)
        if other != name:
            raise UserError(f"{where}: {other} and {name} would both log as eval_{metric_key(name)}/*; rename one "
                            "prompt file")
    items = {}
    for name in concrete:
        try:
            items[name] = workloads.load(name, None, wc.num_prompts)
        except FileNotFoundError as exc:  # a built-in workload's file under the data directory
            detail = str(exc).split(";")[0]
            raise UserError(f"{where}: {name}: {detail}; set DRAFTSMITH_DATA to the directory holding its prompts "
                            "(../shared/data by default), or remove it") from None
        if not items[name]:
            raise UserError(f"{where}: {name} has no prompts; remove it or give a workload with prompts")
        with_images = next((item for item in items[name] if item.get("images")), None)
        if with_images is not None:
            raise UserError(f"{where}: {name} item {with_images.get('id')} has images; training evaluates text "
                            "prompts only (measure images with `draftsmith eval`)")
    return items


def build(target, cfg, asked: dict[str, list[dict]], log: Callable[[str], None] = print) -> list[WorkloadRows]:
    """The rows of each workload of `asked` (prompts(cfg.train.workload_eval)): its prompts and the target's greedy
    answers; [] when none is asked."""
    import torch  # local import: the metric names above serve `draftsmith plan`, which loads no model

    from draftsmith import config
    from draftsmith.eval import workloads
    from draftsmith.eval.loop import LoopConfig, generate
    from draftsmith.targets.archs import text_config

    if not asked:
        return []
    wc = cfg.train.workload_eval
    prompt_format = wc.prompt_format
    if prompt_format == "auto":  # what `draftsmith eval` picks for a checkpoint of this recipe
        prompt_format = workloads.training_prompt_format(config.to_dict(cfg), target.tokenizer)
    limit = getattr(text_config(target.config), "max_position_embeddings", None)
    max_prompt = None if limit is None else limit - wc.max_new_tokens
    if max_prompt is not None and max_prompt < 1:
        raise UserError(f"train.workload_eval.max_new_tokens {wc.max_new_tokens} leaves no room for a prompt in the "
                        f"target's {limit} positions; lower it below {limit}")
    out = []
    for name, items in asked.items():
        start = time.perf_counter()
        rows, answered = [], 0
        for item in items:
            prompt, _ = workloads.encode(item, target.tokenizer, prompt_format, max_prompt)
            with torch.no_grad():
                gen = generate(target, None, prompt.to(target.device), LoopConfig(k=0, max_new_tokens=wc.max_new_tokens))
            answer = torch.tensor(gen.tokens, dtype=torch.long)
            mask = torch.cat([torch.zeros(len(prompt), dtype=torch.long), torch.ones(len(answer), dtype=torch.long)])
            rows.append({"id": str(item.get("id", len(rows))), "input_ids": torch.cat([prompt.cpu(), answer]),
                         "loss_mask": mask})
            answered += len(answer)
        out.append(WorkloadRows(name, metric_key(name), rows, answered))
        log(f"workload eval {name}: {len(rows)} prompts ({prompt_format} format), the target's greedy answers "
            f"{answered:,} tokens ({time.perf_counter() - start:.0f} s)")
    return out


def keep_features(sets: list[WorkloadRows], target, required: set[str], layers: list[int], pad_id: int) -> None:
    """Run the target over each row once and keep what the drafter reads (on the CPU, in the target's dtype): the
    rows do not change between evaluations, so each evaluation replays only the target's logits from the kept
    last hidden state (features.complete: one lm_head product, where the forward it saves is the whole target).
    On SmolLM2-135M (4 workloads x 10 rows, one core) the rows' part of an evaluation takes 11.0 s; a target
    forward at each evaluation made it 31.7 s (benchmarks/bench_workload_eval.py)."""
    import torch

    from draftsmith.data import collate, features

    wanted = set(required) - {"input_ids", "attention_mask", "loss_mask"}
    if not wanted:
        return
    for w in sets:
        for row in w.rows:
            batch = collate([{k: v for k, v in row.items() if torch.is_tensor(v)}], pad_id)
            with torch.no_grad():
                feats = features.compute(target, batch["input_ids"].to(target.device),
                                         batch["attention_mask"].to(target.device), wanted, layers)
            row.update({key: value[0].to("cpu") for key, value in feats.items() if key != "target_logits"})


def tau_line(results: dict[str, float], sets: list[WorkloadRows], k: int = 3) -> str:
    """One log line: each workload's acc_i and the chain tau(k) they give (the loop's, before it runs)."""
    from draftsmith.report.speedup_model import expected_tau

    parts = []
    for w in sets:
        accs = []
        while metric_name(w.name, f"acc_{len(accs)}") in results:
            accs.append(results[metric_name(w.name, f"acc_{len(accs)}")])
        if accs:
            shown = "/".join(f"{a:.3f}" for a in accs)
            parts.append(f"{w.key} acc {shown} tau(k={k}) {expected_tau(accs, k)[0]:.2f}")
    return "on the loop's contexts: " + "; ".join(parts) if parts else ""
