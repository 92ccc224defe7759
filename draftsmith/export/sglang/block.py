"""SGLang block drafters: DFlash (DFlashDraftModel) and DSpark (Qwen3DSparkModel), read from the SGLang 0.5.23
wheel (python/sglang/srt/models/dflash.py, models/dspark.py, speculative/dflash_utils.py
parse_dflash_draft_config, speculative/dspark_components/dspark_config.py, arg_groups/speculative_hook.py).
SGLang reads z-lab's layout, not the speculators one: it has no speculators_config reader.

config.json  a Qwen3 config of the draft layers (model_type "qwen3", num_hidden_layers = draft layers, q_norm /
             k_norm on heads, rope and max positions from the target, vocab_size = the target's) with
             architectures ["DFlashDraftModel"] | ["Qwen3DSparkModel"], top-level block_size and num_target_layers,
             dflash_config {mask_token_id, target_layer_ids}; target_layer_ids name layer OUTPUTS
             (set_dflash_layers_to_capture captures [i + 1 for i in ids]), so the export writes draftsmith id - 1.
             Attention: every layer is "full_attention" and no is_causal is written, which SGLang runs
             non-causally (ENCODER_ONLY, _get_dflash_layer_attention_params), as the block was trained.
             DSpark adds markov_rank, markov_head_type "vanilla", enable_confidence_head,
             confidence_head_with_markov (the head reads [hidden ; markov_w1[prev]]) and sample_from_anchor true.
tensors      fc, hidden_norm, layers.{i}.*, norm; DSpark adds markov_head.markov_w1 [V, r], markov_head.markov_w2
             [V, r], confidence_head.proj.{weight, bias}. No lm_head, no embed_tokens, no d2t: SGLang's block
             drafts borrow the TARGET's embedding and lm_head (dflash_worker_v2.py: "DFLASH's draft has no head of
             its own"; dspark.py skips lm_head.*), so only a full-vocabulary drafter whose lm_head is the target's
             (drafter.train_lm_head=false) serves there. SGLang's loaders skip unknown names silently: the gate
             compares the exact name set.
serve        DFLASH verifies --speculative-num-draft-tokens = block_size (anchor + block_size - 1 drafts);
             DSPARK verifies gamma + 1 = block_size + 1 (gamma = block_size drafts).
"""
from __future__ import annotations

import shlex
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.export.eagle_tensors import output_of_layer_ids
from draftsmith.export.layout import (
    DTYPES,
    REFUSED,
    ExportFiles,
    ExportOptions,
    Layout,
    TensorSpec,
    cast_floats,
    layouts,
    llama_fields,
    num_tokens,
    read_export,
    serving_dtype,
    sidecar,
    verifier_name,
)
from draftsmith.export.speculators import (
    QWEN3_LAYER_KEYS,
    block_tensor_spec,
    dspark_head_problems,
    load_plain,
)

# SGLang reads z-lab's DFlash 2 config, which draftsmith writes only for --to llama.cpp (export/llamacpp/block.py).
REFUSED.register("sglang", "dflash2", "SGLang serves DFlash 2 through sgl-project/sglang#35371 (z-lab's "
                 "DFlash2DraftModel config), a format draftsmith does not write yet")

SGLANG_VERSION = "0.5.23"  # the SGLang release whose loaders this layout is read from
NOT_SERVED = ("lm_head.weight", "d2t", "t2d")  # SGLang uses the target's lm_head and vocabulary


def borrowed_head_problem(drafter, target) -> str | None:
    """Why SGLang's block draft (which borrows the target's lm_head and has no d2t) would not compute what was
    trained, or None."""
    if drafter.d2t.shape[0] != target.vocab_size:
        return (f"this {drafter.kind} drafter has a reduced draft vocabulary ({drafter.d2t.shape[0]} of "
                f"{target.vocab_size}), and SGLang {SGLANG_VERSION}'s block drafts have no lm_head or d2t of their own "
                "(they borrow the target's); export it with --to vllm, or retrain with drafter.draft_vocab_size=null")
    own = drafter.lm_head.weight.detach().cpu()
    if not torch.equal(own, target.lm_head.weight.detach().cpu().to(own.dtype)):
        return (f"this {drafter.kind} drafter's lm_head differs from the target's (drafter.train_lm_head=true), and "
                f"SGLang {SGLANG_VERSION}'s block drafts use the target's lm_head; export it with --to vllm, or retrain "
                "with drafter.train_lm_head=false")
    return None


@layouts("sglang").register("dflash")
class SGLangBlockLayout(Layout):
    """DFlash as SGLang's DFlashDraftModel (see the module docstring)."""

    arch = "DFlashDraftModel"
    algorithm = "DFLASH"
    extra_verified = 0  # verified tokens = block_size + extra_verified (DSpark verifies the anchor too)

    def check_k(self, cfg, k: int) -> None:
        most = self.drafter_class.tokens_per_round(cfg)
        if k != most:  # the serve command fixes --speculative-num-draft-tokens to one block
            raise UserError(f"--num-speculative-tokens {k}: SGLang's {self.algorithm} drafts one whole block "
                             f"({most} tokens for block_size {cfg.block_size}, trained bidirectionally at that "
                             f"length); pass --num-speculative-tokens {most} or retrain with another drafter.block_size")

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        d, target = loaded.drafter, loaded.target
        why = borrowed_head_problem(d, target)
        if why:
            raise UserError(f"--to sglang: {why}")
        k = num_tokens(loaded, opts, d.tokens_per_round(d.cfg))
        self.check_k(d.cfg, k)
        dtype = serving_dtype(loaded, opts)
        config = {**llama_fields(d.layer_config, target.config, dtype), "model_type": "qwen3",
                  "architectures": [self.arch], "num_hidden_layers": len(d.layers), "use_sliding_window": False,
                  "layer_types": ["full_attention"] * len(d.layers),  # with no is_causal: non-causal in SGLang
                  "block_size": d.block_size, "num_target_layers": target.num_layers,
                  "dflash_config": {"mask_token_id": d.mask_token_id,
                                    "target_layer_ids": output_of_layer_ids(d.aux_layer_ids, "SGLang")}}
        config.update(self.extra_config(d))
        tensors = {n: t for n, t in cast_floats(d.state_dict_for_export(), dtype).items() if n not in NOT_SERVED}
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k,
                                                               "sglang_version": SGLANG_VERSION})
        return ExportFiles(config=config, tensors=tensors, sidecar=side)

    def extra_config(self, drafter) -> dict:
        return {}

    def required_config_keys(self) -> list[str]:
        return ["architectures", *QWEN3_LAYER_KEYS, "layer_types", "block_size", "num_target_layers",
                "dflash_config.mask_token_id", "dflash_config.target_layer_ids", "torch_dtype"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        # the speculators format's backbone shapes from the same Qwen3 layer config, less what SGLang borrows from
        # the target
        spec = block_tensor_spec(self.as_speculators(config))
        return {n: s for n, s in spec.items() if n not in (*NOT_SERVED, "embed_tokens.weight")}

    @staticmethod
    def as_speculators(config: dict) -> dict:
        ids = config["dflash_config"]["target_layer_ids"]
        return {"torch_dtype": config["torch_dtype"], "transformer_layer_config": config,
                "draft_vocab_size": config["vocab_size"], "aux_hidden_state_layer_ids": ids,
                "target_hidden_size": config["hidden_size"], "markov_rank": config.get("markov_rank")}

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        d = loaded.drafter
        want = {"architectures": [self.arch], "block_size": d.block_size, "num_target_layers": loaded.target.num_layers}
        problems = [f"config.json: {key} is {config.get(key)!r}, expected {value!r}"
                    for key, value in want.items() if config.get(key) != value]
        ids, trained = config["dflash_config"]["target_layer_ids"], [i - 1 for i in d.aux_layer_ids]
        if ids != trained:
            problems.append(f"config.json: dflash_config.target_layer_ids {ids} != {trained} (SGLang ids are layer "
                            "outputs: draftsmith id - 1)")
        if config["dflash_config"]["mask_token_id"] != d.mask_token_id:
            problems.append(f"config.json: dflash_config.mask_token_id is {config['dflash_config']['mask_token_id']}, "
                            f"the drafter was trained with {d.mask_token_id}")
        if config.get("is_causal") or any(t != "full_attention" for t in config["layer_types"]):
            problems.append("config.json: is_causal / a non-full_attention layer_types entry makes SGLang run the block "
                            "causally or windowed (dflash.py _get_dflash_layer_attention_params); the drafter was "
                            "trained bidirectionally: write full_attention layers and no is_causal")
        why = borrowed_head_problem(d, loaded.target)
        return problems + ([why] if why else [])

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        V = loaded.target.vocab_size
        weights = {**tensors, "lm_head.weight": loaded.target.lm_head.weight.detach().cpu(),  # SGLang's borrowed head
                   "d2t": torch.zeros(V, dtype=torch.long), "t2d": torch.ones(V, dtype=torch.bool)}
        return load_plain(weights, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        weights = cast_floats(loaded.drafter.state_dict_for_export(), dtype)
        weights["lm_head.weight"] = loaded.target.lm_head.weight.detach().cpu()
        return load_plain(weights, loaded, "trained drafter")

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        d = loaded.drafter
        return (f"python -m sglang.launch_server --model-path {shlex.quote(verifier_name(loaded, opts))} "
                f"--speculative-algorithm {self.algorithm} --speculative-draft-model-path {shlex.quote(str(out_dir))} "
                f"--speculative-num-draft-tokens {d.block_size + self.extra_verified}")


@layouts("sglang").register("dspark")
class SGLangDSparkLayout(SGLangBlockLayout):
    """DSpark as SGLang's Qwen3DSparkModel: the DFlash layout plus the Markov and confidence heads."""

    arch = "Qwen3DSparkModel"
    algorithm = "DSPARK"
    extra_verified = 1  # gamma + 1 verified tokens, gamma = block_size

    def extra_config(self, drafter) -> dict:
        return {"markov_rank": drafter.cfg.markov_rank, "markov_head_type": "vanilla", "enable_confidence_head": True,
                "confidence_head_with_markov": True, "sample_from_anchor": True}

    def required_config_keys(self) -> list[str]:
        return [*super().required_config_keys(), "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov", "sample_from_anchor"]

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        dtype = DTYPES[config["torch_dtype"]]
        h, V, r = config["hidden_size"], config["vocab_size"], config["markov_rank"]
        return {**super().expected_tensors(config),
                "markov_head.markov_w1.weight": TensorSpec((V, r), dtype),
                "markov_head.markov_w2.weight": TensorSpec((V, r), dtype),  # full vocabulary: SGLang builds [V, r]
                "confidence_head.proj.weight": TensorSpec((1, h + r), dtype),
                "confidence_head.proj.bias": TensorSpec((1,), dtype)}

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        problems = super().check_format(export_dir, config, tensors, loaded)
        if config.get("sample_from_anchor") is not True:
            problems.append("config.json: sample_from_anchor must be true (every DSpark slot drafts; SGLang's "
                            "get_dspark_sample_from_anchor)")
        return problems + dspark_head_problems(config, tensors, loaded.drafter)
