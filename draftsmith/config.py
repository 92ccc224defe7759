"""Typed recipe schema, YAML loading, `key.sub=value` overrides and error reporting.

A recipe is YAML data validated against the dataclasses below. Unknown keys are errors
with a "did you mean" suggestion; every error in a recipe is reported at once; the
resolved config (defaults filled in, overrides applied) is saved with every checkpoint,
result and export.

    from draftsmith import config
    cfg = config.load("recipes/quickstart.yaml", ["train.max_steps=10"])
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional, Union

import yaml

from draftsmith.core.bounds import MAX_BATCH_SIZE, MAX_GRAD_ACCUM
from draftsmith.core.errors import ConfigError, UserError
from draftsmith.core.files import MAX_YAML_BYTES, read_received_bytes
from draftsmith.core.safe_yaml import MAX_REPR, YAMLBoundError, short_repr
from draftsmith.core.safe_yaml import load as load_yaml  # defined beside the other expected errors; raised here
from draftsmith.core.urls import has_userinfo, redacted

# --------------------------------------------------------------------------- schema


@dataclass
class TargetConfig:
    # A local directory, a Hugging Face id, a .gguf file, "installed:gemma3-270m" (a model a script in
    # scripts/ installs, docs/targets.md) or "builtin:pycode-tiny" (the embedded default).
    path: str = "builtin:pycode-tiny"
    # Weights dtype of the frozen target; fp32 is exact on CPU, bf16 halves memory on GPU.
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # "auto" picks cuda when available, else cpu.
    device: str = "auto"
    # Hub revision (only for Hugging Face ids).
    revision: Optional[str] = None
    trust_remote_code: bool = False
    # The GGUF file inside the `path` directory, when it holds several (a .gguf `path` names it already).
    gguf_file: Optional[str] = None


@dataclass
class DataConfig:
    # One or more files: JSONL/JSON conversations (ShareGPT or OpenAI form), plain text, or prompts;
    # parquet / arrow files, save_to_disk folders, hf:ORG/NAME[?split=..&config=..&revision=..] (data/hf_sources.py).
    path: list[str] = field(default_factory=list)
    # "auto" detects the form per row.
    format: Literal["auto", "sharegpt", "openai", "text", "prompts"] = "auto"
    # Sequences are truncated to this many tokens (prompt + answer).
    max_length: int = 512
    # "auto": the tokenizer's chat template when it has one, else draftsmith's plain format.
    chat_template: Literal["auto", "plain"] = "auto"
    # Keep at most this many usable rows (None: all).
    max_samples: Optional[int] = None
    # Rows held out for evaluation during training (taken from the end of the data).
    eval_samples: int = 0
    # Text files are cut into chunks of this many tokens; loss on every token.
    text_chunk_tokens: int = 256
    # 0: tokenize in this process. N >= 1: tokenize through datasets' Dataset.map with N processes,
    # cached by fingerprint (a rerun over the same data and recipe does not tokenize again).
    num_proc: int = 0
    # Read, tokenize and batch rows lazily (corpora larger than memory); needs train.max_steps.
    # Heldout rows are the FIRST eval_samples; order: a seeded shuffle buffer of this many rows.
    streaming: bool = False
    shuffle_buffer: int = 1024
    # Sequence packing: several documents per training row of at most this many tokens, each with
    # its own positions and no attention across documents (packing.py); None: one per row.
    pack_length: Optional[int] = None


@dataclass
class FeaturesConfig:
    # online: target forward inside each step; offline: read the feature cache.
    mode: Literal["online", "offline"] = "online"
    # Where the offline feature cache lives (written by `draftsmith prepare --features`).
    cache_dir: Optional[str] = None
    # Storage dtype of cached hidden states; int8 / fp8 (e4m3) keep one scale per token and target
    # layer and take about half of bf16's bytes (`draftsmith prepare RECIPE --dry-run` predicts the size).
    dtype: Literal["bfloat16", "float16", "float32", "int8", "fp8"] = "bfloat16"
    # Rows per safetensors shard in the cache.
    shard_rows: int = 256
    # Rows per target forward while building the cache (memory vs speed; results are per row).
    build_batch_size: int = 8
    # Run the target in this dtype while building the cache (null: target.dtype). bfloat16 halves the
    # build on a CPU with avx512_bf16 or AMX; the cache keeps the fingerprint of the target as loaded.
    build_dtype: Optional[Literal["bfloat16", "float16", "float32"]] = None
    # Where offline features come from: draftsmith's own cache (cache_dir), or a folder of per-request
    # hidden-states files written by vLLM's extract_hidden_states connectors (or by
    # `draftsmith prepare --features --format vllm`), read from features.dir (docs/training-at-scale.md).
    source: Literal["draftsmith", "vllm"] = "draftsmith"
    # features.source vllm: the folder of vLLM hidden-states files (*.safetensors, *.safetensors.zst).
    dir: Optional[str] = None
    # Offline cache only: also store the target's K largest logits per position (`prepare --features`), and train
    # on soft labels over those K instead of replaying the lm_head every step (softmax over the K entries the
    # draft vocabulary holds; the argmax is the cached first). null: the full logits, replayed from the cached last
    # hidden state. Only kinds whose labels heads/vocab_loss makes alone (their class sets takes_topk_labels).
    label_topk: Optional[int] = None


@dataclass
class DeepSpeedConfig:
    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False


@dataclass
class WorkloadEvalConfig:
    # At each held-out evaluation (train.eval_every), also measure the drafter on the target's own greedy answers
    # to the first num_prompts prompts of these `draftsmith eval` workloads (mt_bench, gsm8k, jsonl:PATH, ...):
    # the contexts draftsmith's loop sees, so the logged eval_<workload>/acc_i stand for the loop's acceptance
    # (train/workload_eval.py), and `draftsmith plan RUN --workload NAME` fits them.
    workloads: list[str] = field(default_factory=list)
    num_prompts: int = 10
    max_new_tokens: int = 128
    prompt_format: Literal["auto", "chat", "plain", "raw"] = "auto"


@dataclass
class TrainConfig:
    output_dir: str = "runs/default"
    seed: int = 0
    # Optimizer steps to run; an epoch count is derived from data when max_steps is None.
    max_steps: Optional[int] = 100
    epochs: int = 1
    # Sequences per micro-batch on each rank.
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 3.0e-4
    # Cosine decays to lr * min_lr_ratio.
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    max_grad_norm: float = 1.0
    # auto: bf16 autocast on CUDA with bf16 support, fp32 elsewhere.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    log_every: int = 10
    save_every: int = 0  # 0: only the final checkpoint
    keep_last: int = 2
    eval_every: int = 0
    workload_eval: WorkloadEvalConfig = field(default_factory=WorkloadEvalConfig)
    # Continue from the newest checkpoint in output_dir (true), a path, or start fresh (false).
    resume: Union[bool, str] = False
    # Warm start: load drafter weights only from a checkpoint directory or a `draftsmith export` directory.
    init_from: Optional[str] = None
    # Train on every position's target label, the prompt's too, not only the answer's (the rows' loss_mask):
    # the target's own next-token distribution over a user's words teaches the same map from its hidden states
    # to its choice. Held-out evaluation stays on the answer positions. Only kinds whose labels are the target's
    # logits (those that take features.label_topk). docs/training.md "Learn-fast levers".
    loss_on_prompt: bool = False
    backend: Literal["single", "ddp", "fsdp2", "deepspeed"] = "single"
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    # The frozen target: a full copy on every rank, or its decoder layers sharded with FSDP2
    # (for targets too large for one device; needs a multi-process backend).
    target_sharding: Literal["replicate", "fsdp2"] = "replicate"
    # Memory-lean training (docs/training-at-scale.md). TTT attention kernel of the EAGLE draft
    # layer: "auto" = flex on CUDA, chunked on CPU; "eager" = the reference with full score tensors.
    ttt_attention: Literal["auto", "eager", "chunked", "flex"] = "auto"
    # Recompute each draft-layer TTT step in backward instead of keeping its activations.
    gradient_checkpointing: bool = False
    # torch.compile the drafter with this backend (null: off; "inductor" on GPU; "eager" traces only).
    compile: Optional[Literal["inductor", "aot_eager", "eager"]] = None


@dataclass
class LoggingConfig:
    report_to: list[Literal["console", "wandb", "tensorboard"]] = field(default_factory=lambda: ["console"])
    project: str = "draftsmith"
    run_name: Optional[str] = None
    # wandb mode: offline works with no network.
    wandb_mode: Literal["online", "offline", "disabled"] = "offline"
    progress_bar: bool = True


@dataclass
class RegenerateConfig:
    # local: batched HF generate on the target; openai: an OpenAI-compatible HTTP server; answers: the
    # answers kept in answers_file (data/shipped_answers.py), made earlier by one of the other two.
    generator: Literal["local", "openai", "answers"] = "local"
    answers_file: Optional[str] = None  # generator answers: a .jsonl.gz of answers keyed by prompt
    endpoint: Optional[str] = None  # e.g. http://127.0.0.1:8000/v1
    model: Optional[str] = None  # model name sent to the endpoint
    # No API key setting here: a shared recipe must not choose which secret is sent where. The key
    # comes from `--api-key-env NAME` on the command line or from DRAFTSMITH_API_KEY.
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    batch_size: int = 8
    timeout_s: float = 120.0
    output: Optional[str] = None  # JSONL written by `draftsmith prepare`
    # Regenerate only the first N input rows (None: all); `draftsmith train` regenerates first when output is set.
    limit: Optional[int] = None
    # Seed of sampled generation (temperature > 0); each batch reseeds with seed + its index.
    seed: int = 0
    # openai generator only: "chat" posts messages to /chat/completions (the server applies its
    # template); "completions" posts draftsmith's rendered prompt text to /completions.
    api: Literal["chat", "completions"] = "chat"


def _default_kind() -> str:
    from draftsmith.heads import DEFAULT_KIND  # local import: heads import torch

    return DEFAULT_KIND


@dataclass
class DrafterConfig:
    # The drafter kind (registered in draftsmith/heads; default: heads.DEFAULT_KIND).
    kind: str = field(default_factory=_default_kind)
    # The kind's own options: an instance of its Config dataclass (heads/<kind>.py), typed by from_dict
    # (typed_drafter_options); None builds the kind's defaults. config.yaml saves its mapping (options_mapping).
    options: Any = None
    # A recipe writes the options as a mapping (beside kind, or under drafter.options): the validator checks
    # that form, then from_dict types it with the kind's Config.
    WRITTEN_AS: ClassVar[dict] = {"options": dict[str, Any]}

    def __post_init__(self) -> None:
        from draftsmith.heads import DRAFTERS  # local import: heads import torch

        if self.options is None and isinstance(self.kind, str) and self.kind in DRAFTERS:
            self.options = DRAFTERS.get(self.kind).Config()


@dataclass
class RecipeConfig:
    name: str = "recipe"
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)


# --------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check(value: Any, tp: Any, where: str, problems: list[str]) -> Any:
    """Validate `value` against type `tp`; return the converted value (problems appended)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, problems)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors: list[str] = []
        options = [a for a in args if a is not type(None)]
        for option in options:
            trial: list[str] = []
            out = _check(value, option, where, trial)
            if not trial:
                return out
            errors.extend(trial)
        if len(options) == 1 and dataclasses.is_dataclass(options[0]):
            problems.extend(errors)  # an optional section: name the bad key inside it
            return out  # the section built from its valid keys
        if len(options) == 1 and options[0] in (int, float) and isinstance(value, int) and not isinstance(value, bool):
            problems.extend(errors)  # Optional[int] = 10**400: say why the integer is refused
            return value
        problems.append(f"{where}: {short_repr(value)} is not {' or '.join(_type_name(a) for a in args)}")
        return value
    if origin is Literal:
        if value not in args:
            hint = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            tip = f" (did you mean {hint[0]!r}?)" if hint else ""
            problems.append(f"{where}: {short_repr(value)} is not one of {list(args)}{tip}")
        return value
    if origin is list:
        if isinstance(value, (str, int, float)) and args and args[0] is str:
            value = [value]  # a single path may be written without a list
        if not isinstance(value, list):
            problems.append(f"{where}: expected a list, got {short_repr(value)}")
            return value
        return [_check(v, args[0], f"{where}[{i}]", problems) for i, v in enumerate(value)] if args else value
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a mapping, got {short_repr(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 2e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{where}: expected a number, got {short_repr(value)}")
            return value
        try:
            float(value)
        except OverflowError:  # an integer past 1.8e308: float(10**400) raises
            problems.append(f"{where}: expected a finite number, got {_huge(value)}")
            return value
        if not math.isfinite(float(value)):  # .inf / .nan (YAML) are never a setting
            problems.append(f"{where}: expected a finite number, got {value}")
            return value
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{where}: expected an integer, got {short_repr(value)}")
        elif abs(value) > MAX_INT:  # no count, size or seed goes past int64 (torch, numpy and range() refuse it)
            problems.append(f"{where}: expected an integer within int64 (|value| <= {MAX_INT:,}), got {_huge(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{where}: expected true or false, got {short_repr(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{where}: expected a string, got {short_repr(value)}")
        return value
    return value


MAX_NUM_PROC = 256  # tokenizing processes (data.num_proc=10^12 started a worker per row and hung)
MAX_INT = 2**63 - 1  # int64: the largest integer torch, numpy and the file formats hold


def _huge(value: int) -> str:
    """A huge integer in a message: its sign and digit count, not 400 digits."""
    return f"an integer of {len(str(abs(value)))} digits" if abs(value) > 10**30 else f"{value:,}"


# Keys recipes may no longer set, with the reason and the replacement.
REMOVED_KEYS = {
    "regenerate.api_key_env": "recipes can no longer name the API key's variable (a shared recipe could send any "
                              "secret anywhere); remove it and pass --api-key-env NAME on the command line, "
                              "or set DRAFTSMITH_API_KEY",
}


MAX_PROBLEMS = 50  # problems listed for one recipe; the rest are counted


def _build(cls: type, data: Any, where: str, problems: list[str]) -> Any:
    """Build dataclass `cls` from a mapping, collecting every problem instead of stopping."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{where or 'recipe'}: expected a mapping, got {short_repr(data)}")
        return cls()
    hints = {**typing.get_type_hints(cls), **getattr(cls, "WRITTEN_AS", {})}  # a field's recipe form, where it differs
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        key_path = f"{where}.{key}" if where else str(key)
        if key_path in REMOVED_KEYS:
            problems.append(f"{key_path}: {REMOVED_KEYS[key_path]}")
            continue
        if key not in names:
            many = len(problems) >= MAX_PROBLEMS  # only the first are listed: no "did you mean" for the rest
            hint = [] if many else difflib.get_close_matches(str(key)[:MAX_REPR], names, n=1)
            tip = f"; did you mean {(where + '.' if where else '') + hint[0]!r}?" if hint else ""
            problems.append(f"unknown key {short_repr(key_path)}{tip} (known: {', '.join(names)})")
            continue
        kwargs[key] = _check(value, hints[key], key_path, problems)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        problems.append(f"{where or 'recipe'}: {exc}")
        return cls()


def build_dataclass(cls: type, data: Any, where: str = "") -> tuple[Any, list[str]]:
    """Public form of the validator: returns (instance, problems)."""
    problems: list[str] = []
    return _build(cls, data, where, problems), problems


# --------------------------------------------------------------------------- overrides and loading


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one `key.sub=value` override to raw recipe data (value parsed as YAML)."""
    if "=" not in assignment:
        raise ConfigError("command line", [f"override {assignment!r} must look like key.sub=value"])
    key, text = assignment.split("=", 1)
    try:
        value = load_yaml(text, f"override {key.strip()}") if text != "" else ""
    except YAMLBoundError as exc:
        raise ConfigError("command line", [str(exc)]) from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise ConfigError("command line", [f"override {key.strip()}: {text[:60]!r} is not a YAML value "
                                           f"({' '.join(str(exc).split())[:200]}); quote it as a string"]) from None
    parts = key.strip().split(".")
    if len(parts) > 1 and parts[0] == "drafter" and parts[1] not in ("kind", "options"):
        parts.insert(1, "options")  # drafter.ttt_steps and drafter.options.ttt_steps name one setting: the last wins
    node = raw
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _split_drafter(raw: dict) -> list[str]:
    """Drafter options sit beside `kind` in YAML; move them under `options` for validation. An option
    written both ways with two values is a problem (the flat one silently won: `drafter.options.ttt_steps=2`
    trained with the recipe's `drafter.ttt_steps: 5`); overrides never conflict (apply_override writes
    both spellings to drafter.options)."""
    section = raw.get("drafter")
    problems = []
    if isinstance(section, dict):
        given = section.get("options") or {}
        if not isinstance(given, dict):  # `options: 5`: _build names drafter.options
            return problems
        options = dict(given)
        for key in list(section):
            if key not in ("kind", "options"):
                value = section.pop(key)
                if key in options and options[key] != value:
                    name = str(key)[:MAX_REPR]
                    problems.append(f"drafter.{name} is {short_repr(value)} but drafter.options.{name} is "
                                    f"{short_repr(options[key])}: write the option once "
                                    "(beside drafter.kind, or under drafter.options)")
                options[key] = value
        section["options"] = options
    return problems


def typed_drafter_options(kind: str, options: Any) -> tuple[Any, list[str], list[str]]:
    """The one path from drafter options written as a mapping to the kind's typed Config (heads/<kind>.py):
    -> (Config instance, type problems, range problems). from_dict types a recipe's drafter section here once
    (cfg.drafter.options is that Config); doctor types the options an export records. The Config's mapping is
    what config.yaml saves (options_mapping)."""
    from draftsmith.heads import DRAFTERS  # local import: heads import torch

    try:
        drafter_cls = DRAFTERS.get(kind)
    except KeyError as exc:
        return None, [f"drafter.kind: {exc.args[0]}"], []
    typed, problems = build_dataclass(drafter_cls.Config, options, "drafter")
    ranges = typed.problems() if not problems and hasattr(typed, "problems") else []
    return typed, problems, ranges


def options_mapping(typed: Any) -> dict:
    """A drafter Config as saved (config.yaml's drafter.options, drafter.json's options)."""
    return dataclasses.asdict(typed)


def from_dict(raw: dict, source: str = "recipe", overrides: list[str] | None = None) -> RecipeConfig:
    try:  # deep copy, plain types only, within the bounds of safe_yaml (depth, expanded size)
        raw = load_yaml(yaml.safe_dump(raw or {}), source)
    except RecursionError:
        raise ConfigError(source, ["nested too deeply to read; flatten the recipe"]) from None
    except YAMLBoundError as exc:
        raise ConfigError(source, [exc.detail]) from None
    split = _split_drafter(raw)  # before the overrides, so that an override replaces either spelling
    for assignment in overrides or []:
        apply_override(raw, assignment)
    split += _split_drafter(raw)  # an override of the whole drafter section
    cfg, problems = build_dataclass(RecipeConfig, raw)
    problems = split + problems
    drafter_ranges: list[str] = []
    if isinstance(cfg.drafter.kind, str) and isinstance(cfg.drafter.options, dict):  # the mapping, typed once
        cfg.drafter.options, sub, drafter_ranges = typed_drafter_options(cfg.drafter.kind, cfg.drafter.options)
        problems.extend(sub)
    if not problems:  # value checks need well-typed values
        problems.extend(_semantic_checks(cfg))
        problems.extend(_range_checks(cfg))
        problems.extend(drafter_ranges)
    if problems:
        raise ConfigError(source, _at_most(problems))
    return cfg


def _at_most(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more problem(s)"]


def _semantic_checks(cfg: RecipeConfig) -> list[str]:
    problems = []
    t = cfg.train
    if t.batch_size < 1:
        problems.append("train.batch_size: must be >= 1")
    if t.grad_accum < 1:
        problems.append("train.grad_accum: must be >= 1")
    for key, value, bound in (("train.batch_size", t.batch_size, MAX_BATCH_SIZE),
                              ("train.grad_accum", t.grad_accum, MAX_GRAD_ACCUM),
                              ("features.build_batch_size", cfg.features.build_batch_size, MAX_BATCH_SIZE),
                              ("regenerate.batch_size", cfg.regenerate.batch_size, MAX_BATCH_SIZE),
                              ("data.num_proc", cfg.data.num_proc, MAX_NUM_PROC)):
        if value > bound:
            problems.append(f"{key}: must be <= {bound:,} (core/bounds.py), got {_huge(value)}")
    if t.max_steps is not None and t.max_steps < 1:
        problems.append("train.max_steps: must be >= 1 (or null to train for train.epochs)")
    if t.target_sharding == "fsdp2" and t.backend == "single":
        problems.append("train.target_sharding: fsdp2 needs train.backend ddp, fsdp2 or deepspeed (launched with --nproc)")
    if cfg.features.mode == "offline" and cfg.features.source == "draftsmith" and not cfg.features.cache_dir:
        problems.append("features.cache_dir: required when features.mode is offline")
    if cfg.features.source == "vllm" and (cfg.features.mode != "offline" or not cfg.features.dir):
        problems.append("features.source: vllm reads a folder of vLLM hidden-states files: set features.mode: offline "
                        "and features.dir: DIR")
    problems.extend(_label_topk_checks(cfg))
    problems.extend(_loss_on_prompt_checks(cfg))
    problems.extend(_workload_eval_checks(cfg))
    if cfg.data.max_length < 8:
        problems.append("data.max_length: must be >= 8 tokens")
    if cfg.data.pack_length is not None and cfg.data.pack_length < cfg.data.max_length:
        problems.append(f"data.pack_length: {cfg.data.pack_length} is below data.max_length ({cfg.data.max_length}); "
                        "raise it to at least max_length (e.g. 4 * max_length) or set it to null")
    return problems


def _label_topk_checks(cfg: RecipeConfig) -> list[str]:
    """features.label_topk: draftsmith's offline cache, and a kind whose labels vocab_loss makes."""
    f = cfg.features
    if f.label_topk is None:
        return []
    if f.mode != "offline" or f.source != "draftsmith":
        return [f"features.label_topk: {f.label_topk} reads the top-K logits of draftsmith's offline feature cache: "
                "set features.mode: offline (features.source: draftsmith), or remove features.label_topk"]
    from draftsmith.heads import DRAFTERS  # local import: heads import torch

    if cfg.drafter.kind in DRAFTERS.names() and not DRAFTERS.get(cfg.drafter.kind).takes_topk_labels:
        return [f"features.label_topk: drafter kind {cfg.drafter.kind} reads the target's full logits, not only soft "
                "labels over the draft vocabulary; remove features.label_topk for it"]
    return []


def _loss_on_prompt_checks(cfg: RecipeConfig) -> list[str]:
    """train.loss_on_prompt: a kind whose every label is the target's (a prompt's own tokens are no label)."""
    if not cfg.train.loss_on_prompt:
        return []
    from draftsmith.heads import DRAFTERS  # local import: heads import torch

    if cfg.drafter.kind not in DRAFTERS.names():
        return []
    kind = DRAFTERS.get(cfg.drafter.kind)
    if not kind.takes_topk_labels:
        return [f"train.loss_on_prompt: drafter kind {cfg.drafter.kind} does not learn from the target's logits alone, "
                "so a prompt position has no label for it; remove train.loss_on_prompt"]
    if cfg.data.pack_length and kind.labels_cross_packed_documents:
        return [f"train.loss_on_prompt: drafter kind {cfg.drafter.kind}'s labels run past the end of a packed document, "
                "into the next one's prompt; unset data.pack_length or train.loss_on_prompt"]
    return []


def _workload_eval_checks(cfg: RecipeConfig) -> list[str]:
    """train.workload_eval: text workloads, evaluated at some step, on a target every rank holds whole."""
    t, w = cfg.train, cfg.train.workload_eval
    if not w.workloads:
        return []
    problems = [message for ok, message in [
        (w.num_prompts >= 1, f"train.workload_eval.num_prompts: must be >= 1, got {w.num_prompts}"),
        (w.max_new_tokens >= 1, f"train.workload_eval.max_new_tokens: must be >= 1, got {w.max_new_tokens}"),
        (t.eval_every >= 1, "train.workload_eval: its workloads are measured at each held-out evaluation; set "
                            "train.eval_every (e.g. train.max_steps / 10)"),
        (t.target_sharding == "replicate", "train.workload_eval: the target answers its prompts on each rank alone, "
                                           "which a target sharded over ranks cannot; set train.target_sharding: "
                                           "replicate or remove train.workload_eval"),
    ] if not ok]
    images = [n for n in w.workloads if n == "images" or n.startswith("images:")]
    if images:  # the names themselves are checked when training starts (train/workload_eval.prompts)
        problems.append(f"train.workload_eval.workloads: {images[0]} is an image workload; training evaluates text "
                        "prompts only (measure images with `draftsmith eval`)")
    if "long_context" in w.workloads:
        problems.append("train.workload_eval.workloads: long_context fills the target's positions, which every "
                        "evaluation would run the drafter over; measure it with `draftsmith eval`")
    return problems


# Bounds past which a value means nothing (a NaN checkpoint, or memory no machine has).
MAX_LABEL_TOPK = 1 << 20  # top-K logits per position; a K past the target's vocabulary is refused at build
MAX_LR = 10.0
MAX_WEIGHT_DECAY = 10.0  # AdamW multiplies it by lr: lr * weight_decay >= 1 flips the weights' sign
MAX_TOKENS = 1 << 20  # one training row; the target's own position limit is checked when it is loaded


def _range_checks(cfg: RecipeConfig) -> list[str]:
    """Numeric ranges of the common sections (each drafter kind checks its own in Config.problems)."""
    t, d, f, r = cfg.train, cfg.data, cfg.features, cfg.regenerate
    rules = [
        (t.lr > 0, f"train.lr: must be > 0, got {t.lr}"),
        (t.lr <= MAX_LR, f"train.lr: must be <= {MAX_LR:g}, got {t.lr:g}"),
        (0 <= t.seed < 2**32, f"train.seed: must lie in [0, 2**32), got {t.seed}"),
        (0 <= r.seed < 2**32, f"regenerate.seed: must lie in [0, 2**32), got {r.seed}"),
        (0 <= t.min_lr_ratio <= 1, f"train.min_lr_ratio: must lie in [0, 1], got {t.min_lr_ratio}"),
        (t.warmup_steps >= 0, f"train.warmup_steps: must be >= 0, got {t.warmup_steps}"),
        (t.weight_decay >= 0, f"train.weight_decay: must be >= 0, got {t.weight_decay}"),
        (t.weight_decay <= MAX_WEIGHT_DECAY, f"train.weight_decay: must be <= {MAX_WEIGHT_DECAY:g}, got {t.weight_decay:g}"),
        (len(t.betas) == 2 and all(0 <= b < 1 for b in t.betas),
         f"train.betas: must be two numbers in [0, 1), got {t.betas}"),
        (t.max_grad_norm >= 0, f"train.max_grad_norm: must be >= 0 (0: no clipping), got {t.max_grad_norm}"),
        (t.epochs >= 1, f"train.epochs: must be >= 1, got {t.epochs}"),
        (t.log_every >= 1, f"train.log_every: must be >= 1, got {t.log_every}"),
        (t.save_every >= 0, f"train.save_every: must be >= 0 (0: only the final checkpoint), got {t.save_every}"),
        (t.keep_last >= 1, f"train.keep_last: must be >= 1, got {t.keep_last}"),
        (t.eval_every >= 0, f"train.eval_every: must be >= 0, got {t.eval_every}"),
        (d.max_length <= MAX_TOKENS, f"data.max_length: must be <= {MAX_TOKENS:,} tokens, got {d.max_length:,}"),
        (d.pack_length is None or d.pack_length <= MAX_TOKENS,
         f"data.pack_length: must be <= {MAX_TOKENS:,} tokens or null, got {d.pack_length}"),
        (d.max_samples is None or d.max_samples >= 1, f"data.max_samples: must be >= 1 or null, got {d.max_samples}"),
        (d.eval_samples >= 0, f"data.eval_samples: must be >= 0, got {d.eval_samples}"),
        (d.text_chunk_tokens >= 2, f"data.text_chunk_tokens: must be >= 2, got {d.text_chunk_tokens}"),
        (f.shard_rows >= 1, f"features.shard_rows: must be >= 1, got {f.shard_rows}"),
        (f.build_batch_size >= 1, f"features.build_batch_size: must be >= 1, got {f.build_batch_size}"),
        (f.label_topk is None or 1 <= f.label_topk <= MAX_LABEL_TOPK, f"features.label_topk: must lie in "
         f"[1, {MAX_LABEL_TOPK:,}] or be null, got {f.label_topk if f.label_topk is None else _huge(f.label_topk)}"),
        (r.max_new_tokens >= 1, f"regenerate.max_new_tokens: must be >= 1, got {r.max_new_tokens}"),
        (r.temperature >= 0, f"regenerate.temperature: must be >= 0 (0: greedy), got {r.temperature}"),
        (0 < r.top_p <= 1, f"regenerate.top_p: must lie in (0, 1], got {r.top_p}"),
        (r.batch_size >= 1, f"regenerate.batch_size: must be >= 1, got {r.batch_size}"),
        (r.timeout_s > 0, f"regenerate.timeout_s: must be > 0, got {r.timeout_s}"),
        (r.limit is None or r.limit >= 1, f"regenerate.limit: must be >= 1 or null, got {r.limit}"),
        (not has_userinfo(r.endpoint), f"regenerate.endpoint: {redacted(r.endpoint)} holds a user name or password; a "
                                       "recipe travels, so credentials never go in it: remove them from the URL and "
                                       "pass a key with --api-key-env NAME or $DRAFTSMITH_API_KEY (sent as a Bearer token)"),
    ]
    return [message for ok, message in rules if not ok]


def load(path: str | Path, overrides: list[str] | None = None) -> RecipeConfig:
    path = Path(path)
    try:
        text = read_received_bytes(path, "recipe", MAX_YAML_BYTES).decode("utf-8")  # a regular file, bounded
    except UserError as exc:  # a FIFO, a device, past the size bound
        raise ConfigError(str(path), [str(exc).removeprefix(f"{path}: ")]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the recipe: {exc.strerror}"]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                                      "save the recipe as UTF-8"]) from None
    try:
        raw = load_yaml(text, str(path)) or {}
    except YAMLBoundError as exc:  # bad syntax, aliases past a bound, deep nesting, a repeated key
        raise ConfigError(str(path), [exc.detail]) from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise ConfigError(str(path), [f"not valid YAML: {' '.join(str(exc).split())[:200]}"]) from None
    if not isinstance(raw, dict):
        raise ConfigError(str(path), ["the recipe must be a YAML mapping at top level"])
    return from_dict(raw, str(path), overrides)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
