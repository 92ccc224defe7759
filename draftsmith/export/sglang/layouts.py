"""SGLang EAGLE-3 format (python/sglang/srt/models/llama_eagle3.py, LlamaForCausalLMEagle3).

config.json: a Llama config of the one draft layer with architectures ["LlamaForCausalLMEagle3"],
draft_vocab_size, target_hidden_size, tie_word_embeddings false (true would tie lm_head to the
embedding), and eagle_config {eagle_aux_hidden_state_layer_ids, use_aux_hidden_state}. SGLang
adds 1 to each id (its ids name layer OUTPUTS), so the ids written are draftsmith's minus 1.
Tensors: draftsmith's names unchanged (fc, midlayer.*, norm, lm_head, d2t int64, t2d bool);
no embed_tokens (SGLang shares the target's). SGLang's loader skips unknown names silently,
which is why the validation gate compares the exact name set.
Dtype: SGLang's --dtype auto turns a float32 draft config into float16, so the export defaults to the
target's dtype (--dtype overrides).

    python -m sglang.launch_server --model-path VERIFIER --speculative-algorithm EAGLE3 \
        --speculative-draft-model-path OUT --speculative-num-steps K --speculative-eagle-topk 1 \
        --speculative-num-draft-tokens K+1
"""
from __future__ import annotations

import shlex
from pathlib import Path

import torch

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
    ExportFiles,
    ExportOptions,
    Layout,
    TensorSpec,
    layouts,
    llama_fields,
    num_tokens,
    read_export,
    refuse_window,
    serving_dtype,
    sidecar,
    verifier_name,
)
from draftsmith.export.sglang import doctor as sglang_doctor


@EXPORTERS.register("sglang")
class SGLangExporter(Exporter):
    name = "sglang"
    engine = "SGLang"
    doctor = sglang_doctor


@layouts("sglang").register("eagle3")
class SGLangEagle3Layout(Layout):
    carries_vocab_map = True

    def refusals(self, target_config) -> list[str]:
        return output_id_refusals(target_config, "sglang")

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        d, target = loaded.drafter, loaded.target
        check_eagle3_aux_count(d.aux_layer_ids, "SGLang")
        refuse_window(d, "SGLang")
        dtype = serving_dtype(loaded, opts)
        config = {
            "architectures": ["LlamaForCausalLMEagle3"],
            **llama_fields(d.layer_config, target.config, dtype),
            "draft_vocab_size": int(d.d2t.shape[0]),
            "target_hidden_size": target.hidden_size,
            **eagle3_norm_fields(d, "SGLang"),  # EAGLE 3.1: fc_norm, norm_output (top-level fields)
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": output_of_layer_ids(d.aux_layer_ids, "SGLang"),
                "use_aux_hidden_state": True,
            },
        }
        k = num_tokens(loaded, opts, d.cfg.ttt_steps)
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k})
        return ExportFiles(config=config, tensors=eagle3_weights(loaded, dtype), sidecar=side)

    def required_config_keys(self) -> list[str]:
        return ["architectures", *LLAMA_KEYS, "draft_vocab_size", "target_hidden_size",
                "eagle_config.eagle_aux_hidden_state_layer_ids", "eagle_config.use_aux_hidden_state"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        return eagle3_tensor_spec(
            config, config["draft_vocab_size"], len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
            config["target_hidden_size"], "midlayer.", DTYPES[config["torch_dtype"]], with_t2d=True, with_embed=False,
            fc_norm=bool(config.get("fc_norm")),
        )

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        problems = eagle3_norm_problems(config, loaded.drafter)
        if config["architectures"] != ["LlamaForCausalLMEagle3"]:
            problems.append(f"config.json: architectures {config['architectures']} != ['LlamaForCausalLMEagle3']")
        if config["tie_word_embeddings"]:
            problems.append("config.json: tie_word_embeddings must be false (SGLang would use the embedding as lm_head)")
        want = [i - 1 for i in loaded.drafter.aux_layer_ids]
        got = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        if got != want:
            problems.append(f"config.json: eagle_config.eagle_aux_hidden_state_layer_ids {got} != {want} "
                            "(SGLang ids are layer outputs: draftsmith id - 1)")
        return problems

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        return eagle3_from_weights(tensors, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return eagle3_from_weights(eagle3_weights(loaded, dtype), loaded, "trained drafter")

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        k = num_tokens(loaded, opts, loaded.drafter.cfg.ttt_steps)
        return (
            f"python -m sglang.launch_server --model-path {shlex.quote(verifier_name(loaded, opts))} "
            f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {shlex.quote(str(out_dir))} "
            f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
        )
