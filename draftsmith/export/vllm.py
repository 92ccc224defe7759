"""vLLM formats: EAGLE-3 in the speculators format, Medusa, and the MLP speculator.

EAGLE-3 (speculators 0.9.0 Eagle3SpeculatorConfig; vLLM's transformers_utils/configs/speculators):
  config.json  speculators_model_type "eagle3", architectures ["Eagle3Speculator"], draft_vocab_size,
               norm_before_residual (written false: vLLM defaults a missing one to TRUE), target_hidden_size,
               eagle_aux_hidden_state_layer_ids (vLLM ids = draftsmith ids: the input of layer i),
               transformer_layer_config (the draft layer's Llama config, rope and max positions from the
               target), speculators_config {algorithm, default_proposal_method, proposal_methods
               [{proposal_type, speculative_tokens, ...}], verifier {architectures, name_or_path}}
  tensors      layers.0.* instead of midlayer.*, fc, norm, lm_head, d2t, t2d, and embed_tokens.weight (the
               target's, as speculators' own save writes it: its loader leaves NaN embeddings otherwise)
      vllm serve VERIFIER --speculative-config '{"model": OUT, "num_speculative_tokens": K, "method": "eagle3"}'
Medusa (vllm/model_executor/models/medusa.py): model_type "medusa", num_heads, num_hidden_layers,
  hidden_size, vocab_size, truncated_vocab_size, medusa_fc_bias true (without it vLLM builds the blocks
  bias-free and drops the trained biases silently); tensors blocks.{i}.layers.{j}.weight/.bias, lm_heads.{i}.weight.
MLP speculator (vllm/model_executor/models/mlp_speculator.py): model_type "mlp_speculator", emb_dim,
  inner_dim, n_predict, top_k_tokens_per_head, n_candidates, tie_weights, scale_input; tensors emb.{i},
  proj.{i}, head.{i}, ln.{i} (a tied model stores emb.0, proj.0, proj.1, head.0, ln.0).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch

from draftsmith import config as config_mod
from draftsmith.export import EXPORTERS
from draftsmith.export.common import (
    DTYPES,
    Exporter,
    ExportFiles,
    ExportOptions,
    TensorSpec,
    cast_floats,
    dtype_name,
    eagle3_from_weights,
    eagle3_tensor_spec,
    eagle3_weights,
    export_dtype,
    llama_fields,
    num_tokens,
    read_export,
    rename,
    sidecar,
    verifier_name,
)
from draftsmith.export.sglang import LLAMA_KEYS

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose loader this format is tested against
METHODS = {"eagle3": "eagle3", "medusa": "medusa", "mlp_speculator": "mlp_speculator"}


@EXPORTERS.register("vllm")
class VLLMExporter(Exporter):
    name = "vllm"
    engine = "vLLM"
    kinds = ("eagle3", "medusa", "mlp_speculator")

    # ------------------------------------------------------------------ build
    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        kind = loaded.drafter.kind
        dtype = export_dtype(loaded, opts)
        k = num_tokens(loaded, opts, self._default_k(loaded.drafter))
        if kind == "eagle3":
            config, tensors = self._eagle3(loaded, dtype, k, opts)
        elif kind == "medusa":
            config, tensors = self._medusa(loaded, dtype, k)
        else:
            config, tensors = self._mlp(loaded, dtype, k)
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k})
        return ExportFiles(config=config, tensors=tensors, sidecar=side)

    @staticmethod
    def _default_k(drafter) -> int:
        c = drafter.cfg
        return {"eagle3": lambda: c.ttt_steps, "medusa": lambda: c.num_heads, "mlp_speculator": lambda: c.n_predict}[
            drafter.kind]()

    def _eagle3(self, loaded, dtype, k: int, opts: ExportOptions):
        d, target = loaded.drafter, loaded.target
        layer = {"architectures": ["LlamaForCausalLM"], **llama_fields(d.layer_config, target.config, dtype)}
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION,
            "draft_vocab_size": int(d.d2t.shape[0]),
            "norm_before_residual": False,  # draftsmith's residual is the raw hidden state
            "norm_before_fc": False,
            "fc_norm": False,
            "norm_output": False,
            "target_hidden_size": target.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(d.aux_layer_ids),
            "transformer_layer_config": layer,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": verifier_name(loaded, opts),
                             "architectures": list(getattr(target.config, "architectures", None) or [])},
            },
            "torch_dtype": dtype_name(dtype),
            "dtype": dtype_name(dtype),
        }
        tensors = rename(eagle3_weights(loaded, dtype), "midlayer.", "layers.0.")
        tensors["embed_tokens.weight"] = target.embed_tokens.weight.detach().to(dtype).cpu().contiguous()
        return config, tensors

    def _medusa(self, loaded, dtype, k: int):
        d, target = loaded.drafter, loaded.target
        config = {
            "architectures": ["MedusaModel"],
            "model_type": "medusa",
            "num_heads": d.cfg.num_heads,
            "num_hidden_layers": d.cfg.num_layers,
            "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size,
            "truncated_vocab_size": target.vocab_size,
            "medusa_fc_bias": True,
            "original_lm_head": False,
            "max_paths": 64,
            "topk": 10,
            "num_lookahead_tokens": k,
            "torch_dtype": dtype_name(dtype),
            "dtype": dtype_name(dtype),
        }
        return config, cast_floats(d.state_dict_for_export(), dtype)

    def _mlp(self, loaded, dtype, k: int):
        d, target = loaded.drafter, loaded.target
        c = d.cfg
        config = {
            "architectures": ["MLPSpeculatorPreTrainedModel"],
            "model_type": "mlp_speculator",
            "vocab_size": target.vocab_size,
            "emb_dim": target.hidden_size,
            "inner_dim": d.inner_dim,
            "n_predict": c.n_predict,
            "top_k_tokens_per_head": [1] * c.n_predict,
            "n_candidates": 1,
            "tie_weights": c.tie_weights,
            "scale_input": c.scale_input,
            "num_lookahead_tokens": c.n_predict,
            "torch_dtype": dtype_name(dtype),
            "dtype": dtype_name(dtype),
        }
        return config, cast_floats(d.state_dict_for_export(), dtype)

    # ------------------------------------------------------------------ contract
    def required_config_keys(self, kind: str) -> list[str]:
        if kind == "eagle3":
            return ["architectures", "speculators_model_type", "draft_vocab_size", "norm_before_residual",
                    "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
                    *(f"transformer_layer_config.{k}" for k in LLAMA_KEYS),
                    "speculators_config.algorithm", "speculators_config.default_proposal_method",
                    "speculators_config.proposal_methods", "speculators_config.verifier.name_or_path",
                    "speculators_config.verifier.architectures", "torch_dtype"]
        if kind == "medusa":
            return ["model_type", "num_heads", "num_hidden_layers", "hidden_size", "vocab_size",
                    "truncated_vocab_size", "medusa_fc_bias", "torch_dtype"]
        return ["architectures", "model_type", "vocab_size", "emb_dim", "inner_dim", "n_predict",
                "top_k_tokens_per_head", "n_candidates", "tie_weights", "scale_input", "torch_dtype"]

    def expected_tensors(self, config: dict, kind: str) -> dict[str, TensorSpec]:
        dtype = DTYPES[config["torch_dtype"]]
        if kind == "eagle3":
            return eagle3_tensor_spec(
                config["transformer_layer_config"], config["draft_vocab_size"],
                len(config["eagle_aux_hidden_state_layer_ids"]), config["target_hidden_size"], "layers.0.", dtype,
                with_t2d=True, with_embed=True,
            )
        if kind == "medusa":
            h, V = config["hidden_size"], config["truncated_vocab_size"]
            spec = {}
            for i in range(config["num_heads"]):
                for j in range(config["num_hidden_layers"]):
                    spec[f"blocks.{i}.layers.{j}.weight"] = TensorSpec((h, h), dtype)
                    if config["medusa_fc_bias"]:
                        spec[f"blocks.{i}.layers.{j}.bias"] = TensorSpec((h,), dtype)
                spec[f"lm_heads.{i}.weight"] = TensorSpec((V, h), dtype)
            return spec
        return mlp_tensor_spec(config, dtype)

    def llama_fields(self, config: dict) -> dict | None:
        return config.get("transformer_layer_config") if "speculators_model_type" in config else None

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        if loaded.drafter.kind != "eagle3":
            return []
        problems = []
        if config["architectures"] != ["Eagle3Speculator"] or config["speculators_model_type"] != "eagle3":
            problems.append("config.json: needs architectures ['Eagle3Speculator'] and speculators_model_type 'eagle3'")
        if config["norm_before_residual"] is not False:
            problems.append("config.json: norm_before_residual must be false for draftsmith's EAGLE-3 layer")
        if config["eagle_aux_hidden_state_layer_ids"] != list(loaded.drafter.aux_layer_ids):
            problems.append(f"config.json: eagle_aux_hidden_state_layer_ids {config['eagle_aux_hidden_state_layer_ids']}"
                            f" != the trained feature layers {loaded.drafter.aux_layer_ids}")
        spec = config["speculators_config"]
        methods = [m.get("proposal_type") for m in spec["proposal_methods"]]
        if spec["default_proposal_method"] not in methods or not spec["proposal_methods"][0].get("speculative_tokens"):
            problems.append(f"config.json: speculators_config.proposal_methods {spec['proposal_methods']} must hold "
                            f"the default method {spec['default_proposal_method']!r} with speculative_tokens >= 1")
        embed = loaded.target.embed_tokens.weight.detach().cpu().to(tensors["embed_tokens.weight"].dtype)
        if not torch.equal(tensors["embed_tokens.weight"], embed):
            problems.append("model.safetensors: embed_tokens.weight differs from the target's embedding")
        return problems

    # ------------------------------------------------------------------ round trip
    def load_back(self, export_dir: Path, loaded):
        config, _, tensors = read_export(export_dir)
        kind = loaded.drafter.kind
        if kind == "eagle3":
            weights = rename(tensors, "layers.0.", "midlayer.")
            weights.pop("embed_tokens.weight")  # the target's; checked in check_format
            return eagle3_from_weights(weights, loaded, str(export_dir))
        return load_plain(tensors, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        if loaded.drafter.kind == "eagle3":
            return eagle3_from_weights(eagle3_weights(loaded, dtype), loaded, "trained drafter")
        return load_plain(cast_floats(loaded.drafter.state_dict_for_export(), dtype), loaded, "trained drafter")

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        k = num_tokens(loaded, opts, self._default_k(loaded.drafter))
        spec = json.dumps({"model": str(out_dir), "num_speculative_tokens": k, "method": METHODS[loaded.drafter.kind]})
        return f"vllm serve {shlex.quote(verifier_name(loaded, opts))} --speculative-config {shlex.quote(spec)}"


def mlp_tensor_spec(config: dict, dtype: torch.dtype) -> dict[str, TensorSpec]:
    n, V, h = config["n_predict"], config["vocab_size"], config["emb_dim"]
    d = config["inner_dim"] or h
    stored = 1 if config["tie_weights"] else n
    projs = min(2, n) if config["tie_weights"] else n
    spec = {}
    for i in range(stored):
        spec[f"emb.{i}.weight"] = TensorSpec((V, d), dtype)
        spec[f"head.{i}.weight"] = TensorSpec((V, d), dtype)
        spec[f"ln.{i}.weight"] = TensorSpec((d,), dtype)
        spec[f"ln.{i}.bias"] = TensorSpec((d,), dtype)
    for i in range(projs):
        spec[f"proj.{i}.weight"] = TensorSpec((d, h if i == 0 else d), dtype)
    return spec


def load_plain(tensors: dict[str, torch.Tensor], loaded, source: str):
    """A fresh drafter of the checkpoint's kind holding `tensors` (its own state_dict names), strictly."""
    from draftsmith.heads import DRAFTERS

    options = config_mod.drafter_options(loaded.config)
    drafter = DRAFTERS.get(loaded.drafter.kind).from_target(options, loaded.target, None)  # upcasts on load
    missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{source}: re-import failed: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return drafter.eval()
