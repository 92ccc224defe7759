"""What every export format shares: the options, the files an exporter produces, the two registries (EXPORTERS:
format -> Exporter; layouts(format): kind -> Layout, with REFUSED: why a format takes no drafter of a kind), the
Layout base, the sidecar, and the draft layer's Llama fields (rope carried from the target, sliding windows).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from draftsmith import __version__
from draftsmith import config as config_mod
from draftsmith.core.errors import UserError
from draftsmith.core.registry import Registry
from draftsmith.targets.archs import text_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
SIDECAR_FILE = "draftsmith.json"  # verifier identity, training meta, resolved recipe, serving command


@dataclass
class ExportOptions:
    # Weights dtype of the export; None keeps the checkpoint's (float32 for CPU-trained drafters).
    dtype: str | None = None
    # Draft tokens per round written into the serving config; None: the drafter's own default.
    num_speculative_tokens: int | None = None
    # The verifier as the engine should load it (HF id or path); None: the recipe's target.path.
    verifier: str | None = None
    # The engine release to serve with (--engine-version, e.g. vLLM 0.27.0); None: the newest release whose
    # loaders draftsmith has read (export/engine_versions.py). The gate refuses a kind that release cannot serve.
    engine_version: str | None = None
    # The format's own flags (its Exporter.Flags dataclass: --target-gguf for llama.cpp, --max-model-len for hf, ...):
    # given as {field name: value}; export() checks them against the format and hands layouts the typed Flags.
    flags: Any = field(default_factory=dict)


@dataclass
class ExportFiles:
    config: dict  # config.json
    tensors: dict[str, torch.Tensor]  # model.safetensors (empty when `writer` writes the weights)
    sidecar: dict  # draftsmith.json
    extra: dict[str, str] = field(default_factory=dict)  # other text files, name -> content
    writer: object = None  # optional callable(dir): writes a whole HF model dir (draft LM)


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


class ExportValidationError(UserError):
    """Every problem found in one export, one per line."""

    def __init__(self, where: str, problems: list[str]):
        self.problems = problems
        if len(problems) == 1:  # the one-line contract of expected errors
            super().__init__(f"export to {where} failed validation, nothing was written: {problems[0]}")
            return
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"export to {where} failed validation ({len(problems)} problem(s)); nothing was written:\n{lines}")


# Every export format, registered under its --to name (`@EXPORTERS.register("vllm")`); export/__init__.py
# imports each format's module so that the registry is full once draftsmith.export is imported.
EXPORTERS: Registry = Registry("export format")
# format -> its layouts, one per drafter kind it takes, registered under the kind's name in the format's
# own file: `@layouts("vllm").register(KIND)` (one layout class may serve several kinds).
LAYOUTS: dict[str, Registry] = {}


def flags_of(fmt: str, opts: ExportOptions):
    """opts.flags as format `fmt`'s typed Flags (Exporter.Flags). export() types them after refusing what the format
    does not take; a layout called directly (a test, another format's export) gets the format's defaults here."""
    return EXPORTERS.get(fmt)().typed_flags(opts.flags)


def unregister_format(fmt: str) -> None:
    """Remove a format registered for one test or session: its exporter, its layouts and its refusal lines."""
    EXPORTERS.unregister(fmt)
    LAYOUTS.pop(fmt, None)
    REFUSED.unregister_format(fmt)


def layouts(fmt: str) -> Registry:
    """The layout registry of export format `fmt` (kind -> layout class)."""
    return LAYOUTS.setdefault(fmt, Registry(f"{fmt} export layout"))


def kind_of_layout(fmt: str, cls: type) -> str:
    """The kind `cls` itself is registered for under `fmt` (e.g. the EAGLE-3 layout's, whose vLLM method
    P-EAGLE is served through)."""
    kinds = [k for k in layouts(fmt).names() if layouts(fmt).get(k) is cls]
    if len(kinds) != 1:
        raise LookupError(f"{cls.__name__} is registered for {kinds} under {fmt}, not for exactly one kind")
    return kinds[0]


def formats_with_layout(kind: str) -> list[str]:
    """The formats that register a layout for `kind` (sorted), whatever the engine release."""
    return [fmt for fmt in EXPORTERS.names() if kind in layouts(fmt)]


def not_taken(fmt: str, kind: str) -> str | None:
    """The one-line reason `--to fmt` refuses every `kind` drafter (no layout: REFUSED's line, else
    the generic one naming what the format and the kind take); None when the format has a layout for it."""
    if kind in layouts(fmt):
        return None
    fits = formats_with_layout(kind)
    why = REFUSED.reason(fmt, kind, fits)
    if why:
        return why
    return (f"--to {fmt} does not take {kind} drafters (it takes {layouts(fmt).names()}); "
            f"formats for {kind}: {fits}")


class Layout:
    """One drafter kind's files in one engine format: how they are built, the config keys and tensors
    the engine reads, the checks beyond names and shapes, and the load-back of the round trip."""

    # validate.py checks d2t/t2d of the files against the trained drafter's mapping
    carries_vocab_map: ClassVar[bool] = False

    @property
    def drafter_class(self):
        """The drafter kind this layout was made for (heads/<kind>.py): its class facts, e.g. tokens_per_round."""
        from draftsmith.heads import DRAFTERS

        return DRAFTERS.get(self.kind)

    def __init__(self, name: str, engine: str, kind: str = ""):
        self.name, self.engine = name, engine  # the format's --to name and its engine (sidecar, messages)
        self.kind = kind  # the drafter kind this layout is registered (and built) for

    def refusals(self, target_config) -> list[str]:
        """Why this layout cannot serve a target of transformers `target_config` (inspect, the matrix)."""
        return []

    def check_loaded(self, loaded, opts: ExportOptions) -> None:
        """Raise a one-line UserError when this trained drafter cannot be served in this format (called
        before any file is built; most layouts check while building)."""

    # ExportOptions fields only this layout reads (export/options.py refuses them for other layouts)
    own_options: ClassVar[frozenset[str]] = frozenset()

    def options_for(self, opts: ExportOptions, version: str | None) -> ExportOptions:
        """`opts` as engine release `version` takes them (raises for one it cannot serve)."""
        return opts

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        raise NotImplementedError

    def required_config_keys(self) -> list[str]:
        raise NotImplementedError

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        raise NotImplementedError

    def llama_fields(self, config: dict) -> dict | None:
        return config

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        return []

    def load_back(self, export_dir: Path, loaded):
        raise NotImplementedError

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        raise NotImplementedError


# --------------------------------------------------------------------------- small helpers


def export_dtype(loaded, opts: ExportOptions) -> torch.dtype:
    if opts.dtype is None:
        floats = [t.dtype for t in loaded.drafter.state_dict().values() if t.is_floating_point()]
        return floats[0] if floats else torch.float32
    if opts.dtype not in DTYPES:
        raise UserError(f"--dtype {opts.dtype!r} is not one of {list(DTYPES)}")
    return DTYPES[opts.dtype]


def serving_dtype(loaded, opts: ExportOptions) -> torch.dtype:
    """SGLang / TensorRT-LLM: --dtype, else the TARGET's dtype (its config's torch_dtype, else its loaded
    weights'). SGLang's --dtype auto turns a float32 draft config into float16
    (srt/configs/model_config.py), and TensorRT-LLM builds the draft's modules in config.torch_dtype, so a
    float32 export of a bfloat16 target would run the draft in another precision than the target."""
    if opts.dtype is not None:
        return export_dtype(loaded, opts)
    name = declared_dtype(loaded.target)
    return DTYPES[name] if name in DTYPES else loaded.target.dtype


def declared_dtype(target) -> str | None:
    """The dtype the target's own config.json declares (`dtype`, or transformers 4's `torch_dtype`): what an
    engine serves it in. The loaded model's config says the dtype draftsmith loaded it in (float32 on CPU)."""
    import json

    from draftsmith.targets.load import resolve_path

    try:
        raw = json.loads((Path(resolve_path(str(target.path))).expanduser() / CONFIG_FILE).read_text())
    except (OSError, ValueError, TypeError):  # a hub id, a GGUF file: no local config.json to read
        return None
    for part in (raw, raw.get("text_config") if isinstance(raw, dict) else None):  # multimodal: text_config
        value = (part.get("dtype") or part.get("torch_dtype")) if isinstance(part, dict) else None
        if isinstance(value, str):
            return value
    return None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def cast_floats(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors to `dtype`, others (d2t int64, t2d bool) unchanged; contiguous CPU copies."""
    return {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in tensors.items()}


def rename(tensors: dict[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in tensors.items()}


def read_export(export_dir: Path) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """(config.json, draftsmith.json, tensors of model.safetensors) of an export directory."""
    export_dir = Path(export_dir)
    for name in (CONFIG_FILE, SIDECAR_FILE, WEIGHTS_FILE):
        if not (export_dir / name).exists():
            raise FileNotFoundError(f"{export_dir / name} is missing: {export_dir} is not a complete draftsmith export")
    from draftsmith.core.files import load_safetensors, read_json_object

    config = read_json_object(export_dir / CONFIG_FILE, "export's config.json")
    sidecar = read_json_object(export_dir / SIDECAR_FILE, "export's draftsmith.json")
    return config, sidecar, load_safetensors(export_dir / WEIGHTS_FILE)


def yaml_scalar(value) -> str:
    """`value` as one YAML scalar that parses back to the same string (a path with '#', ': ', quotes
    or a leading '-' stays one value), by yaml's own dumper."""
    import yaml

    return yaml.safe_dump(str(value), default_style='"', width=10**9).strip().removesuffix("\n...").strip()


def sha256_tensor(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def target_rope(target_config) -> dict:
    """The rope the draft layer runs, as a flat transformers-5 `rope_parameters` dict (archs.draft_rope:
    the target's own, its full-attention entry when rope is per layer type, whole-head rotary)."""
    from draftsmith.targets.archs import draft_rope

    return draft_rope(target_config)


def rope_scaling_of(rope: dict) -> dict | None:
    """Legacy `rope_scaling` (everything but rope_theta) or None for unscaled rope."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    return {k: v for k, v in rope.items() if k != "rope_theta"}


def rope_fields(rope: dict) -> dict:
    """Both spellings, so that readers of either transformers 4 (rope_theta + rope_scaling)
    or transformers 5 (rope_parameters) configs see the target's rope."""
    return {"rope_theta": rope.get("rope_theta", 10000.0), "rope_scaling": rope_scaling_of(rope), "rope_parameters": dict(rope)}


def llama_fields(layer_config, target_config, dtype: torch.dtype) -> dict:
    """The draft layer's Llama config as engines read it; max positions and rope from the target (a vision-language
    target's text backbone)."""
    lc, tc = layer_config, text_config(target_config)
    fields = {
        "model_type": "llama",
        "hidden_size": lc.hidden_size,
        "intermediate_size": lc.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": lc.num_attention_heads,
        "num_key_value_heads": lc.num_key_value_heads,
        "head_dim": lc.head_dim,
        "hidden_act": lc.hidden_act,
        "rms_norm_eps": lc.rms_norm_eps,
        "vocab_size": lc.vocab_size,
        "max_position_embeddings": tc.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,  # SGLang ties lm_head to embed_tokens when true: wrong for a draft vocab
        "initializer_range": getattr(lc, "initializer_range", 0.02),
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": getattr(tc, "bos_token_id", None),
        "eos_token_id": getattr(tc, "eos_token_id", None),
        "pad_token_id": getattr(tc, "pad_token_id", None),
        "torch_dtype": dtype_name(dtype),
        "dtype": dtype_name(dtype),
    }
    fields.update(rope_fields(target_rope(tc)))
    return fields


def sidecar(loaded, fmt: str, engine: str, opts: ExportOptions, extra: dict | None = None) -> dict:
    """draftsmith.json: what was exported, for which verifier, from which checkpoint."""
    from draftsmith.targets.archs import export_record

    target = loaded.target
    out = {
        "format": fmt,
        "engine": engine,
        "drafter_kind": loaded.drafter.kind,
        "verifier": {**target.identity(), "serve_as": verifier_name(loaded, opts)},
        "aux_layer_ids": loaded.drafter.feature_layers(),
        "target_architecture": export_record(target),
        "aux_layer_ids_convention": "draftsmith: id i = hidden_states[i], the input of target layer i",
        "checkpoint_meta": loaded.meta,
        "recipe": config_mod.to_dict(loaded.config),
        "draftsmith_version": __version__,
    }
    out.update(extra or {})
    return out


def verifier_name(loaded, opts: ExportOptions) -> str:
    """What the engine should load as the verifier: --verifier, else the recipe's target path
    (an embedded builtin:NAME target becomes its directory, a GGUF target its .gguf file: engines load both)."""
    from draftsmith.targets.load import serving_path

    return opts.verifier or serving_path(loaded.config.target)


def num_tokens(loaded, opts: ExportOptions, default: int) -> int:
    """Draft tokens per round for the serving config: --num-speculative-tokens, else the drafter's
    default; bounded by draftsmith.core.bounds (at most MAX_DRAFT_TOKENS, and inside the target's positions)."""
    from draftsmith.core.bounds import check_draft_tokens

    if opts.num_speculative_tokens is not None:
        k, name = opts.num_speculative_tokens, "--num-speculative-tokens"
    else:
        k = default
        trained, option = loaded.drafter.tokens_per_round(loaded.drafter.cfg), loaded.drafter.tokens_per_round_option
        name = (f"drafter.{option} (the default of --num-speculative-tokens)" if option and trained == default
                else "the drafter's default k (--num-speculative-tokens)")
    return check_draft_tokens(k, name, loaded.target.config)


# --------------------------------------------------------------------------- EAGLE-3 layout


# --------------------------------------------------------------------------- sliding-window drafts


def window_fields(drafter, num_layers: int) -> dict:
    """The draft layers' attention window as HF / vLLM read it from a (transformer_layer_)config: nothing for
    full attention (the export stays as before), else sliding_window W and layer_types all "sliding_attention"
    (vLLM's Llama and Qwen3 attention read layer_types[i] and sliding_window; transformers' Qwen3 config
    use_sliding_window and max_window_layers as well)."""
    window = drafter.attention_window(drafter.cfg)
    if window is None:
        return {}
    return {"sliding_window": int(window), "layer_types": ["sliding_attention"] * num_layers,
            "use_sliding_window": True, "max_window_layers": 0}


def window_problems(layer: dict, drafter, num_layers: int) -> list[str]:
    """The exported layer config's window fields against the trained drafter's drafter.sliding_window."""
    want = window_fields(drafter, num_layers)
    got = {k: layer.get(k) for k in ("sliding_window", "layer_types")}
    if not want:
        if got["layer_types"] and any(t != "full_attention" for t in got["layer_types"]):
            return [f"config.json: layer_types {got['layer_types']} but the drafter was trained with full attention "
                    "(drafter.sliding_window=null)"]
        return []
    problems = [f"config.json: {k} is {got[k]!r}, the drafter was trained with {want[k]!r} (drafter.sliding_window)"
                for k in got if got[k] != want[k]]
    if layer.get("use_sliding_window") is False:
        problems.append("config.json: use_sliding_window is false but the drafter was trained with a sliding window")
    return problems


def refuse_window(drafter, engine: str) -> None:
    """A format whose engine has no per-draft attention window (SGLang's and TensorRT-LLM's EAGLE-3 drafts
    attend to the whole context) would run a windowed drafter differently than it was trained: refuse."""
    window = drafter.attention_window(drafter.cfg)
    if window is not None:
        raise UserError(f"this drafter was trained with drafter.sliding_window={window}, which {engine}'s EAGLE-3 draft "
                         "cannot express (it attends to the whole context): export it with --to vllm, or retrain with "
                         "drafter.sliding_window=null for this engine")


LLAMA_KEYS = [
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "rms_norm_eps", "vocab_size", "max_position_embeddings", "rope_theta", "rope_scaling",
    "hidden_act", "tie_word_embeddings", "model_type",
]


@dataclass(frozen=True)
class Gap:
    why: str  # one line; may hold {fits}
    whole: bool = False  # True: `why` is the whole message; False: it follows "--to FMT does not take KIND drafters: "


class Refusals:
    """(format, kind) -> the one-line reason that format refuses every drafter of that kind."""

    def __init__(self):
        self._gaps: dict[tuple[str, str], Gap] = {}

    def register(self, fmt: str, kind: str, why: str, whole: bool = False) -> None:
        if (fmt, kind) in self._gaps:
            raise ValueError(f"the refusal of {kind} drafters by --to {fmt} is registered twice")
        self._gaps[(fmt, kind)] = Gap(why, whole)

    def unregister(self, fmt: str, kind: str) -> None:
        self._gaps.pop((fmt, kind), None)

    def unregister_format(self, fmt: str) -> None:
        for key in [key for key in self._gaps if key[0] == fmt]:
            del self._gaps[key]

    def reason(self, fmt: str, kind: str, fits: list[str]) -> str | None:
        """The message `--to fmt` refuses `kind` with (fits: the formats that take it), or None."""
        gap = self._gaps.get((fmt, kind))
        if gap is None:
            return None
        why = gap.why.replace("{fits}", " or ".join(f"--to {f}" for f in fits) or "no other format")
        return why if gap.whole else f"--to {fmt} does not take {kind} drafters: {why}"


REFUSED = Refusals()
