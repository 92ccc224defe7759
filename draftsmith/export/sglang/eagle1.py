"""EAGLE-1 for SGLang: the layout export/eagle_tensors.py describes (Eagle1Common), with SGLang's own architecture
name and serve command."""
from __future__ import annotations

import shlex
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.export.eagle_tensors import DEFAULT_K, Eagle1Common, eagle1_config, silu_refusals
from draftsmith.export.layout import (
    ExportFiles,
    ExportOptions,
    Layout,
    cast_floats,
    layouts,
    num_tokens,
    serving_dtype,
    sidecar,
    verifier_name,
)

SGLANG_ARCH = ["LlamaForCausalLMEagle"]


@layouts("sglang").register("eagle1")
class SGLangEagle1Layout(Eagle1Common, Layout):
    """SGLang's LlamaForCausalLMEagle (see the module docstring)."""

    architectures = SGLANG_ARCH
    with_bias = True

    def refusals(self, target_config) -> list[str]:
        return silu_refusals(target_config, "sglang")

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        problems = silu_refusals(loaded.target.config, "SGLang")
        if problems:
            raise UserError(f"export --to sglang: {problems[0]}; export a drafter of a SiLU target")
        dtype = serving_dtype(loaded, opts)
        tensors = cast_floats(loaded.drafter.state_dict_for_export(), dtype)
        if "fc.bias" not in tensors:  # SGLang's fc has a bias: zeros compute what the bias-free fc computes
            tensors["fc.bias"] = torch.zeros(tensors["fc.weight"].shape[0], dtype=dtype)
        k = num_tokens(loaded, opts, DEFAULT_K)
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k})
        return ExportFiles(config=eagle1_config(loaded, dtype, SGLANG_ARCH), tensors=tensors, sidecar=side)

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        k = num_tokens(loaded, opts, DEFAULT_K)
        return (f"python -m sglang.launch_server --model-path {shlex.quote(verifier_name(loaded, opts))} "
                f"--speculative-algorithm EAGLE --speculative-draft-model-path {shlex.quote(str(out_dir))} "
                f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
