"""TensorRT-LLM EAGLE-3 format, as NVIDIA Model Optimizer exports it
(modelopt/torch/export/plugins/hf_spec_export.py) and TensorRT-LLM's PyTorch backend loads it.

config.json: LlamaForCausalLMEagle3 with the draft layer's Llama fields (rope_theta and
rope_scaling at top level), draft_vocab_size, target_hidden_size and a nested eagle_config
{eagle_aux_hidden_state_layer_ids, use_aux_hidden_state, use_input_layernorm_in_first_layer,
use_last_layernorm, use_mtp_layernorm, next_layer_regular, parallel_draft_step,
parallel_draft_heads_num_layers}. Model Optimizer's ids name layer OUTPUTS (draftsmith id - 1),
as do TensorRT-LLM's eagle3_layers_to_capture (default {1, L//2 - 1, L - 4}).
Tensors: midlayer.* (as Model Optimizer's exporter writes them: older TensorRT-LLM's
Eagle3LlamaDraftModel knows only midlayer.*, newer releases also remap layers.0. to midlayer.),
fc, norm, lm_head, d2t; no t2d, no embed_tokens.
Dtype: TensorRT-LLM builds the draft's modules in config.torch_dtype, so the export defaults to the
target's dtype (--dtype overrides).

The serving config is written next to the weights as extra_llm_api_options.yaml:
    trtllm-serve VERIFIER --backend pytorch --extra_llm_api_options OUT/extra_llm_api_options.yaml
(newer releases also accept it as `--config`; older ones spell speculative_model as
speculative_model_dir).

Drafters TensorRT-LLM serves that draftsmith does not export to it (REFUSED below, found by reading its source;
docs/export.md, "Block drafters in SGLang and TensorRT-LLM", says where): DFlash (PR #12794,
`DFlashDecodingConfig`, tensorrt_llm/_torch/speculative/dflash.py) and DSpark (`DSparkDecodingConfig`,
_torch/speculative/dspark.py) are in its main branch and documented for the 1.3.0rc and 1.4.0rc pre-releases
only; the newest stable release on PyPI is 1.2.1 (1.2.0, March 2026, predates PR #12794), and PyPI ships it as
an sdist that fetches the wheel from NVIDIA's index, which this project cannot read, so no released loader
could be checked.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import torch

from draftsmith.data import draft_vocab
from draftsmith.export.eagle_tensors import (
    check_eagle3_aux_count,
    eagle3_from_weights,
    eagle3_norm_fields,
    eagle3_norm_problems,
    eagle3_tensor_spec,
    eagle3_weights,
    output_id_refusals,
    output_of_layer_ids,
)
from draftsmith.export.exporter import Exporter
from draftsmith.export.layout import (
    DTYPES,
    EXPORTERS,
    LLAMA_KEYS,
    REFUSED,
    ExportFiles,
    ExportOptions,
    Layout,
    TensorSpec,
    layouts,
    llama_fields,
    num_tokens,
    read_export,
    refuse_window,
    rename,
    serving_dtype,
    sidecar,
    verifier_name,
    yaml_scalar,
)
from draftsmith.export.trtllm import doctor as trtllm_doctor
from draftsmith.export.trtllm.doctor import SERVE_FILE

_PRERELEASE = ("TensorRT-LLM's {name} drafter ({config}, tensorrt_llm/_torch/speculative/{file}) exists only in the "
               "1.3.0rc / 1.4.0rc pre-releases, not in the stable 1.2.x, so draftsmith has no released loader to check "
               "the export against; export it with {{fits}}")
REFUSED.register("trtllm", "dflash", _PRERELEASE.format(name="DFlash", config="DFlashDecodingConfig, PR #12794",
                                                         file="dflash.py"), whole=True)
REFUSED.register("trtllm", "dspark", _PRERELEASE.format(name="DSpark", config="DSparkDecodingConfig", file="dspark.py"),
                 whole=True)
EAGLE_CONFIG_KEYS = [
    "eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state", "use_input_layernorm_in_first_layer",
    "use_last_layernorm", "use_mtp_layernorm", "next_layer_regular", "parallel_draft_step",
    "parallel_draft_heads_num_layers",
]


@EXPORTERS.register("trtllm")
class TRTLLMExporter(Exporter):
    name = "trtllm"
    engine = "TensorRT-LLM"
    doctor = trtllm_doctor


@layouts("trtllm").register("eagle3")
class TRTLLMEagle3Layout(Layout):
    carries_vocab_map = True

    def refusals(self, target_config) -> list[str]:
        return output_id_refusals(target_config, "trtllm")

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        d, target = loaded.drafter, loaded.target
        check_eagle3_aux_count(d.aux_layer_ids, "TensorRT-LLM")
        refuse_window(d, "TensorRT-LLM")
        dtype = serving_dtype(loaded, opts)
        ids = output_of_layer_ids(d.aux_layer_ids, "TensorRT-LLM")
        llama = llama_fields(d.layer_config, target.config, dtype)
        llama.pop("rope_parameters")  # Model Optimizer's template has rope_theta + rope_scaling only
        config = {
            "architectures": ["LlamaForCausalLMEagle3"],
            **llama,
            "draft_vocab_size": int(d.d2t.shape[0]),
            "target_hidden_size": target.hidden_size,
            **eagle3_norm_fields(d, "TensorRT-LLM"),  # EAGLE 3.1: fc_norm, norm_output (top-level fields)
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": ids,
                "use_aux_hidden_state": True,
                "use_input_layernorm_in_first_layer": True,  # the embedding is normed (input_layernorm)
                "use_last_layernorm": True,  # norm before lm_head
                "use_mtp_layernorm": False,
                "next_layer_regular": True,
                "parallel_draft_step": 1,
                "parallel_draft_heads_num_layers": 1,
            },
        }
        weights = eagle3_weights(loaded, dtype)  # midlayer.*: what every TensorRT-LLM release reads
        weights.pop("t2d")  # Model Optimizer ships d2t only
        k = num_tokens(loaded, opts, d.cfg.ttt_steps)
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k})
        return ExportFiles(config=config, tensors=weights, sidecar=side,
                           extra={SERVE_FILE: self.serve_yaml(out_dir, k, ids)})

    @staticmethod
    def serve_yaml(out_dir: Path, k: int, ids: list[int]) -> str:
        return (
            "# TensorRT-LLM (PyTorch backend) speculative decoding with this EAGLE-3 drafter; written by draftsmith.\n"
            "speculative_config:\n"
            "  decoding_type: Eagle3\n"
            f"  max_draft_len: {k}\n"
            f"  speculative_model: {yaml_scalar(out_dir)}\n"  # quoted: a path with '#' or ': ' stays one value
            "  eagle3_one_model: true\n"
            f"  eagle3_layers_to_capture: [{', '.join(str(i) for i in ids)}]\n"
        )

    def required_config_keys(self) -> list[str]:
        return ["architectures", *LLAMA_KEYS, "draft_vocab_size", "target_hidden_size",
                *(f"eagle_config.{k}" for k in EAGLE_CONFIG_KEYS)]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        return eagle3_tensor_spec(
            config, config["draft_vocab_size"], len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
            config["target_hidden_size"], "midlayer.", DTYPES[config["torch_dtype"]], with_t2d=False, with_embed=False,
            fc_norm=bool(config.get("fc_norm")),
        )

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        problems = eagle3_norm_problems(config, loaded.drafter)
        if config["architectures"] != ["LlamaForCausalLMEagle3"]:
            problems.append(f"config.json: architectures {config['architectures']} != ['LlamaForCausalLMEagle3']")
        want = [i - 1 for i in loaded.drafter.aux_layer_ids]
        got = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        if got != want:
            problems.append(f"config.json: eagle_config.eagle_aux_hidden_state_layer_ids {got} != {want} "
                            "(Model Optimizer ids are layer outputs: draftsmith id - 1)")
        serve = export_dir / SERVE_FILE
        if not serve.exists():
            problems.append(f"{serve.name} is missing (the serving config)")
        elif f"eagle3_layers_to_capture: [{', '.join(str(i) for i in want)}]" not in serve.read_text():
            problems.append(f"{serve.name}: eagle3_layers_to_capture is not {want}")
        return problems

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        weights = rename(tensors, "layers.0.", "midlayer.")  # exports of draftsmith before midlayer.* still load
        d2t = weights["d2t"].long()
        t2d = torch.zeros(loaded.target.vocab_size, dtype=torch.bool)
        t2d[d2t + torch.arange(d2t.shape[0])] = True  # rebuilt from d2t: target_id = draft_id + d2t[draft_id]
        draft_vocab.check(d2t, t2d)
        weights["t2d"] = t2d
        return eagle3_from_weights(weights, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return eagle3_from_weights(eagle3_weights(loaded, dtype), loaded, "trained drafter")

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        return (f"trtllm-serve {shlex.quote(verifier_name(loaded, opts))} --backend pytorch "
                f"--extra_llm_api_options {shlex.quote(str(Path(out_dir) / SERVE_FILE))}")
