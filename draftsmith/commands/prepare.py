"""`draftsmith prepare`: regenerate a recipe's answers with the target, and/or build its offline
feature cache.

    draftsmith prepare recipe.yaml regenerate.output=data/regen.jsonl      # regenerate answers
    draftsmith prepare recipe.yaml features.cache_dir=cache/x --features   # build the feature cache
    draftsmith prepare recipe.yaml --limit 100                             # only the first 100 input rows
    draftsmith prepare recipe.yaml regenerate.generator=openai regenerate.endpoint=https://HOST/v1 \
        --api-key-env MY_KEY                                               # the server's key from $MY_KEY
    draftsmith prepare recipe.yaml --dry-run                               # predict the feature cache size

Regeneration runs when regenerate.output is set; it reads data.path and writes regenerate.output
(resumable; rerun the same command after an interruption). --features then builds the cache for
the recipe's drafter from the data training reads (regenerate.output when set, else data.path).
Exit status 1 when regeneration answered no row at all (every row failed or was skipped).
"""
from __future__ import annotations

import argparse
import sys

from draftsmith import config as config_mod
from draftsmith.core.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="recipe YAML")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    parser.add_argument("--features", action="store_true", help="build the offline feature cache (features.cache_dir)")
    parser.add_argument("--limit", type=int, default=None,
                        help="regenerate only the first N input rows (default: regenerate.limit)")
    parser.add_argument("--api-key-env", default=None, metavar="NAME",
                        help="regenerate.generator=openai: the environment variable holding the server's API key "
                             "(default: DRAFTSMITH_API_KEY when set, else no key)")
    parser.add_argument("--dry-run", action="store_true",
                        help="tokenize the data and predict the feature cache size per storage dtype; build nothing")


def run_regenerate(cfg, target=None, limit=None, log=print, api_key_env=None):
    """Regenerate cfg.data.path into cfg.regenerate.output (data.regenerate.regenerate_for_recipe)."""
    from draftsmith.data.regenerate import regenerate_for_recipe

    return regenerate_for_recipe(cfg, target, limit, log, api_key_env)


def _load_tokenizer(cfg):
    from draftsmith.data.regenerate import recipe_tokenizer

    return recipe_tokenizer(cfg)


def drafter_layers_and_features(cfg, target, counts) -> tuple[list[int], set[str]]:
    """The recipe drafter's feature layers and required features."""
    from draftsmith.heads import DRAFTERS

    cls = DRAFTERS.get(cfg.drafter.kind)
    options = config_mod.drafter_options(cfg)
    if hasattr(cls, "feature_layers_for"):
        layers = cls.feature_layers_for(options, target)
    else:
        layers = cls.from_target(options, target, counts).feature_layers()
    return list(layers), set(cls.required_features)


def run_features(cfg, target=None, layers=None, required=None, log=print) -> dict:
    """Build the feature cache for all rows training reads (train then heldout, in order)."""
    from draftsmith.data import dataset as ds
    from draftsmith.data import feature_cache
    from draftsmith.targets import load as target_mod

    if not cfg.features.cache_dir:
        raise UserError("--features needs features.cache_dir: set it in the recipe or pass features.cache_dir=DIR")
    target = target or target_mod.from_config(cfg.target)
    if cfg.features.build_dtype:
        from draftsmith.checkpoint import run_in_dtype

        run_in_dtype(target, cfg.features.build_dtype)  # fingerprinted as loaded, then cast
    train, heldout, report = ds.build_dataset(ds.training_data_config(cfg), target.tokenizer)
    log(report.summary())
    full = ds.TokenDataset(train.input_ids + heldout.input_ids, train.loss_mask + heldout.loss_mask,
                           train.ids + heldout.ids)
    if layers is None or required is None:
        layers, required = drafter_layers_and_features(cfg, target, ds.token_counts(train, target.vocab_size))
    f = cfg.features
    manifest = feature_cache.build(target, full, f.cache_dir, layers, f.dtype, f.shard_rows, required,
                                   batch_size=f.build_batch_size, log=log)
    log(f"feature cache {f.cache_dir}: {manifest['rows']} rows, {manifest['tokens']} tokens, layers {layers}, "
        f"{manifest['features']} in {manifest['dtype']}; the last {len(heldout)} rows are the heldout set")
    return manifest


class _TargetShape:
    """What predicting a cache needs from a target: its config and tokenizer, not its weights."""

    def __init__(self, cfg):
        from transformers import AutoConfig

        from draftsmith.targets.load import hf_kwargs, locate

        path, gguf_name = locate(cfg.target.path, cfg.target.gguf_file)
        self.config = AutoConfig.from_pretrained(path, revision=cfg.target.revision,
                                                 trust_remote_code=cfg.target.trust_remote_code, **hf_kwargs(gguf_name))
        self.tokenizer = _load_tokenizer(cfg)
        self.num_layers, self.hidden_size = self.config.num_hidden_layers, self.config.hidden_size
        self.vocab_size = self.config.vocab_size


def predict_cache(cfg, log=print) -> dict:
    """Tokenize the data training reads and predict the offline cache's size for every storage dtype
    (no target weights are loaded). -> {"tokens", "rows", "features", "layers", "bytes": {dtype: {...}}}."""
    from draftsmith.data import dataset as ds
    from draftsmith.data import feature_cache
    from draftsmith.heads import DRAFTERS

    shape = _TargetShape(cfg)
    import os

    data_cfg = cfg.data
    if cfg.regenerate.output and not os.path.exists(cfg.regenerate.output):
        log(f"regenerate.output {cfg.regenerate.output} is not built yet: predicting from data.path's answers "
            "(regenerated answers differ in length, so this is an estimate)")
    else:
        data_cfg = ds.training_data_config(cfg)
    train, heldout, report = ds.build_dataset(data_cfg, shape.tokenizer)
    cls = DRAFTERS.get(cfg.drafter.kind)
    layers = list(cls.feature_layers_for(config_mod.drafter_options(cfg), shape))
    features = feature_cache.cache_features(cls.required_features)
    tokens, rows = train.num_tokens + heldout.num_tokens, len(train) + len(heldout)
    out = {"tokens": tokens, "rows": rows, "features": features, "layers": layers, "bytes": {}}
    log(f"feature cache prediction for {cfg.name}: {rows} rows, {tokens} tokens, features {features}, "
        f"layers {layers}, hidden {shape.hidden_size}")
    for dtype in ("float32", "bfloat16", "fp8", "int8"):
        pred = feature_cache.predict_bytes(tokens, rows, features, len(layers), shape.hidden_size, dtype)
        out["bytes"][dtype] = pred
        mark = "  <- features.dtype" if feature_cache.DTYPES[dtype] == feature_cache.DTYPES[cfg.features.dtype] else ""
        log(f"  {dtype:>9}: {pred['per_token']:>8,} bytes/token  {pred['total'] / 2**20:>12,.1f} MiB{mark}")
    return out


def main(args) -> int:
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: must be >= 1 (input rows to regenerate)")
    cfg = config_mod.load(args.recipe, args.overrides)
    if args.dry_run:
        predict_cache(cfg)
        return 0
    if not cfg.regenerate.output and not args.features:
        print("draftsmith prepare: nothing to do; set regenerate.output=FILE to regenerate answers "
              "and/or pass --features to build the feature cache", file=sys.stderr)
        return 2
    target = None
    if cfg.regenerate.output:
        from draftsmith.data.regenerate import check_outputs

        check_outputs(cfg.regenerate.output)  # a FIFO or device node: refused before the target loads
        if cfg.regenerate.generator == "local" or args.features:
            from draftsmith.targets import load as target_mod

            target = target_mod.from_config(cfg.target)
        limit = args.limit if args.limit is not None else cfg.regenerate.limit  # the flag wins, as train has none
        summary = run_regenerate(cfg, target, limit, api_key_env=args.api_key_env)
        if summary.success == 0:
            print(f"draftsmith prepare: no row was regenerated ({summary.input} read: {summary.error} failed, "
                  f"{summary.skipped} skipped); see the reasons above", file=sys.stderr)
            return 1
        if summary.error:
            print(f"draftsmith prepare: {summary.error} row(s) failed; rerun the same command to retry them",
                  file=sys.stderr)
    if args.features:
        run_features(cfg, target)
    return 0
