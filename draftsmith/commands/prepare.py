"""`draftsmith prepare`: regenerate a recipe's answers with the target, and/or build its offline
feature cache.

    draftsmith prepare recipe.yaml regenerate.output=data/regen.jsonl      # regenerate answers
    draftsmith prepare recipe.yaml features.cache_dir=cache/x --features   # build the feature cache
    draftsmith prepare recipe.yaml --limit 100                             # only the first 100 input rows
    draftsmith prepare recipe.yaml regenerate.generator=openai regenerate.endpoint=https://HOST/v1 \
        --api-key-env MY_KEY                                               # the server's key from $MY_KEY
    draftsmith prepare recipe.yaml --dry-run                               # predict the feature cache size
    draftsmith prepare recipe.yaml --features --nproc 4                    # 4 builders share the cache
    torchrun --nproc_per_node 8 -m draftsmith prepare recipe.yaml --features   # the same under torchrun

Regeneration runs when regenerate.output is set; it reads data.path and writes regenerate.output
(resumable; rerun the same command after an interruption). --features then builds the cache for
the recipe's drafter from the data training reads (regenerate.output when set, else data.path).
Exit status 1 when regeneration answered no row at all (every row failed or was skipped).

Several builders (--nproc N, or torchrun's RANK / WORLD_SIZE / LOCAL_RANK): each loads the whole target
on its own device (cuda:LOCAL_RANK when the recipe's target.device is auto or cuda; on a CPU each takes
its share of the cores) and builds the shards whose lock it takes, its own first (shard % N == rank),
then any left (data/feature_manifest.py). No process group is used: the cache's locks are the only
coordination, so a rerun with any other rank count resumes, and a killed rank loses only the shard it
was writing. Regeneration runs once, before the builders start (--nproc), or not at all under
torchrun (run `draftsmith prepare recipe.yaml` first).
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
    parser.add_argument("--format", choices=["draftsmith", "vllm"], default="draftsmith",
                        help="--features: draftsmith's cache in features.cache_dir (default), or vLLM's per-request "
                             "hidden-states files in features.dir (what vLLM's extract_hidden_states writes and "
                             "speculators reads; docs/training-at-scale.md)")
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="--features: N builder processes share the cache (each loads the target; on a GPU "
                             "machine rank r uses cuda:r)")
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
    options = cfg.drafter.options
    if hasattr(cls, "feature_layers_for"):
        layers = cls.feature_layers_for(options, target)
    else:
        layers = cls.from_target(options, target, counts).feature_layers()
    return list(layers), set(cls.required_features)


def ranks() -> tuple[int, int, int]:
    """(rank, world, local_rank) from torchrun's or --nproc's environment; (0, 1, 0) alone."""
    import os

    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise UserError("RANK / WORLD_SIZE / LOCAL_RANK must be integers (as torchrun sets them)") from None
    if not (world >= 1 and 0 <= rank < world and local >= 0):
        raise UserError(f"RANK {rank} / WORLD_SIZE {world}: need 0 <= RANK < WORLD_SIZE (as torchrun sets them)")
    return rank, world, local


def _place_rank(cfg, world: int, local: int) -> None:
    """Rank `local`'s device and threads: cuda:LOCAL_RANK for an auto / cuda target on a GPU machine; on a
    CPU, an equal share of the cores (unless OMP_NUM_THREADS says otherwise)."""
    import os

    import torch

    if world == 1:
        return
    if cfg.target.device in ("auto", "cuda") and torch.cuda.is_available():
        cfg.target.device = f"cuda:{local % torch.cuda.device_count()}"
    elif "OMP_NUM_THREADS" not in os.environ:
        per = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // per))


def check_target_sharding(cfg) -> None:
    if cfg.train.target_sharding == "fsdp2":
        raise UserError("train.target_sharding: fsdp2: prepare --features loads the whole target on each builder "
                        "and does not shard it; build the cache on devices that hold the target "
                        "(pass train.target_sharding=replicate), or capture hidden states with vLLM "
                        "(features.source: vllm, docs/training-at-scale.md)")


def run_features(cfg, target=None, layers=None, required=None, log=print, fmt: str = "draftsmith") -> dict:
    """Build the feature cache for all rows training reads (train then heldout, in order); under several
    builders (ranks()), this process's share of it. fmt vllm: vLLM's hidden-states files in features.dir."""
    from draftsmith.data import dataset as ds
    from draftsmith.data import feature_cache
    from draftsmith.targets import load as target_mod

    if fmt == "vllm" and not cfg.features.dir:
        raise UserError("--format vllm writes vLLM's hidden-states files into features.dir: set it in the recipe or "
                        "pass features.dir=DIR")
    if fmt == "vllm" and cfg.features.label_topk is not None:
        raise UserError("features.label_topk: --format vllm writes vLLM's hidden-states files, which hold no top-K "
                        "logits; build draftsmith's cache (--format draftsmith) or remove features.label_topk")
    if fmt != "vllm" and not cfg.features.cache_dir:
        raise UserError("--features needs features.cache_dir: set it in the recipe or pass features.cache_dir=DIR")
    check_target_sharding(cfg)
    rank, world, local = ranks()
    _place_rank(cfg, world, local)
    target = target or target_mod.from_config(cfg.target)
    if cfg.features.build_dtype:
        from draftsmith.checkpoint import run_in_dtype

        run_in_dtype(target, cfg.features.build_dtype)  # fingerprinted as loaded, then cast
    train, heldout, report = ds.build_dataset(ds.training_data_config(cfg), target.tokenizer,
                                              getattr(target, "processor", None))
    if rank == 0:
        log(report.summary())
    full = train.joined(heldout)
    if layers is None or required is None:
        layers, required = drafter_layers_and_features(cfg, target, ds.token_counts(train, target.vocab_size))
    f = cfg.features
    if fmt == "vllm":
        from draftsmith.data import vllm_hidden_states

        written = vllm_hidden_states.write_folder(target, full, f.dir, layers, required, f.dtype, log=log, rank=rank,
                                                  world=world)
        return {"rows": len(full), "written": written}
    manifest = feature_cache.build(target, full, f.cache_dir, layers, f.dtype, f.shard_rows, required,
                                   batch_size=f.build_batch_size, log=log, rank=rank, world=world,
                                   label_topk=f.label_topk)
    if world > 1 and not manifest["complete"]:
        log(f"feature cache {f.cache_dir}: rank {rank} of {world} done; other ranks are finishing their shards")
        return manifest
    topk = f" + the top-{f.label_topk} logits" if f.label_topk else ""
    log(f"feature cache {f.cache_dir}: {manifest['rows']} rows, {manifest['tokens']} tokens, layers {layers}, "
        f"{manifest['features']} in {manifest['dtype']}{topk}; the last {len(heldout)} rows are the heldout set")
    return manifest


def spawn_builders(args, nproc: int) -> int:
    """--nproc N: N `draftsmith prepare --features` processes with torchrun's environment; the worst exit."""
    import os
    import subprocess

    argv = [sys.executable, "-m", "draftsmith", "prepare", args.recipe, *args.overrides, "--features", "--format",
            args.format]
    procs = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(nproc)}
        procs.append(subprocess.Popen(argv, env=env))
    try:
        codes = [p.wait() for p in procs]
    except BaseException:  # Ctrl-C or SIGTERM of the parent: stop the builders (their finished shards stay)
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        raise
    bad = [(r, c) for r, c in enumerate(codes) if c != 0]
    if bad:
        print(f"draftsmith prepare: builder(s) {', '.join(f'rank {r} exit {c}' for r, c in bad)}; finished shards "
              "are kept: rerun the same command (any --nproc) to build the rest", file=sys.stderr)
        return 2 if all(c == 2 for _, c in bad) else 1
    if args.format == "draftsmith":
        from draftsmith.data import feature_manifest

        cfg = config_mod.load(args.recipe, args.overrides)
        manifest = feature_manifest.read_manifest(cfg.features.cache_dir)
        if manifest is not None:
            print(f"feature cache {cfg.features.cache_dir}: {nproc} builders done; {len(manifest['shards'])} shard(s), "
                  f"{manifest['rows']} rows, {manifest['tokens']} tokens, complete: {manifest['complete']}")
    return 0


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
    layers = list(cls.feature_layers_for(cfg.drafter.options, shape))
    features = feature_cache.cache_features(cls.required_features)
    tokens, rows = train.num_tokens + heldout.num_tokens, len(train) + len(heldout)
    out = {"tokens": tokens, "rows": rows, "features": features, "layers": layers, "bytes": {}}
    topk = cfg.features.label_topk
    log(f"feature cache prediction for {cfg.name}: {rows} rows, {tokens} tokens, features {features}, "
        f"layers {layers}, hidden {shape.hidden_size}" + (f", top-{topk} logits" if topk else ""))
    for dtype in ("float32", "bfloat16", "fp8", "int8"):
        pred = feature_cache.predict_bytes(tokens, rows, features, len(layers), shape.hidden_size, dtype, topk)
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
    if args.nproc is not None and not 1 <= args.nproc <= 1024:
        raise UserError(f"--nproc {args.nproc}: give a number of builder processes from 1 to 1024")
    if args.nproc is not None and not args.features:
        raise UserError("--nproc N builds the feature cache with N processes: add --features")
    rank, world, _ = ranks()
    if args.features:
        check_target_sharding(cfg)
    target = None
    if cfg.regenerate.output and world > 1:  # under torchrun: every rank would regenerate the same rows
        import os

        if not os.path.exists(cfg.regenerate.output):
            raise UserError(f"regenerate.output {cfg.regenerate.output} does not exist yet: regenerate in one process "
                            "first (`draftsmith prepare recipe.yaml`), then build the cache with several ranks")
        if rank == 0:
            print(f"draftsmith prepare: {world} ranks build the feature cache from {cfg.regenerate.output} as it is "
                  "(regeneration runs only in one process)", file=sys.stderr)
    elif cfg.regenerate.output:
        from draftsmith.data.regenerate import check_outputs

        check_outputs(cfg.regenerate.output)  # a FIFO or device node: refused before the target loads
        if cfg.regenerate.generator == "local" or (args.features and not args.nproc):
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
    if args.features and args.nproc and args.nproc > 1:
        if world > 1:
            raise UserError("--nproc under torchrun: torchrun already starts the ranks; drop --nproc")
        del target
        return spawn_builders(args, args.nproc)
    if args.features:
        run_features(cfg, target, fmt=args.format)
    return 0
