"""`draftsmith inspect TARGET`: what draftsmith sees in a target before anything is trained.

    draftsmith inspect builtin:pycode-tiny
    draftsmith inspect ../shared/models/stories260K-hf --json
    draftsmith inspect Qwen/Qwen3-8B --kind eagle3        # exit 1 if EAGLE-3 cannot serve it
    draftsmith inspect installed:gemma3-270m              # a GGUF file (scripts/install_gemma3_270m.sh)

Reads the config and tokenizer only (the model is built on the meta device, no weights are
loaded), then prints: layers, hidden size, vocabulary, rope type and parameters (the target's and
the draft layer's), architecture features (embedding scale, soft-capping, windows, MoE, MLA, ...),
chat template yes/no, EOS ids, EAGLE-3's default aux layers, offline-cache bytes per token for
each cache dtype, whether a cached multi-token forward works (cache_check: a small fp32 copy of the
architecture, k tokens at once against k one at a time), and the drafter kinds and export formats
that work for it (export.can_export: the kind's class, each format's layouts and engine releases
answer; every registered kind and format is listed).
Exits 1 with the reasons when the target is unsupported (no kind works, or --kind is refused).
`draftsmith train` runs the same checks (check_for_training) before it loads any data.
"""
from __future__ import annotations

import json
import sys

from draftsmith.targets import archs, cache_check

CACHE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
ROW_BYTES = 5  # input_ids int32 + loss_mask uint8, stored with every cached row


class _Shape:
    """What a kind's feature_layers_for / cached_hidden_widths read of a target: its depth and width."""

    def __init__(self, num_layers: int, hidden_size: int):
        self.num_layers, self.hidden_size = num_layers, hidden_size


def cached_hidden_widths(kind: str, hidden: int, num_layers: int) -> int:
    """Hidden values per token the offline cache stores for `kind` at its default options: one block per
    aux layer it reads, plus the last hidden state when it reads the target's logits (replayed from it),
    as `draftsmith prepare --features --dry-run` predicts (data/feature_cache.cache_features)."""
    from draftsmith.heads import DRAFTERS

    cls = DRAFTERS.get(kind)
    return cls.cached_hidden_widths(cls.Config(), _Shape(num_layers, hidden))


def load_meta(path: str, revision: str | None = None, trust_remote_code: bool = False, gguf_file: str | None = None):
    """(config, model on the meta device, tokenizer or None, problems): nothing heavy is loaded (a GGUF
    file's metadata is read, not its tensors)."""
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from draftsmith.targets.load import check_declared_sizes, config_json_error, hf_kwargs, locate, require_gguf_package

    local, gguf_name = locate(path, gguf_file)
    if gguf_name:
        require_gguf_package(path)
    check_declared_sizes(local, gguf_name)  # before the meta model builds 100,000 declared layers
    extra = hf_kwargs(gguf_name)
    try:
        config = AutoConfig.from_pretrained(local, revision=revision, trust_remote_code=trust_remote_code, **extra)
    except StrictDataclassError as exc:  # a config.json value of the wrong type
        raise config_json_error(local, exc, gguf_name) from exc
    problems = []
    model = None
    auto = AutoModelForCausalLM
    if getattr(config, "vision_config", None) is not None:  # a vision-language target loads whole (targets/load.py)
        from transformers import AutoModelForImageTextToText as auto
    try:
        with torch.device("meta"):
            model = auto.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as exc:
        problems.append(f"transformers has no causal-LM or image-text-to-text class for model_type "
                        f"{config.model_type!r} ({exc}); point target.path at a language model's checkpoint")
    if gguf_name and model is not None and not getattr(config, "architectures", None):
        config.architectures = [type(model).__name__]  # as target.load records it (a GGUF config has none)
    try:
        from transformers import GenerationConfig

        if model is not None and not gguf_name:  # a GGUF file has no generation_config.json
            model.generation_config = GenerationConfig.from_pretrained(local, revision=revision)
    except OSError:
        pass  # no generation_config.json: EOS ids come from the config and tokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, revision=revision, trust_remote_code=trust_remote_code,
                                                  **extra)
    except (OSError, ValueError, TypeError) as exc:  # TypeError: e.g. a special token that is an object
        tokenizer, problems = None, problems + [f"the tokenizer cannot be loaded from {path}: {exc}"]
    return config, model, tokenizer, problems


def eos_ids(config, model, tokenizer) -> list[int]:
    ids: list[int] = []
    gen = getattr(model, "generation_config", None) if model is not None else None
    sources = (getattr(gen, "eos_token_id", None), getattr(archs.text_config(config), "eos_token_id", None),
               getattr(tokenizer, "eos_token_id", None))
    for source in sources:
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def support(config) -> dict[str, dict]:
    """kind -> {"refusals": [...], "formats": {fmt: [refusals]}} for every drafter kind (export.can_export)."""
    from draftsmith.export import can_export, formats_for, refusals
    from draftsmith.heads import DRAFTERS

    out = {}
    for kind in DRAFTERS.names():
        formats = {fmt: can_export(kind, fmt, None, config) for fmt in formats_for(kind)}
        out[kind] = {"refusals": refusals(config, kind), "formats": formats}
    return out


def report(path: str, revision: str | None = None, trust_remote_code: bool = False,
           gguf_file: str | None = None) -> dict:
    from draftsmith.targets.archs import default_aux_layer_ids

    config, model, tokenizer, problems = load_meta(path, revision, trust_remote_code, gguf_file)
    c = archs.text_config(config)
    t = archs.traits(config, model)
    hidden, layers = c.hidden_size, c.num_hidden_layers
    kinds = support(config) if not problems else {}
    cached = ("unchecked", "the model class could not be built") if problems else cache_check.check(config)
    if cached[0] == "failed":
        problems = problems + [cached[1]]
    return {
        "target": path,
        "gguf_file": gguf_file or (path if path.endswith(".gguf") else None),
        "model_type": c.model_type,
        "architectures": list(getattr(config, "architectures", None) or []),
        "num_layers": layers,
        "hidden_size": hidden,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": getattr(c, "max_position_embeddings", None),
        "rope": getattr(c, "rope_parameters", None),
        "draft_rope": t.rope,
        "features": t.summary(),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "eos_ids": eos_ids(config, model, tokenizer),
        "default_aux_layers": default_aux_layer_ids(layers),
        "valid_aux_layers": archs.valid_aux_layer_ids(config)[1],
        "layer_caches": layer_caches(config),
        "feature_bytes_per_token": {
            kind: {dt: cached_hidden_widths(kind, hidden, layers) * size + ROW_BYTES for dt, size in CACHE_DTYPES.items()}
            for kind in kinds} if not problems else {},
        "kinds": kinds,
        "cached_forward": {"status": cached[0], "detail": cached[1]},
        "problems": problems,
    }


def layer_caches(config) -> list[dict]:
    """Each layer type's cache in the speculative loop and how a rejection rolls it back (state_cache)."""
    from draftsmith.targets import state_cache

    return state_cache.describe(config)


def usable_kinds(rep: dict) -> list[str]:
    return [k for k, v in rep["kinds"].items() if not v["refusals"]]


def format_text(rep: dict) -> str:
    lines = [f"target {rep['target']}: {rep['model_type']} {rep['architectures']}",
             f"  layers {rep['num_layers']}, hidden size {rep['hidden_size']}, vocabulary {rep['vocab_size']}, "
             f"max positions {rep['max_position_embeddings']}",
             f"  rope: {json.dumps(rep['rope'], default=str)}",
             f"  draft layer rope: {json.dumps(rep['draft_rope'], default=str)}",
             f"  features: {', '.join(rep['features']) or 'Llama-like (none beyond rope)'}",
             f"  chat template: {'yes' if rep['chat_template'] else 'no'}; EOS ids {rep['eos_ids']}",
             f"  default aux layers (EAGLE-3): {rep['default_aux_layers']}; valid: {rep['valid_aux_layers']}",
             "  speculative-loop cache per layer type (rollback after a rejection):",
             *(f"    {r['layer_type']} (layers {r['layers']}): {r['cache']}; {r['rollback']}" for r in rep["layer_caches"]),
             "  offline feature cache at default options, bytes per token (incl. 5 for ids + mask):"]
    for kind, sizes in rep["feature_bytes_per_token"].items():
        lines.append(f"    {kind}: " + ", ".join(f"{dt} {n:,}" for dt, n in sizes.items()))
    cached = rep.get("cached_forward") or {}
    lines.append(f"  cached multi-token forward (the loop's verification): {cached.get('status')}: {cached.get('detail')}")
    lines.append("  drafter kinds:")
    for kind, info in rep["kinds"].items():
        if info["refusals"]:
            lines.append(f"    {kind}: REFUSED: " + "; ".join(info["refusals"]))
            continue
        fmts = [f for f, r in info["formats"].items() if not r]
        refused = [f"{f} ({'; '.join(r)})" for f, r in info["formats"].items() if r]
        text = f"    {kind}: ok; export: {', '.join(fmts) or 'none yet'}"
        lines.append(text + (f"; refused: {', '.join(refused)}" if refused else ""))
    for p in rep["problems"]:
        lines.append(f"  UNSUPPORTED: {p}")
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument("target", help="local directory, Hugging Face id (from the local cache when offline), a .gguf file, "
                                  "installed:NAME or builtin:NAME")
    p.add_argument("--gguf-file", default=None, help="the GGUF file inside a TARGET directory holding several")
    p.add_argument("--kind", help="exit 1 unless this drafter kind can serve the target")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--revision", default=None)
    p.add_argument("--trust-remote-code", action="store_true")


def main(args) -> int:
    try:
        rep = report(args.target, args.revision, args.trust_remote_code, getattr(args, "gguf_file", None))
    except (OSError, ValueError) as exc:
        print(f"inspect {args.target}: cannot read the target's config: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(rep, indent=2, default=str) if args.json else format_text(rep))
    if args.kind and args.kind not in rep["kinds"]:
        known = list(rep["kinds"])
        print(f"--kind {args.kind!r}: unknown or unchecked (known: {known})", file=sys.stderr)
        return 1
    reasons = rep["problems"] + (rep["kinds"][args.kind]["refusals"] if args.kind else [])
    if rep["kinds"] and not usable_kinds(rep):
        reasons.append("no drafter kind can serve this target")
    if reasons:
        print("unsupported: " + "; ".join(reasons), file=sys.stderr)
        return 1
    return 0
