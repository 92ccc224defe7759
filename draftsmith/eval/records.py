"""What `draftsmith eval` and `draftsmith eval --engine` write about a run (docs/results-schema.md): the drafter's
identity, the results `config`, the command line and the results file, built here once for both."""
from __future__ import annotations

import datetime as _dt
import shlex
import sys
from pathlib import Path
from typing import Optional

from draftsmith.core.sampling import VERIFICATION_RULES, SamplingParams, rule_name
from draftsmith.eval import results


def checkpoint_identity(loaded, path: str, name: Optional[str] = None, ngram_first: Optional[dict] = None) -> dict:
    """The results' `drafter` section for a checkpoint's drafter (`loaded`: checkpoint.load_drafter's answer);
    name: the run's folder name unless given; ngram_first: the --ngram-first lookup in front of it."""
    drafter = loaded.drafter
    weights = drafter.state_dict_for_export()
    log = Path(path).parent / "metrics.jsonl"
    return {"kind": loaded.meta.get("kind", drafter.kind), "name": name or Path(path).resolve().parent.name,
            "path": str(path), "fingerprint": results.module_fingerprint(drafter, weights),
            "num_params": sum(t.numel() for t in weights.values()),
            "trainable_params": sum(p.numel() for p in drafter.trainable_parameters()),
            "training_log": str(log) if log.exists() else None,
            "ngram_first": ngram_first}


def results_config(options, *, weights_dtype: str, device: str, eos_ids: list, prompt_format: str, names: list,
                   tree=None, recipe: Optional[dict] = None, batch_sizes: list = ()) -> dict:
    """The results' `config` section: the settings a run measured under (`options`: an EvalOptions, with k the
    deepest draft position under --tree). recipe: a checkpoint's resolved config.yaml (written when a PATH is given)."""
    rule = rule_name(SamplingParams(temperature=options.temperature, top_k=options.top_k, top_p=options.top_p))
    config = {"k": options.k, "temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p,
              "max_new_tokens": options.max_new_tokens, "num_prompts": options.num_prompts, "seed": options.seed,
              "warmup": options.warmup, "repeats": options.repeats, "dtype": weights_dtype,
              "verify_dtype": options.verify_dtype or weights_dtype, "near_tie_steps": options.near_tie_steps,
              "device": device,
              "verification": rule, "lossless_rule": VERIFICATION_RULES[rule], "prompt_format": prompt_format,
              "eos_ids": eos_ids, "workloads": names, "first_turn_only": True,
              "tree": None if tree is None else vars(tree), "verify_budget": tree.budget if tree else options.k,
              "tree_budget": tree.budget if tree else None}
    if options.path:
        config["recipe"] = recipe
    config["batch_sizes"] = list(batch_sizes)
    return config


def command_line(called_as: str) -> str:
    """The command line the results record; `called_as` when draftsmith's code was called as a function."""
    if sys.argv[1:2] == ["eval"]:
        return "draftsmith eval " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    return called_as


def write_results(out: dict, path: Optional[Path], stem: str) -> Path:
    """Write the results JSON to `path`, or to results/<stem>-<time>.json; say where."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    written = results.write(out, path or Path("results") / f"{stem}-{stamp}.json")
    print(f"[eval] results written to {written}")
    return Path(written)
