"""Distilled draft LM: a standard Hugging Face model directory with the target's tokenizer
(DraftLMDrafter.save_hf: LoRA merged), loadable by AutoModelForCausalLM and by the engines'
draft-model modes, e.g.
    vllm serve VERIFIER --speculative-config '{"model": OUT, "num_speculative_tokens": K, "method": "draft_model"}'
Validation: tensor names/shapes against the model class built from config.json on the meta
device, the tokenizer's vocabulary equal to the target's, max_position_embeddings covering the
target's, and the round trip through eval.proposers.DraftModelProposer.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch

from draftsmith.export import EXPORTERS
from draftsmith.export.common import (
    Exporter,
    ExportFiles,
    ExportOptions,
    TensorSpec,
    export_dtype,
    num_tokens,
    sidecar,
    verifier_name,
)


class _HFDraft:
    """A re-imported HF draft model, shaped like a drafter for the round trip."""

    kind = "draft_lm"

    def __init__(self, model):
        self.model = model

    def state_dict(self):
        return self.model.state_dict()

    def make_proposer(self, target):
        from draftsmith.eval.proposers import DraftModelProposer

        return DraftModelProposer(self.model, target.vocab_size, name="draft_lm")


@EXPORTERS.register("hf")
class HFExporter(Exporter):
    name = "hf"
    engine = "Hugging Face"
    kinds = ("draft_lm",)

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        d, target = loaded.drafter, loaded.target
        dtype = export_dtype(loaded, opts) if opts.dtype else target.dtype
        k = num_tokens(loaded, opts, 5)
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k})
        return ExportFiles(config={}, tensors={}, sidecar=side,
                           writer=lambda directory: d.save_hf(directory, target.tokenizer, dtype))

    def required_config_keys(self, kind: str) -> list[str]:
        return ["architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                "max_position_embeddings"]

    def expected_tensors(self, config: dict, kind: str) -> dict[str, TensorSpec]:
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.for_model(**config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
        dtype = getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")
        names = dict(model.state_dict())
        if getattr(hf_config, "tie_word_embeddings", False):
            names.pop("lm_head.weight", None)  # tied: stored once, as the embedding
        return {k: TensorSpec(tuple(v.shape), dtype) for k, v in names.items()}

    def llama_fields(self, config: dict) -> dict | None:
        return None  # a draft LM keeps its own rope; positions are checked in check_format

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        from transformers import AutoTokenizer

        problems = []
        want = loaded.target.config.max_position_embeddings
        if config["max_position_embeddings"] < want:
            problems.append(f"config.json: max_position_embeddings {config['max_position_embeddings']} < the target's "
                            f"{want}; the engine would cap or reject longer requests")
        tokenizer = AutoTokenizer.from_pretrained(str(export_dir))
        if tokenizer.get_vocab() != loaded.target.tokenizer.get_vocab():
            problems.append("tokenizer: the exported tokenizer's vocabulary differs from the target's")
        return problems

    def load_back(self, export_dir: Path, loaded):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(export_dir)).to(loaded.target.device).eval()
        return _HFDraft(model)

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return _HFDraft(loaded.drafter.merged_model().to(dtype))

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        k = num_tokens(loaded, opts, 5)
        spec = json.dumps({"model": str(out_dir), "num_speculative_tokens": k, "method": "draft_model"})
        return f"vllm serve {shlex.quote(verifier_name(loaded, opts))} --speculative-config {shlex.quote(spec)}"
