"""vLLM (speculators format) for the parallel drafters: DFlash and DSpark (block drafters), P-EAGLE.
Three layouts registered under vllm by kind: DFlash's (the block layout), DSpark's (the block layout + its
Markov and confidence heads) and P-EAGLE's; the EAGLE-3 / Medusa / MLP layouts are in vllm.py.

Read from speculators 0.9.0 (models/dflash/config.py, core.py; models/dspark/config.py, core.py):
  config.json  speculators_model_type "dflash" | "dspark", architectures ["DFlashSpeculator"] |
               ["DSparkSpeculator"], draft_vocab_size, block_size, target_hidden_size,
               aux_hidden_state_layer_ids (draftsmith ids: hidden_states[i], the input of layer i),
               mask_token_id, sample_from_anchor (false for DFlash: slot 0 is the anchor, so a block
               proposes block_size - 1 tokens), sliding_window_non_causal TRUE (vLLM >= 0.27,
               transformers_utils/configs/speculators/algos.py update_dflash: dflash_config.causal =
               not sliding_window_non_causal (default True), and qwen3_dflash.py applies it to every
               layer; false would run the bidirectionally trained block causally),
               transformer_layer_config (a Qwen3 config: q_norm/k_norm on heads; num_hidden_layers =
               draft layers; rope and max positions from the target), speculators_config
               {algorithm, proposal_methods [{greedy, speculative_tokens}], verifier}
               dspark adds markov_rank, markov_head_type "vanilla", enable_confidence_head,
               confidence_head_with_markov.
  tensors      fc, hidden_norm, layers.{i}.{input_layernorm, post_attention_layernorm,
               self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj}, norm,
               lm_head, embed_tokens (the target's: speculators' loader leaves NaN otherwise);
               d2t / t2d only with a reduced draft vocabulary (speculators registers no such
               buffers for a full one); dspark adds markov_head.markov_w1 [V, r],
               markov_head.markov_w2 [dv, r], confidence_head.proj.{weight, bias}.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.export.eagle_tensors import check_eagle3_aux_count
from draftsmith.export.layout import (
    DTYPES,
    REFUSED,
    TensorSpec,
    cast_floats,
    dtype_name,
    flags_of,
    kind_of_layout,
    layouts,
    llama_fields,
    read_export,
    rename,
    window_fields,
    window_problems,
)
from draftsmith.export.speculators import (
    QWEN3_LAYER_KEYS,
    block_tensor_spec,
    drafter_weights,
    dspark_head_problems,
)
from draftsmith.export.vllm.layouts import (
    SPECULATORS_VERSION,
    VLLMEagle3Layout,
    VLLMLayout,
    embedding_problems,
    load_plain,
    speculators_config,
)

# vLLM reads z-lab's DFlash 2 checkpoint contract (architectures ["DFlash2DraftModel"], a nested dflash_config),
# not speculators' flat dflash2 config (speculators' docs/user_guide/algorithms/dflash2.md says so); draftsmith
# writes that contract only for --to llama.cpp (export/llamacpp/block.py).
REFUSED.register("vllm", "dflash2", "vLLM serves DFlash 2 through vllm-project/vllm#52816 (architecture "
                 "DFlash2DraftModel, z-lab's nested dflash_config), a format draftsmith does not write yet")


@layouts("vllm").register("dflash")
class VLLMBlockLayout(VLLMLayout):
    """DFlash: speculators' DFlashSpeculator (see the module docstring). The speculators model type, the
    algorithm and vLLM's method are the kind's name (the kind this layout is registered for)."""

    arch = "DFlashSpeculator"

    def default_k(self, cfg) -> int:
        return self.drafter_class.tokens_per_round(cfg)

    def check_k(self, cfg, k: int) -> None:
        most, size = self.drafter_class.tokens_per_round(cfg), cfg.block_size
        if k < most:  # vLLM's block proposer runs K (+1 for the anchor slot) queries: a shorter block than trained
            slots = size - most + k
            raise UserError(f"--num-speculative-tokens {k} is below what one {self.kind} block drafts ({most}, "
                             f"block_size {size}): vLLM would run a {slots}-slot block through attention "
                             f"trained bidirectionally on {size} slots, which changes every draft; pass "
                             f"--num-speculative-tokens {most} or retrain with drafter.block_size={slots}")
        if k > most:
            raise UserError(f"--num-speculative-tokens {k} exceeds what one {self.kind} block drafts ({most} = "
                             f"block_size {size} - anchor); pass --num-speculative-tokens <= {most} or "
                             "retrain with a larger drafter.block_size")

    def extra_config(self, drafter) -> dict:
        return {}

    def files(self, loaded, dtype, k, opts):
        d, target = loaded.drafter, loaded.target
        layer = {**llama_fields(d.layer_config, target.config, dtype), "model_type": "qwen3",
                 "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": len(d.layers), "use_sliding_window": False,
                 **window_fields(d, len(d.layers))}  # drafter.sliding_window: every layer windowed, block non-causal
        config = {
            "architectures": [self.arch],
            "speculators_model_type": d.kind,
            "speculators_version": SPECULATORS_VERSION,
            "draft_vocab_size": int(d.d2t.shape[0]),
            "block_size": d.block_size,
            "target_hidden_size": target.hidden_size,
            "aux_hidden_state_layer_ids": list(d.aux_layer_ids),
            "mask_token_id": d.mask_token_id,
            "sample_from_anchor": bool(getattr(d, "sample_from_anchor", False)),
            "sliding_window_non_causal": True,  # vLLM >= 0.27 algos.py: false -> dflash_config.causal = True
            "transformer_layer_config": layer,
            "speculators_config": speculators_config(loaded, opts, d.kind, k),
            "torch_dtype": dtype_name(dtype),
            "dtype": dtype_name(dtype),
        }
        config.update(self.extra_config(d))
        tensors = cast_floats(d.state_dict_for_export(), dtype)
        if d.uses_full_vocabulary():
            tensors.pop("d2t"), tensors.pop("t2d")
        tensors["embed_tokens.weight"] = target.embed_tokens.weight.detach().to(dtype).cpu().contiguous()
        return config, tensors

    def required_config_keys(self) -> list[str]:
        return ["architectures", "speculators_model_type", "draft_vocab_size", "block_size", "target_hidden_size",
                "aux_hidden_state_layer_ids", "mask_token_id", "sample_from_anchor",
                *(f"transformer_layer_config.{k}" for k in QWEN3_LAYER_KEYS),
                "speculators_config.algorithm", "speculators_config.default_proposal_method",
                "speculators_config.proposal_methods", "speculators_config.verifier.name_or_path", "torch_dtype"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        return block_tensor_spec(config)

    def llama_fields(self, config: dict) -> dict | None:
        return config.get("transformer_layer_config")

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        d = loaded.drafter
        want = {"architectures": [self.arch], "speculators_model_type": d.kind, "block_size": d.block_size,
                "aux_hidden_state_layer_ids": list(d.aux_layer_ids), "mask_token_id": d.mask_token_id,
                "sample_from_anchor": bool(getattr(d, "sample_from_anchor", False))}
        problems = [f"config.json: {key} is {config.get(key)!r}, the trained drafter's is {value!r}"
                    for key, value in want.items() if config.get(key) != value]
        if config.get("sliding_window_non_causal", True) is not True:  # vLLM >= 0.27 algos.py update_dflash
            problems.append(f"config.json: sliding_window_non_causal is {config.get('sliding_window_non_causal')!r}: "
                            "vLLM >= 0.27 would run the block causally (dflash_config.causal), the drafter was "
                            "trained bidirectionally; it must be true")
        problems += window_problems(config["transformer_layer_config"], d, len(d.layers))
        k = config["speculators_config"]["proposal_methods"][0].get("speculative_tokens") or 0
        if k != d.tokens_per_round(d.cfg):
            problems.append(f"config.json: speculative_tokens {k} must be {d.tokens_per_round(d.cfg)} (one whole block: "
                            "vLLM runs 1 + K queries of a block trained at full length)")
        problems += embedding_problems(tensors, loaded.target.embed_tokens, "the target's")
        if "d2t" in tensors and not torch.equal(tensors["d2t"].long(), d.d2t.cpu()):
            problems.append("model.safetensors: d2t differs from the mapping the drafter was trained with")
        return problems

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        return load_plain(drafter_weights(tensors, loaded), loaded, str(export_dir))


# vLLM's DSpark serving options, read from vLLM 0.33.0 (config/speculative.py; both fields exist since 0.28.0, and
# 0.27's SpeculativeConfig, which forbids unknown keys, rejects them; 0.20 has no DSpark):
#   enable_adaptive_verification (default false): v1/worker/gpu/spec_decode/dspark/speculator.py computes the
#     confidences only when it is on AND the loader kept the head: model_executor/models/qwen3_dspark.py builds
#     confidence_head.proj only when the config says enable_confidence_head (input [hidden ; markov_w1[prev]] when
#     confidence_head_with_markov) and drops it WITHOUT a word when the checkpoint has no confidence_head.* tensor.
#     v1/worker/gpu/spec_decode/adaptive_verification.py then admits draft slots by the running product of the
#     per-position confidences, the survival product draftsmith's own eval cuts on (drafter.confidence_threshold is
#     draftsmith's rule; vLLM's budget comes from that product and its measured draft / verify cost).
#   dspark_draft_topk (default None; 1 <= k <= draft vocabulary; Qwen3DSparkModel, which speculators' DSpark maps to):
#     the Markov bias is added to the top-k base logits only; drafts may change, the output cannot.
DSPARK_SERVING_SINCE = "0.28.0"


def dspark_serve_fields(drafter, opts) -> dict:
    """The --speculative-config fields of a DSpark export beyond model / K / method (see above)."""
    flags = flags_of("vllm", opts)
    fields = {} if flags.no_adaptive_verification else {"enable_adaptive_verification": True}
    k, dv = flags.dspark_draft_topk, int(drafter.d2t.shape[0])
    if k is not None:
        if not 1 <= k <= dv:
            raise UserError(f"--dspark-draft-topk {k}: vLLM's config/speculative.py needs 1 <= k <= the draft "
                             f"vocabulary ({dv}); pass a k in that range or leave it unset (the full Markov projection)")
        fields["dspark_draft_topk"] = k
    return fields


def dspark_options_for_release(opts, version: str | None):
    """`opts` for the vLLM release the export is checked against: below DSPARK_SERVING_SINCE (0.27 rejects the
    adaptive-verification fields) the serve command is the fixed-K one; --dspark-draft-topk is refused there."""
    if version is None:
        return opts
    if tuple(map(int, version.split("."))) >= tuple(map(int, DSPARK_SERVING_SINCE.split("."))):
        return opts
    flags = flags_of("vllm", opts)
    if flags.dspark_draft_topk is not None:
        raise UserError(f"--dspark-draft-topk: vLLM {version}'s config/speculative.py has no dspark_draft_topk (it "
                         f"exists since {DSPARK_SERVING_SINCE}); drop the flag or pass --engine-version 0.33.0")
    return dataclasses.replace(opts, flags=dataclasses.replace(flags, no_adaptive_verification=True))


@layouts("vllm").register("dspark")
class VLLMDSparkLayout(VLLMBlockLayout):
    """DSpark: the block layout plus its Markov head and confidence head (speculators' DSparkSpeculator); served with
    vLLM's adaptive verification unless --no-adaptive-verification (see dspark_serve_fields)."""

    arch = "DSparkSpeculator"
    own_options = frozenset({"no_adaptive_verification", "dspark_draft_topk"})  # vLLM's DSpark speculative-config fields

    def options_for(self, opts, version: str | None):
        return dspark_options_for_release(opts, version)

    def build(self, loaded, opts, out_dir: Path):
        files = super().build(loaded, opts, out_dir)
        fields = dspark_serve_fields(loaded.drafter, opts)
        files.sidecar["vllm_dspark_serving"] = {**fields, "needs_vllm": f">= {DSPARK_SERVING_SINCE}" if fields else None}
        return files

    def serve_command(self, out_dir: Path, loaded, opts) -> str:
        self.serve_fields = dspark_serve_fields(loaded.drafter, opts)
        command = super().serve_command(out_dir, loaded, opts)
        if self.serve_fields:
            command = f"# vLLM >= {DSPARK_SERVING_SINCE} (0.27 rejects these speculative-config fields)\n{command}"
        return command

    def extra_config(self, drafter) -> dict:
        return {"markov_rank": drafter.cfg.markov_rank, "markov_head_type": "vanilla", "enable_confidence_head": True,
                "confidence_head_with_markov": True}

    def required_config_keys(self) -> list[str]:
        return [*super().required_config_keys(), "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        spec = super().expected_tensors(config)
        dtype = DTYPES[config["torch_dtype"]]
        h, V = config["transformer_layer_config"]["hidden_size"], config["transformer_layer_config"]["vocab_size"]
        r, dv = config["markov_rank"], config["draft_vocab_size"]
        spec.update({"markov_head.markov_w1.weight": TensorSpec((V, r), dtype),
                     "markov_head.markov_w2.weight": TensorSpec((dv, r), dtype),
                     "confidence_head.proj.weight": TensorSpec((1, h + r), dtype),
                     "confidence_head.proj.bias": TensorSpec((1,), dtype)})
        return spec

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        return super().check_format(export_dir, config, tensors, loaded) + dspark_head_problems(config, tensors,
                                                                                                 loaded.drafter)


# --------------------------------------------------------------------------- P-EAGLE
# speculators.models.peagle: the EAGLE-3 layout (config keys, layers.0.*) plus speculators_model_type
# "peagle", architectures ["PEagleSpeculator"], mask_token_id, embed_requires_grad true, and tensors
# mask_hidden [1, 1, n*h] and embed_tokens (the drafter's own trained copy, not the target's). vLLM
# serves P-EAGLE as {"method": "eagle3", "parallel_drafting": true} (0.27 and 0.33; 0.20 has no P-EAGLE):
# without a method vLLM picks draft_model and parallel_drafting stays off.
@layouts("vllm").register("peagle")
class PEagleLayout(VLLMEagle3Layout):
    serve_fields = {"parallel_drafting": True}
    limit_option = "num_depths"

    @property
    def method(self) -> str:
        """vLLM serves P-EAGLE through its EAGLE-3 method (the kind VLLMEagle3Layout is registered for)."""
        return kind_of_layout(self.name, VLLMEagle3Layout)
    carries_vocab_map = False

    def default_k(self, cfg) -> int:
        return self.drafter_class.tokens_per_round(cfg)

    def files(self, loaded, dtype, k, opts):
        d = loaded.drafter
        check_eagle3_aux_count(d.aux_layer_ids, "vLLM")
        eagle3_config = super().files(loaded, dtype, k, opts)[0]
        # speculators_model_type and the algorithm are already this kind's (VLLMEagle3Layout writes self.kind)
        config = {**eagle3_config, "architectures": ["PEagleSpeculator"],
                  "mask_token_id": d.mask_token_id, "embed_requires_grad": bool(d.cfg.train_embedding)}
        tensors = cast_floats(d.state_dict_for_export(), dtype)
        tensors = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in tensors.items()}
        if d.uses_full_vocabulary():
            tensors.pop("d2t"), tensors.pop("t2d")
        return config, tensors

    def required_config_keys(self) -> list[str]:
        return [*super().required_config_keys(), "mask_token_id"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        dtype = DTYPES[config["torch_dtype"]]
        n_aux = len(config["eagle_aux_hidden_state_layer_ids"])
        spec = {**super().expected_tensors(config),
                "mask_hidden": TensorSpec((1, 1, n_aux * config["target_hidden_size"]), dtype)}
        if config["draft_vocab_size"] == config["transformer_layer_config"]["vocab_size"]:
            spec.pop("d2t"), spec.pop("t2d")
        return spec

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        d = loaded.drafter
        problems = []
        if config.get("mask_token_id") != d.mask_token_id:
            problems.append(f"config.json: mask_token_id is {config.get('mask_token_id')!r}, the drafter was trained "
                            f"with {d.mask_token_id}")
        problems += window_problems(config["transformer_layer_config"], d, 1)
        k = config["speculators_config"]["proposal_methods"][0].get("speculative_tokens") or 0
        if not 1 <= k <= d.cfg.num_depths:
            problems.append(f"config.json: speculative_tokens {k} must lie in 1..{d.cfg.num_depths} (the trained depths)")
        return problems + embedding_problems(tensors, d.embed_tokens, "the drafter's own trained")

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        weights = rename(drafter_weights(tensors, loaded, keep_embedding=True), "layers.0.", "midlayer.")
        return load_plain(weights, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return load_plain(cast_floats(loaded.drafter.state_dict_for_export(), dtype), loaded, "trained drafter")
