"""The architecture matrix: every tiny architecture (archs.TINY) x every drafter kind, checked
end to end on random weights (correctness only, never acceptance):

  1. features  the drafter asks for the right aux layers (EAGLE-3: default_aux_layer_ids), and
               the features the loop computes equal hidden_states[i] of a separate forward;
  2. train     2 optimizer steps through the one training loop (train/loop.py) give finite losses;
  3. lossless  greedy speculative output == target-only output (eval/loop.py), with rejections;
  4. export    every format that takes the kind validates (export/validate.py: names, shapes,
               rope, verifier, round trip), and the fields the engine's draft reads are the target's
               (a format checked by its engine's own program, llama.cpp, is marked "not run");
or a refusal at config time (export.can_export: the kind's class and each format's layout) naming the
unsupported feature. The kinds are every registered one (DRAFTERS.names()), each with its class's
tiny_options.

    from draftsmith.testing import matrix
    cells = matrix.run_arch("gemma2", workdir)        # one row (all kinds)

tests/testing/test_arch_matrix.py runs every row; scripts/gen_targets_doc.py writes docs/targets.md.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith import testing
from draftsmith.export import EXPORTERS, can_export, refusals
from draftsmith.export import formats_for as export_formats_for
from draftsmith.heads import DRAFTERS

NOT_RUN = "not run: checked by its engine's own program, not in-process (the format's round-trip tests run it)"


def matrix_kinds() -> list[str]:
    """Every registered drafter kind (each runs with its class's tiny_options)."""
    return DRAFTERS.names()


@dataclass
class Cell:
    arch: str
    kind: str
    status: str  # "ok" | "refused" | "failed"
    checks: dict[str, str] = field(default_factory=dict)  # check name -> short result
    reasons: list[str] = field(default_factory=list)  # refusals (config time) or the failure
    exports: dict[str, Path] = field(default_factory=dict)  # format -> validated export directory
    seconds: float = 0.0


def data_file(directory: Path) -> Path:
    """A small ShareGPT file for the 2 training steps."""
    rows = [{"conversations": [{"from": "human", "value": f"question {i} about {'abc' * (i % 4)}"},
                               {"from": "gpt", "value": f"answer {i}: " + "xyz " * (2 + i % 5)}]} for i in range(10)]
    path = directory / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_options(kind: str, target_config) -> dict:
    """The kind's tiny_options, with what a hybrid target asks of a shrunk draft LM: layers up to its first
    attention layer (the one-line error of heads/draft_lm.layer_truncated_copy says the same)."""
    from draftsmith.targets import state_cache

    options = dict(DRAFTERS.get(kind).tiny_options)
    if "shrink_layers" in options and state_cache.has_state_layers(target_config):
        options["shrink_layers"] = max(options["shrink_layers"], state_cache.first_attention_layer(target_config) + 1)
    return options


def recipe(target_dir: Path, data: Path, out: Path, kind: str, target_config=None):
    from draftsmith import config as config_mod

    options = DRAFTERS.get(kind).tiny_options if target_config is None else tiny_options(kind, target_config)
    raw = {"target": {"path": str(target_dir), "device": "cpu"},
           "data": {"path": [str(data)], "max_length": 48, "eval_samples": 2},
           "drafter": {"kind": kind, **options},
           "train": {"output_dir": str(out), "max_steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1,
                     "log_every": 1, "eval_every": 0},
           "logging": {"progress_bar": False, "report_to": []}}
    return config_mod.from_dict(raw)


def check_features(target, drafter) -> str:
    from draftsmith.data import features
    from draftsmith.targets.archs import default_aux_layer_ids

    layers = drafter.feature_layers()
    default = "aux_hidden_states" in drafter.required_features and getattr(drafter.cfg, "aux_layer_ids", None) is None
    if default and layers != default_aux_layer_ids(target.num_layers):
        raise AssertionError(f"aux layers {layers}, expected {default_aux_layer_ids(target.num_layers)}")
    ids = torch.randint(3, target.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    feats = features.complete(target, batch, set(drafter.required_features), layers)
    out = target.forward(ids)
    if "aux_hidden_states" in feats:
        want = torch.cat([out.hidden_states[i] for i in layers], dim=-1)  # n x [b, s, h] -> [b, s, n*h]
        if not torch.equal(feats["aux_hidden_states"], want):
            raise AssertionError("aux_hidden_states differ from hidden_states[i] of a separate forward")
    if "target_logits" in feats and not torch.allclose(feats["target_logits"], out.logits, atol=1e-5):
        raise AssertionError("target_logits differ from the target's own logits")
    return f"layers {layers}" if layers else "last hidden state" if "last_hidden_state" in feats else "logits"


PROMPT_SEED, NEW_TOKENS = 1, 20  # 9 prompt + 20 new tokens: past the tiny sliding windows (8)


def prompt_for(target) -> torch.Tensor:
    return torch.randint(3, target.vocab_size, (9,), generator=torch.Generator().manual_seed(PROMPT_SEED))


def target_only(target) -> list[int]:
    """Greedy target-only output on the matrix prompt (the reference of every cell of a row)."""
    from draftsmith.eval.loop import LoopConfig, generate

    return generate(target, None, prompt_for(target), LoopConfig(k=0, max_new_tokens=NEW_TOKENS, eos_ids=[])).tokens


def check_lossless(target, drafter, base: list[int]) -> str:
    """Greedy speculative output == target-only output; rollback across sliding windows is exercised."""
    from draftsmith.eval.loop import LoopConfig, generate

    k = min(3, drafter.max_draft_tokens() or 3)
    spec = generate(target, drafter.make_proposer(target), prompt_for(target),
                    LoopConfig(k=k, max_new_tokens=NEW_TOKENS, eos_ids=[]))
    if spec.tokens != base:
        raise AssertionError(f"speculative output {spec.tokens} != target-only {base}")
    rejected = sum(r.accepted < r.proposed for r in spec.rounds)
    return f"identical over {len(spec.rounds)} rounds ({rejected} with a rejection)"


def check_export(loaded, fmt: str, out: Path) -> str:
    from draftsmith.export import export

    result = export(None, fmt, out, loaded=loaded)
    return f"{result.report.get('round_trip', 'validated')}"


def run_cell(arch: str, kind: str, target, target_dir: Path, data: Path, workdir: Path, base: list[int]) -> Cell:
    from draftsmith import checkpoint
    from draftsmith.train.loop import Trainer

    start = time.perf_counter()
    cell = Cell(arch, kind, "ok")
    refused = refusals(target.config, kind)
    if refused:
        cell.status, cell.reasons = "refused", refused
        return cell
    step = "setup"
    try:
        cfg = recipe(target_dir, data, workdir / kind, kind, target.config)
        step = "train"
        trainer = Trainer(cfg, target)
        result = trainer.run(stop_after=2)
        if len(result.losses) != 2 or not all(math.isfinite(x) for x in result.losses):
            raise AssertionError(f"losses {result.losses}")
        cell.checks["train"] = "2 steps, losses " + ", ".join(f"{x:.3g}" for x in result.losses)
        drafter = trainer.drafter.eval()
        step = "features"
        cell.checks["features"] = check_features(target, drafter)
        step = "lossless"
        cell.checks["lossless"] = check_lossless(target, drafter, base)
        loaded = checkpoint.LoadedDrafter(drafter=drafter, target=target, config=cfg,
                                          meta={"kind": kind, "step": 2, "target": target.identity()})
        if not export_formats_for(kind):
            cell.checks["export"] = f"no export format takes {kind} drafters"
        for fmt in export_formats_for(kind):
            step = f"export {fmt}"
            why = can_export(kind, fmt, None, target.config)
            if why:
                cell.checks[f"export {fmt}"] = "refused: " + "; ".join(why)
                continue
            if not EXPORTERS.get(fmt).checked_in_process:  # llama.cpp: llama-server checks it, in its own tests
                cell.checks[f"export {fmt}"] = NOT_RUN
                continue
            cell.checks[f"export {fmt}"] = check_export(loaded, fmt, workdir / f"{kind}-{fmt}")
            cell.exports[fmt] = workdir / f"{kind}-{fmt}"
    except Exception as exc:  # the matrix reports a failed cell with its step; the test fails on it
        cell.status = "failed"
        cell.reasons = [f"{step}: {type(exc).__name__}: {exc}"]
    cell.seconds = time.perf_counter() - start
    return cell


def run_arch(arch: str, workdir: Path, kinds=None) -> list[Cell]:
    """Every kind on the tiny `arch` target (saved once to workdir: recipes name a target path)."""
    from draftsmith.targets.archs import TINY, config_refusals

    refused = config_refusals(TINY[arch][1]())
    if refused:  # no model class draftsmith loads: every kind refused at config time, nothing built
        return [Cell(arch, kind, "refused", reasons=refused) for kind in (kinds or matrix_kinds())]
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    target = testing.arch_target(arch)
    target_dir = workdir / "target"
    target.model.save_pretrained(str(target_dir))
    target.tokenizer.save_pretrained(str(target_dir))
    from transformers import AutoTokenizer

    target.tokenizer = AutoTokenizer.from_pretrained(str(target_dir))  # as target.load and exports read it back
    target.path = str(target_dir)
    data = data_file(workdir)
    base = target_only(target)
    return [run_cell(arch, kind, target, target_dir, data, workdir, base) for kind in (kinds or matrix_kinds())]
