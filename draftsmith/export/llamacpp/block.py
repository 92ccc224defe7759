"""DFlash and DSpark for llama.cpp: the HF directory its own converter reads, and what it cannot serve.

llama.cpp (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp) builds both block drafters as one graph,
arch "dflash" (src/models/dflash.cpp), from two converter classes (conversion/qwen.py):

  DFlash  z-lab's `DFlashDraftModel` (class DFlashModel, a Qwen3Model): a Qwen3 config at the top level
          (hidden_size, num_hidden_layers = draft layers, heads, head_dim, rms_norm_eps, rope_theta, ...)
          plus dflash_config {mask_token_id, target_layer_ids, block_size}. target_layer_ids count
          OUTPUTS of target layers: GGUF target_layers = id + 1 = the INPUT of layer id + 1
          (t_layer_inp), so draftsmith's aux id i (hidden_states[i], the input of layer i) is written
          as i - 1. No d2t: the draft vocabulary is the target's. Tensors fc, hidden_norm,
          layers.{i}.*, norm, lm_head (all kept, "model." prefixed by the converter).
  DSpark  speculators' `DSparkSpeculator` (class DSparkModel): transformer_layer_config merged into
          the top level, aux_hidden_state_layer_ids (same convention as draftsmith), mask_token_id,
          sample_from_anchor, draft_vocab_size; d2t as offsets (the converter adds arange), t2d
          dropped, markov_head.markov_w{1,2}, confidence_head.proj; a full-vocabulary lm_head is
          DROPPED: the graph then projects with the target's output tensor (ctx_other).
  DFlash 2  z-lab's `DFlash2DraftModel` (the same class DFlashModel): DFlash's layout plus dflash_config
          {conv_kernel_size, conv_group_size, selector_rank, selector_top_k}; tensors layers.{i}.{attention_conv,
          mlp_conv}.{base_kernel [2, K, h], kernel_projection.weight [2 K G, h]} (gguf blk.{i}.{attn,ffn}_conv_*),
          candidate_selector.{predecessor,successor}_codebook [V, r], hidden_projection.weight [r, h]
          (selector_*). The loader needs the full vocabulary (successor codebook by target id) and
          top_k * (top_k + 1) <= hidden (the lattice row); served as draft-dflash, whose loop walks the
          selector greedily (argmax over the K pair scores from the previous pick) when selector_top_k > 0.

The graph, against draftsmith's BlockDrafting (heads/block.py), term by term:
  context  fc -> RMSNorm (hidden_norm = enc output norm); per layer k_norm(k_proj(ctx)) roped at the
           committed positions, v_proj(ctx): injected into the draft KV cache   == context_kv
  block    [id_last, MASK...] at pos0.., token embedding of the TARGET (no embed_tokens in the
           draft), per layer: attn_norm, q/k/v, q_norm / k_norm, NeoX rope (HF rotate_half),
           non-causal attention over cache + block, scale 1/sqrt(head_dim), + residual, ffn_norm,
           SiLU MLP, + residual; final norm; lm_head (d2t scatter)                == block_hidden
  DSpark   Markov bias W2 W1[prev] per slot, prev = the anchor, then the argmax of the previous biased
           slot; confidence sigmoid(proj [final hidden ; W1[prev]])              == DSparkDrafter.heads
  loop     (common/speculative.cpp draft-dflash / draft-dspark) ONE decode of n_max + 1 (DFlash) or
           n_max (DSpark, sample_from_anchor) tokens per round; the whole draft is verified;
           features of every committed position but the newest are in the draft cache (rejected
           ones removed by server-context.cpp's seq_rm)                          == BlockProposer
  Differences (refused or handled): a k other than one whole block (the block is n_max + 1 tokens
  long, a shorter one than trained changes every draft); DSpark's confidence cut: llama.cpp stops at
  the first slot whose own confidence < --spec-draft-p-min and does not send it, draftsmith where the
  running product drops below drafter.confidence_threshold and sends that slot; the export serves
  with --spec-draft-p-min 0 (the whole block), and `eval --engine` runs draftsmith's side at
  confidence_threshold 0 to compare the same rule.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import torch

from draftsmith.core.errors import UserError
from draftsmith.export.layout import kind_of_layout, layouts, llama_fields, target_rope
from draftsmith.export.llamacpp.layouts import FORMAT, LlamaCppLayout, layout_of


class LlamaCppBlockLayout(LlamaCppLayout):
    """What the block drafters share in llama.cpp: one graph (arch "dflash"), SiLU, plain rope, one whole block."""

    def refusals(self, target_config) -> list[str]:
        return self.capture_refusals(target_config) + self.rope_refusals(target_config)

    def rope_refusals(self, target_config) -> list[str]:
        rope = target_rope(target_config)
        if rope.get("rope_type", "default") == "default":
            return []
        return [f"--to llama.cpp: the target's rope_type {rope.get('rope_type')!r}: llama.cpp's {self.kind} converter "
                "(a Qwen3 model) writes plain rope only, the drafter was trained with the scaled one; export --to vllm"]

    def drafter_refusal(self, loaded) -> str | None:
        """Why llama.cpp's dflash graph cannot run this trained block drafter exactly (one line), or None."""
        act = getattr(loaded.drafter.layer_config, "hidden_act", "silu")
        if act != "silu":
            return (f"--to llama.cpp: the {self.kind} layer's hidden_act {act!r} is not SiLU, which llama.cpp's "
                    "converter writes for it")
        rope = self.rope_refusals(loaded.target.config)
        return rope[0] if rope else self.vocab_refusal(loaded.drafter)

    def vocab_refusal(self, drafter) -> str | None:
        return None

    def default_k(self, cfg) -> int:
        return self.drafter_class.tokens_per_round(cfg)

    def check_k(self, cfg, k: int) -> None:
        super().check_k(cfg, k)
        most = self.drafter_class.tokens_per_round(cfg)
        if k != most:  # llama.cpp decodes a block of k + anchor tokens: only one whole trained block is exact
            anchor = cfg.block_size - most
            raise UserError(f"--num-speculative-tokens {k}: llama.cpp's draft-{self.kind} decodes a block of "
                             f"{k + anchor} tokens for it, this {self.kind} was trained on "
                             f"blocks of {cfg.block_size} (it drafts {most}); pass {most} (--k {most} for eval)")

    def write_source(self, loaded, hf_dir: Path, k: int) -> None:
        write_block_dir(loaded, hf_dir)

    def gguf_problems(self, draft_gguf: Path, drafter) -> list[str]:
        return gguf_block_problems(draft_gguf, drafter)

    def config(self, loaded) -> dict:
        """config.json in the layout llama.cpp's converter class for this kind reads (module doc)."""
        raise NotImplementedError


@layouts(FORMAT).register("dflash")
class LlamaCppDFlashLayout(LlamaCppBlockLayout):
    """z-lab's DFlashDraftModel layout (converter class DFlashModel)."""

    title = "DFlash"
    architecture: ClassVar[str] = "DFlashDraftModel"

    def vocab_refusal(self, d) -> str | None:
        if d.uses_full_vocabulary():
            return None
        return (f"--to llama.cpp: this DFlash drafter has a reduced draft vocabulary ({d.d2t.shape[0]} of "
                f"{d.t2d.shape[0]}); llama.cpp's DFlash converter (z-lab DFlashDraftModel) has no d2t; retrain with "
                "drafter.draft_vocab_size unset, or export --to vllm")

    def dflash_config(self, drafter) -> dict:
        return {"mask_token_id": int(drafter.mask_token_id), "block_size": drafter.block_size,
                "target_layer_ids": [int(i) - 1 for i in drafter.aux_layer_ids]}

    def config(self, loaded) -> dict:
        d = loaded.drafter
        return {**qwen3_fields(loaded), "architectures": [self.architecture], "block_size": d.block_size,
                "dflash_config": self.dflash_config(d)}


@layouts(FORMAT).register("dflash2")
class LlamaCppDFlash2Layout(LlamaCppDFlashLayout):
    """z-lab's DFlash2DraftModel layout (the same converter class): DFlash's plus the conv and selector fields.
    Served as draft-dflash: common/speculative.cpp walks the selector when the GGUF has selector_top_k (uncut at
    llama.cpp's default --spec-draft-p-min 0, as draftsmith's walk)."""

    title = "DFlash 2"
    architecture = "DFlash2DraftModel"

    @property
    def spec_type(self) -> str:
        return f"draft-{kind_of_layout(self.name, LlamaCppDFlashLayout)}"

    def vocab_refusal(self, d) -> str | None:
        return dflash2_refusal(d)

    def dflash_config(self, drafter) -> dict:  # the converter writes these four as {arch}.conv_* / selector_*
        return {**super().dflash_config(drafter), **{name: int(getattr(drafter.cfg, name)) for name in
                                                     ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                      "selector_top_k")}}


@layouts(FORMAT).register("dspark")
class LlamaCppDSparkLayout(LlamaCppBlockLayout):
    """speculators' DSparkSpeculator layout (converter class DSparkModel)."""

    title = "DSpark"
    # eval --engine: the export serves with --spec-draft-p-min 0 (the whole block), so draftsmith's side drafts it too
    engine_drafter_options = {"confidence_threshold": 0.0}

    def vocab_refusal(self, d) -> str | None:
        if not (d.uses_full_vocabulary() and d.cfg.train_lm_head):
            return None
        return ("--to llama.cpp: this DSpark drafter trained its lm_head (drafter.train_lm_head=true) over the full "
                "vocabulary; llama.cpp's DSpark converter drops a full-vocabulary lm_head and projects with the "
                "target's; retrain with train_lm_head false or a draft_vocab_size, or export --to vllm")

    def config(self, loaded) -> dict:
        d = loaded.drafter
        return {"architectures": ["DSparkSpeculator"], "speculators_model_type": self.kind,
                "draft_vocab_size": int(d.d2t.shape[0]), "block_size": d.block_size,
                "target_hidden_size": int(loaded.target.hidden_size),
                "aux_hidden_state_layer_ids": [int(i) for i in d.aux_layer_ids], "mask_token_id": int(d.mask_token_id),
                "sample_from_anchor": True, "markov_rank": int(d.cfg.markov_rank), "markov_head_type": "vanilla",
                "transformer_layer_config": qwen3_fields(loaded), "torch_dtype": "float32"}


def dflash2_refusal(d) -> str | None:
    """What llama.cpp's DFlash 2 loader (src/models/dflash.cpp) rejects or reads differently, or None."""
    if not d.uses_full_vocabulary():
        return (f"--to llama.cpp: this DFlash 2 drafter has a reduced draft vocabulary ({d.d2t.shape[0]} of "
                f"{d.t2d.shape[0]}); llama.cpp's DFlash 2 selector indexes its successor codebook by target id "
                "(selector_successor [rank, n_vocab]); retrain with drafter.draft_vocab_size unset")
    hidden, top_k = int(d.layer_config.hidden_size), int(d.top_k)
    if hidden < top_k * (top_k + 1):
        return (f"--to llama.cpp: drafter.selector_top_k {top_k} needs a hidden size >= top_k * (top_k + 1) = "
                f"{top_k * (top_k + 1)} (llama.cpp packs the selector lattice into one hidden row, "
                f"src/models/dflash.cpp); this drafter's is {hidden}: retrain with a smaller selector_top_k")
    return None


def qwen3_fields(loaded) -> dict:
    """The draft layers' Qwen3 config (llama.cpp's converter reads them as a Qwen3 model)."""
    d = loaded.drafter
    fields = llama_fields(d.layer_config, loaded.target.config, torch.float32)
    fields.update({"model_type": "qwen3", "num_hidden_layers": len(d.layers), "use_sliding_window": False})
    return fields


def block_config(loaded) -> dict:
    """config.json in the layout llama.cpp's converter class for this kind reads (module doc)."""
    return layout_of(loaded.drafter.kind).config(loaded)


def block_tensors(loaded) -> dict[str, torch.Tensor]:
    """The drafter's own tensors in float32 (no embedding: llama.cpp takes the target's token embedding);
    d2t / t2d only with a reduced draft vocabulary."""
    d = loaded.drafter
    tensors = {k: (v.float() if v.is_floating_point() else v).detach().cpu().contiguous()
               for k, v in d.state_dict_for_export().items()}
    if d.uses_full_vocabulary():
        tensors.pop("d2t", None), tensors.pop("t2d", None)
    return tensors


def write_block_dir(loaded, out: Path) -> Path:
    """The HF directory llama.cpp's convert_hf_to_gguf.py turns into the draft GGUF (with --target-model-dir)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(block_config(loaded), indent=2) + "\n")
    save_file(block_tensors(loaded), str(out / "model.safetensors"))
    return out


def gguf_block_problems(draft_gguf: Path, drafter) -> list[str]:
    """The draft GGUF's dflash metadata against the trained drafter (via the gguf package)."""
    from gguf import GGUFReader

    fields = {name: f.contents() for name, f in GGUFReader(str(draft_gguf)).fields.items()}
    problems = []
    layers = fields.get("dflash.target_layers")
    if layers is None or list(layers) != list(drafter.aux_layer_ids):
        problems.append(f"aux ids: the draft GGUF extracts target layers {layers}, the drafter was trained on "
                        f"{list(drafter.aux_layer_ids)}")
    if fields.get("dflash.block_size") != drafter.block_size:
        problems.append(f"block size: the draft GGUF has {fields.get('dflash.block_size')}, the drafter {drafter.block_size}")
    mask = fields.get("tokenizer.ggml.mask_token_id")
    if mask != drafter.mask_token_id:
        problems.append(f"mask token: the draft GGUF has {mask}, the drafter {drafter.mask_token_id}")
    if fields.get("dflash.attention.causal") is True:
        problems.append("attention: the draft GGUF runs the block causally, the drafter was trained bidirectionally")
    return problems
