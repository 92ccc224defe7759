"""Distilled draft LM: a standard Hugging Face model directory with the target's tokenizer
(DraftLMDrafter.save_hf: LoRA merged), loadable by AutoModelForCausalLM and by the engines'
draft-model modes, e.g.
    vllm serve VERIFIER --speculative-config '{"model": OUT, "num_speculative_tokens": K, "method": "draft_model"}'
Validation: tensor names/shapes against the model class built from config.json on the meta
device, the tokenizer's vocabulary equal to the target's, max_position_embeddings covering the
target's, and the round trip through heads.draft_lm.DraftModelProposer.

Context length: a draft LM with fewer positions than the target (init: config / pretrained with a
shorter context) would be run past its trained positions on long requests, so it is refused unless
the export is limited with max_model_len (--max-model-len N <= the draft's positions): that limit is
recorded in draftsmith.json and the serve command carries `--max-model-len N`. init: shrink copies the
target's config, so it always covers the target's context.

Hybrid targets (issue 42): config.json is written by transformers' save_pretrained, then any key an engine reads
(required_config_keys) that transformers 5 keeps only as a derived attribute is written out with the value transformers
reads: Nemotron-H's num_hidden_layers (a property, the length of layers_block_type) and Kimi-Linear's
max_position_embeddings (an attribute_map alias of model_max_length). A float JSON cannot hold (Falcon-H1's and
Granite-4's time_step_limit [0, inf]) stays as transformers writes it, {"__float__": "Infinity"}, which its
from_pretrained decodes; the gate decodes it the same way. The gate then reads config.json back through transformers
and requires the same config as the trained draft's (same model built).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.flags import flag
from draftsmith.export.exporter import Exporter
from draftsmith.export.layout import (
    EXPORTERS,
    SIDECAR_FILE,
    ExportFiles,
    ExportOptions,
    Layout,
    TensorSpec,
    export_dtype,
    flags_of,
    layouts,
    num_tokens,
    sidecar,
    verifier_name,
)


class _HFDraft:
    """A re-imported HF draft model, shaped like a drafter for the round trip."""

    def __init__(self, model, kind: str):
        self.model = model
        self.kind = kind

    def state_dict(self):
        return self.model.state_dict()

    def drafter_state_dict(self, drafter, source) -> dict:
        """The weights under the draft LM drafter's names (it keeps the HF model as `model`), for train.init_from."""
        if drafter.cfg.lora is not None:  # the hf format takes draft LMs only
            raise UserError(f"train.init_from={source}: an hf export holds merged weights; warm start a LoRA draft LM "
                             "from its checkpoint directory instead")
        return {f"model.{k}": v for k, v in self.state_dict().items()}

    def make_proposer(self, target):
        from draftsmith.heads.draft_lm import DraftModelProposer

        return DraftModelProposer(self.model, target.vocab_size, name=self.kind)


@dataclass
class HFFlags:
    """--to hf's own flags."""

    # serve with requests limited to this many tokens, for a draft LM whose max_position_embeddings is below the
    # target's; None: the draft must cover the target's context
    max_model_len: Optional[int] = flag(
        None, about="a draft LM with a shorter context",
        help="hf: a draft LM with fewer positions than the target is served with requests limited to this")


@EXPORTERS.register("hf")
class HFExporter(Exporter):
    name = "hf"
    engine = "Hugging Face"
    Flags = HFFlags


@layouts("hf").register("draft_lm")
class HFDraftLMLayout(Layout):
    """A whole Hugging Face model directory (DraftLMDrafter.save_hf)."""

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        d, target = loaded.drafter, loaded.target
        dtype = export_dtype(loaded, opts) if opts.dtype else target.dtype
        k = num_tokens(loaded, opts, 5)
        extra = {"num_speculative_tokens": k}
        if flags_of(self.name, opts).max_model_len is not None:
            extra["max_model_len"] = int(flags_of(self.name, opts).max_model_len)
        side = sidecar(loaded, self.name, self.engine, opts, extra)
        keys = self.required_config_keys()
        return ExportFiles(config={}, tensors={}, sidecar=side,
                           writer=lambda directory: write_draft_lm(d, Path(directory), target.tokenizer, dtype, keys))

    def required_config_keys(self) -> list[str]:
        return ["architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                "max_position_embeddings"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.for_model(**decode_tagged_floats(config))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
        dtype = getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")
        names = checkpoint_names(model)
        if getattr(hf_config, "tie_word_embeddings", False):
            names.pop("lm_head.weight", None)  # tied: stored once, as the embedding
        return {k: TensorSpec(tuple(v.shape), dtype) for k, v in names.items()}

    def llama_fields(self, config: dict) -> dict | None:
        return None  # a draft LM keeps its own rope; positions are checked in check_format

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        from transformers import AutoTokenizer

        from draftsmith.targets.archs import carried_field_problems

        limit = json.loads((export_dir / SIDECAR_FILE).read_text()).get("max_model_len")
        problems = check_positions(config["max_position_embeddings"], loaded.target.config.max_position_embeddings, limit)
        problems += carried_field_problems(config, loaded.target.config)
        problems += readback_problems(export_dir, loaded.drafter.merged_model())
        tokenizer = AutoTokenizer.from_pretrained(str(export_dir))
        if tokenizer.get_vocab() != loaded.target.tokenizer.get_vocab():
            problems.append("tokenizer: the exported tokenizer's vocabulary differs from the target's")
        return problems

    def load_back(self, export_dir: Path, loaded):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(export_dir)).to(loaded.target.device).eval()
        return _HFDraft(model, loaded.drafter.kind)

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return _HFDraft(loaded.drafter.merged_model().to(dtype), loaded.drafter.kind)

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        k = num_tokens(loaded, opts, 5)
        spec = json.dumps({"model": str(out_dir), "num_speculative_tokens": k, "method": "draft_model"})
        limit = f" --max-model-len {int(flags_of(self.name, opts).max_model_len)}" if flags_of(self.name, opts).max_model_len is not None else ""
        return f"vllm serve {shlex.quote(verifier_name(loaded, opts))}{limit} --speculative-config {shlex.quote(spec)}"


def write_draft_lm(drafter, directory: Path, tokenizer, dtype, keys: list[str]) -> None:
    """The draft LM's HF directory (DraftLMDrafter.save_hf), then the engine-read `keys` transformers left implicit."""
    drafter.save_hf(directory, tokenizer, dtype)
    spell_out_derived_keys(directory / "config.json", keys)


def spell_out_derived_keys(path: Path, keys: list[str]) -> list[str]:
    """Write into config.json each of `keys` the file lacks but transformers' config answers (a property or an
    attribute_map alias), with the value transformers reads; a file with all of them is left byte for byte.
    Returns the keys written."""
    from transformers import AutoConfig

    from draftsmith.core.files import read_json_object

    raw = read_json_object(path, "draft LM's config.json")
    missing = [k for k in keys if k not in raw]
    if not missing:
        return []
    read = AutoConfig.from_pretrained(str(path.parent))
    added = {k: getattr(read, k) for k in missing if getattr(read, k, None) is not None}
    if added:  # the layout transformers' to_json_string writes: sorted keys, indent 2
        path.write_text(json.dumps({**raw, **added}, indent=2, sort_keys=True) + "\n")
    return sorted(added)


FLOAT_TAG = "__float__"  # transformers' JSON spelling of a float JSON cannot hold: {"__float__": "Infinity"}
TAGGED_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def decode_tagged_floats(value):
    """config.json as transformers' from_pretrained reads it: {"__float__": "Infinity"} -> inf, anywhere."""
    if isinstance(value, dict):
        if set(value) == {FLOAT_TAG} and value[FLOAT_TAG] in TAGGED_FLOATS:
            return TAGGED_FLOATS[value[FLOAT_TAG]]
        return {k: decode_tagged_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_tagged_floats(v) for v in value]
    return value


READBACK_IGNORED = ("dtype", "torch_dtype", "transformers_version", "_name_or_path")  # the export's dtype is its own


def readback_problems(export_dir: Path, trained) -> list[str]:
    """config.json read back by transformers must be the trained draft model's config (every key but the dtype and
    the writer's version; architectures as save_pretrained fills it): else the engine would build another model than
    the one validated."""
    from transformers import AutoConfig

    try:
        read = AutoConfig.from_pretrained(str(export_dir)).to_dict()
    except (ValueError, TypeError, OSError) as exc:  # transformers' strict config validation
        return [f"config.json: transformers cannot read it back ({type(exc).__name__}: {str(exc).splitlines()[0]})"]
    want = {**trained.config.to_dict(), "architectures": [type(trained).__name__]}
    differ = sorted(k for k in set(read) | set(want) if k not in READBACK_IGNORED and not _same(read.get(k), want.get(k)))
    return [f"config.json: transformers reads back {k}={read.get(k)!r}, the trained draft has {want.get(k)!r}"
            for k in differ]


def _same(a, b) -> bool:
    """Equal as JSON holds them (a tuple reads back as a list); NaN equals NaN."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def checkpoint_names(model) -> dict:
    """The state dict as save_pretrained writes it: transformers 5 fuses some weights in memory (MoE
    experts: experts.gate_up_proj) and reverts to the checkpoint layout (experts.0.gate_proj.weight)
    on save, which is what loaders read."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers without weight conversions: memory layout == checkpoint layout
        return dict(model.state_dict())
    return dict(revert_weight_conversion(model, dict(model.state_dict())))


def check_positions(draft: int, target: int, limit: int | None) -> list[str]:
    """The draft LM must cover every position a request can reach: the target's, or the recorded limit."""
    if limit is None:
        if draft >= target:
            return []
        return [f"config.json: the draft LM's max_position_embeddings is {draft}, the target's is {target}: requests "
                f"longer than {draft} tokens would run the draft past its trained positions. Fix: retrain the draft with "
                f"{target} positions (e.g. drafter.model_config.max_position_embeddings={target}, or init: shrink), or "
                f"export with --max-model-len {draft} (ExportOptions(flags={{'max_model_len': {draft}}})) to serve requests of at "
                f"most {draft} tokens"]
    if limit < 1 or limit > target:
        return [f"draftsmith.json: max_model_len {limit} must lie in 1..{target} (the target's max_position_embeddings)"]
    if draft < limit:
        return [f"config.json: the draft LM's max_position_embeddings is {draft}, below max_model_len {limit}; "
                f"pass --max-model-len <= {draft}"]
    return []
