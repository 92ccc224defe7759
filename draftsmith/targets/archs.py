"""Target architectures: what draftsmith knows about each one, and the tiny random-weight
configurations the architecture matrix (tests/testing/test_arch_matrix.py, docs/targets.md) runs.

Three questions are answered here for any loaded transformers config:
  - `traits(config)`: the features that matter to a drafter and to its export (rope type and
    parameters, embedding scale, logit soft-capping, sliding / chunked attention, MoE, MLA,
    attention sinks, q/k norm, fused qkv);
  - `draft_rope(config)`: the one flat rope dict a Llama-layer draft (EAGLE-1/3) runs and its
    export writes (per-layer-type rope, as in Gemma-3, becomes the full-attention layers' rope;
    partial rotary is dropped: the draft layer rotates its whole head, at training and serving);
  - `config_refusals(config)`, `draft_rope_refusals(config)`: the target-side reasons a drafter
    cannot serve it (empty when it can). Which reasons apply to a kind is the kind's class's answer
    (heads.refusals; export.refusals adds an export layout's), asked by inspect, train and the matrix.
Also `default_aux_layer_ids(L)`, EAGLE-3's default feature layers (a trait of the target's depth).
This module imports nothing from draftsmith but targets/state_cache.py (the hybrid targets' cache):
target, heads, export and inspect build on it.

The tiny configurations (`TINY`) keep every feature of the real model (layer types, rope type,
soft-capping, MoE routing, MLA ranks) at 4 layers (so that local and global layers alternate and
EAGLE-3's default aux ids are distinct and >= 1, as SGLang and TRT-LLM need), hidden 32-64 and a 259-token byte vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high layer ids: [2, L//2, L-3] as the engines use for deep targets.

    Shallow targets make that rule collide (L=5 gives [2, 2, 2]); then [1, L//2, L-1]
    (L=5 -> [1, 2, 4]) and then [0, L//2, L-1] (L=3 -> [0, 1, 2]) are used. Below 3 layers
    ids repeat (L=2 -> [0, 1, 1]), since only L distinct layer inputs exist.
    """
    L = num_layers
    for ids in ([2, L // 2, L - 3], [1, L // 2, L - 1], [0, L // 2, L - 1]):
        if 0 <= ids[0] < ids[1] < ids[2] <= L - 1:
            return ids
    return [min(i, L - 1) for i in (0, 1, 2)]


def valid_aux_layer_ids(config) -> tuple[list[int], str]:
    """(the layer ids an EAGLE-3 / block drafter may read, why). On every architecture here, hybrids
    included, hidden_states[i] is the residual stream entering decoder layer i, whatever that layer is
    (attention, gated delta-net, Mamba-2, short conv, MLP only): every id in 0..L-1 is a hidden state
    comparable across layers (tests/targets/test_hybrid_features.py checks it against the layer's
    input). A layer's conv window or recurrent state is cache, never a feature. The default stays
    [2, L//2, L-3] (default_aux_layer_ids), vLLM's SupportsEagle3 default for these targets too."""
    c = text_config(config)
    L = int(c.num_hidden_layers)
    kinds = sorted(set(getattr(c, "layer_types", None) or []) - {"full_attention"})
    what = f" (layer types {', '.join(['full_attention', *kinds])})" if kinds else ""
    return list(range(L)), (f"0..{L - 1}: hidden_states[i] is the residual stream entering layer i{what}; "
                            "recurrent / conv states are cache, never features")


# --------------------------------------------------------------------------- traits


@dataclass
class Traits:
    model_type: str
    rope: dict  # the flat rope dict of the draft layer (draft_rope)
    rope_per_layer_type: bool = False  # the target has one rope per layer type (Gemma-3)
    partial_rotary_factor: float = 1.0
    embedding_scale: float | None = None  # sqrt(h) for Gemma; None: raw embedding rows
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    logit_scale: float | None = None  # Cohere multiplies, Granite divides (logits_scaling)
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)
    moe: bool = False
    mla: bool = False
    attention_sinks: bool = False
    qk_norm: bool = False
    fused_qkv: bool = False

    def summary(self) -> list[str]:
        """Short names of the non-Llama features present."""
        out = []
        if self.rope.get("rope_type", "default") != "default":
            out.append(f"rope {self.rope['rope_type']}")
        if self.rope_per_layer_type:
            out.append("rope per layer type")
        if self.partial_rotary_factor != 1.0:
            out.append(f"partial rotary {self.partial_rotary_factor}")
        if self.embedding_scale:
            out.append(f"embedding scale {self.embedding_scale:.4g}")
        if self.final_logit_softcapping:
            out.append(f"logit soft-cap {self.final_logit_softcapping}")
        if self.attn_logit_softcapping:
            out.append(f"attention soft-cap {self.attn_logit_softcapping}")
        if self.logit_scale:
            out.append(f"logit scale {self.logit_scale}")
        kinds = sorted(set(self.layer_types) - {"full_attention"})
        if "chunked_attention" in kinds:
            out.append(f"chunked attention {self.sliding_window} + full layers")
        elif self.sliding_window and (kinds or not self.layer_types):
            out.append(f"sliding window {self.sliding_window}" + (" + full layers" if kinds else ""))
        elif kinds:
            out.append("/".join(kinds))
        for flag, name in ((self.moe, "MoE"), (self.mla, "MLA"), (self.attention_sinks, "attention sinks"),
                           (self.qk_norm, "q/k norm"), (self.fused_qkv, "fused qkv")):
            if flag:
                out.append(name)
        return out


def text_config(config):
    """The text backbone's config of a vision-language config (itself for a text model)."""
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


def draft_rope(config) -> dict:
    """The flat rope dict (transformers-5 `rope_parameters`) a Llama-layer draft runs for this target."""
    config = text_config(config)
    rope = getattr(config, "rope_parameters", None)
    if rope is None:
        rope = {"rope_type": "default", "rope_theta": getattr(config, "rope_theta", 10000.0)}
        if getattr(config, "rope_scaling", None):
            rope.update(config.rope_scaling)
    if rope and all(isinstance(v, dict) for v in rope.values()):  # one rope per layer type (Gemma-3)
        rope = rope.get("full_attention") or next(iter(rope.values()))
    rope = {k: v for k, v in dict(rope).items() if k != "partial_rotary_factor"}
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    return rope


def embedding_scale(model) -> float | None:
    """The factor the target multiplies its embedding rows by (Gemma: sqrt(h)); None when 1."""
    module = model.get_input_embeddings()
    scale = getattr(module, "embed_scale", None)
    if scale is not None and not getattr(scale, "is_meta", False):
        scale = float(scale)
    elif getattr(text_config(model.config), "model_type", "").startswith("gemma"):
        scale = math.sqrt(text_config(model.config).hidden_size)  # Gemma-2 scales inside the model's forward
    return None if scale is None or scale == 1.0 else scale


def traits(config, model=None) -> Traits:
    c = text_config(config)
    rope = getattr(c, "rope_parameters", None) or {}
    per_type = bool(rope) and all(isinstance(v, dict) for v in rope.values())
    flat = next(iter(rope.values())) if per_type else rope
    layer_types = list(getattr(c, "layer_types", None) or [])
    window = getattr(c, "sliding_window", None)
    if window and getattr(c, "use_sliding_window", True) is False:
        window = None
    if getattr(c, "attention_chunk_size", None) and "chunked_attention" in layer_types:
        window = window or c.attention_chunk_size
    scale = embedding_scale(model) if model is not None else (
        math.sqrt(c.hidden_size) if c.model_type.startswith("gemma") else None)
    names = " ".join([n for n, _ in model.named_modules()] + [n for n, _ in model.named_parameters()]) \
        if model is not None else ""
    return Traits(
        model_type=c.model_type,
        rope=draft_rope(c),
        rope_per_layer_type=per_type,
        partial_rotary_factor=float((flat or {}).get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0)) or 1.0),
        embedding_scale=scale,
        final_logit_softcapping=getattr(c, "final_logit_softcapping", None),
        attn_logit_softcapping=getattr(c, "attn_logit_softcapping", None),
        logit_scale=getattr(c, "logit_scale", None) or getattr(c, "logits_scaling", None),
        sliding_window=window,
        layer_types=layer_types,
        moe=any(getattr(c, k, None) for k in ("num_local_experts", "num_experts", "n_routed_experts")),
        mla=bool(getattr(c, "kv_lora_rank", None)),
        attention_sinks=".sinks" in names,
        qk_norm=("q_norm" in names or "q_layernorm" in names or bool(getattr(c, "use_qk_norm", False))),
        fused_qkv="qkv_proj" in names,
    )


# --------------------------------------------------------------------------- refusals


def logits_transform(config) -> tuple[float | None, float | None, float | None]:
    """(final soft-cap, multiply-by, divide-by) the target applies after its lm_head."""
    c = text_config(config)
    cap = getattr(c, "final_logit_softcapping", None)
    if getattr(config, "vision_config", None) is not None and config.model_type in VLM_FORWARD_WITHOUT_SOFTCAP:
        cap = None
    return cap, getattr(c, "logit_scale", None), getattr(c, "logits_scaling", None)


# Image-text-to-text classes whose forward applies no final soft-capping, whatever their text config says
# (transformers 5.25: Gemma3ForConditionalGeneration.forward returns lm_head(h); Gemma3ForCausalLM caps).
VLM_FORWARD_WITHOUT_SOFTCAP = ("gemma3",)


def config_refusals(config) -> list[str]:
    """Why no drafter kind can serve a target of this config ([] when the config is readable)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    c = text_config(config)
    if getattr(c, "num_hidden_layers", 0) < 1 or not getattr(c, "hidden_size", None):
        return [f"{c.model_type}: the config has no decoder layers / hidden size draftsmith can read"]
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    remote = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    vision = getattr(config, "vision_config", None) is not None and \
        config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES  # loaded whole: targets/load.py
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not remote and not vision:
        return [f"{config.model_type}: transformers has no AutoModelForCausalLM or image-text-to-text class for it; "
                "draftsmith loads targets through one of them"]
    return []


def draft_rope_refusals(config) -> list[str]:
    """Why a drafter with its own attention layer (heads: uses_draft_rope) cannot run this target's rope."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = draft_rope(text_config(config)).get("rope_type", "default")
    if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
        return [f"rope_type {rope_type!r}: the draft layer's rotary embedding does not implement it"]
    return []


# --------------------------------------------------------------------------- tiny configurations

BASE = dict(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            tie_word_embeddings=False)


def _llama3():
    from transformers import LlamaConfig

    return LlamaConfig(**BASE, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 128})


def _qwen25():
    from transformers import Qwen2Config

    # transformers loads a saved qwen2 tokenizer as Qwen2Tokenizer, which adds <|endoftext|> (id 259)
    return Qwen2Config(**{**BASE, "tie_word_embeddings": True, "vocab_size": 260}, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def _qwen3():
    from transformers import Qwen3Config

    return Qwen3Config(**BASE, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**BASE, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          decoder_sparse_step=1, norm_topk_prob=True)


def _mistral():
    from transformers import MistralConfig

    return MistralConfig(**BASE, head_dim=8, sliding_window=8)


def _gemma2():
    from transformers import Gemma2Config

    return Gemma2Config(**{**BASE, "tie_word_embeddings": True}, head_dim=8, query_pre_attn_scalar=8,
                        sliding_window=8, final_logit_softcapping=0.5, attn_logit_softcapping=5.0,  # caps that bite on random logits
                        layer_types=["sliding_attention", "full_attention"] * 2)


def _gemma3():
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**{**BASE, "tie_word_embeddings": True}, head_dim=8, query_pre_attn_scalar=8,
                            sliding_window=8, final_logit_softcapping=0.5,
                            layer_types=["sliding_attention", "full_attention"] * 2,
                            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                             "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                "rope_theta": 1000000.0}})


def _phi3():
    from transformers import Phi3Config

    half = 4  # head_dim 8 -> 4 rotary frequency pairs
    return Phi3Config(**{**BASE, "max_position_embeddings": 1024}, original_max_position_embeddings=128,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": [1.0 + 0.1 * i for i in range(half)],
                                       "long_factor": [2.0 + 0.5 * i for i in range(half)],
                                       "factor": 8.0, "original_max_position_embeddings": 128})


def _gpt_oss():
    from transformers import GptOssConfig

    return GptOssConfig(**BASE, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"] * 2,
                        rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                         "truncate": False, "original_max_position_embeddings": 128,
                                         "rope_theta": 150000.0})


def _deepseek_v3():
    from transformers import DeepseekV3Config

    return DeepseekV3Config(**{**BASE, "num_key_value_heads": 4}, n_routed_experts=4, num_experts_per_tok=2,
                            n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                            topk_group=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8,
                            v_head_dim=8, head_dim=8,
                            rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                             "mscale": 1.0, "mscale_all_dim": 1.0,
                                             "original_max_position_embeddings": 256, "rope_theta": 10000.0})


def _olmo2():
    from transformers import Olmo2Config

    return Olmo2Config(**BASE)


def _glm4():
    from transformers import Glm4Config

    return Glm4Config(**BASE, head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                           "partial_rotary_factor": 0.5})


def _llama4_text():
    from transformers import Llama4TextConfig

    return Llama4TextConfig(**{**BASE}, head_dim=8, intermediate_size_mlp=64,
                            num_local_experts=2, num_experts_per_tok=1, attention_chunk_size=8,
                            interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0],
                            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 128})


# Hybrid targets (issue 42): linear-attention / conv / Mamba-2 layers beside attention layers. Their
# caches and how the loop rolls them back: targets/state_cache.py.
LINEAR3_FULL1 = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


def _gated_delta_net():
    return dict(layer_types=LINEAR3_FULL1, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                linear_value_head_dim=8, linear_conv_kernel_dim=4)


def _qwen3_next():
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(**BASE, head_dim=8, **_gated_delta_net(), num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1)


def _qwen3_5():
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**BASE, head_dim=8, **_gated_delta_net())


def _qwen3_5_moe():
    from transformers import Qwen3_5MoeTextConfig

    # saved and read back, its tokenizer class adds <|endoftext|> (id 259), as Qwen2.5's does
    return Qwen3_5MoeTextConfig(**{**BASE, "vocab_size": 260}, head_dim=8, **_gated_delta_net(), num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=32, shared_expert_intermediate_size=32)


def _lfm2():
    from transformers import Lfm2Config

    return Lfm2Config(**BASE, layer_types=["conv", "conv", "full_attention", "conv"], conv_L_cache=3)


def _falcon_h1():
    from transformers import FalconH1Config

    return FalconH1Config(**BASE, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
                          mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=16)


def _nemotron_h():
    from transformers import NemotronHConfig

    # M: Mamba-2, *: attention, -: MLP only
    return NemotronHConfig(**BASE, head_dim=8, hybrid_override_pattern="M*M-", mamba_num_heads=4, mamba_head_dim=8,
                           ssm_state_size=8, n_groups=1, conv_kernel=4, chunk_size=16)


def _granite_hybrid():
    from transformers import GraniteMoeHybridConfig

    return GraniteMoeHybridConfig(**BASE, layer_types=["mamba", "mamba", "attention", "mamba"], mamba_n_heads=4,
                                  mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_d_conv=4,
                                  mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2,
                                  shared_intermediate_size=32)


def _kimi_linear():
    from transformers import KimiLinearConfig

    return KimiLinearConfig(**{**BASE, "num_key_value_heads": 4},
                            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                            linear_attn_config={"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4},
                            kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                            num_experts=4, num_experts_per_token=2, moe_intermediate_size=32)


# Vision-language targets (issue 42): the full model with its vision tower, on text prompts here.
VISION_TOKENS = dict(image_token_id=290, video_token_id=291, vision_start_token_id=292, vision_end_token_id=293)


def _gemma3_vl():
    from transformers import Gemma3Config

    return Gemma3Config(text_config=_gemma3().to_dict(), mm_tokens_per_image=4, image_token_index=256,
                        boi_token_index=257, eoi_token_index=258,
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=56, patch_size=14))


def _qwen25_vl():
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(text_config={**BASE, "vocab_size": 300, "rope_parameters": {
                                "rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1e6}},
                            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                                               out_hidden_size=32, fullatt_block_indexes=[1]), **VISION_TOKENS)


def _qwen3_vl():
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(text_config={**BASE, "vocab_size": 300, "head_dim": 8, "rope_parameters": {
                             "rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True,
                             "rope_theta": 1e6}},
                         vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                                            out_hidden_size=32, num_position_embeddings=64,
                                            deepstack_visual_indexes=[1]), **VISION_TOKENS)


def _qwen3_vl_moe():
    from transformers import Qwen3VLMoeConfig

    vl = _qwen3_vl()  # the same tiny text model and vision tower, with MoE layers
    text = {k: v for k, v in vl.text_config.to_dict().items() if k != "model_type"}
    vision = {k: v for k, v in vl.vision_config.to_dict().items() if k != "model_type"}
    return Qwen3VLMoeConfig(text_config={**text, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                         "decoder_sparse_step": 1}, vision_config=vision, **VISION_TOKENS)


# name -> (what it stands for, tiny config factory)
TINY = {
    "llama3": ("Llama 3.x (llama3 rope scaling)", _llama3),
    "qwen2.5": ("Qwen2.5 (tied embeddings)", _qwen25),
    "qwen3": ("Qwen3 (q/k norm)", _qwen3),
    "qwen3-moe": ("Qwen3-MoE", _qwen3_moe),
    "mistral": ("Mistral (sliding window)", _mistral),
    "gemma2": ("Gemma-2 (embedding scale, soft-capping, local/global)", _gemma2),
    "gemma3-text": ("Gemma-3 text (rope per layer type, local/global)", _gemma3),
    "phi3": ("Phi-3 (fused qkv, longrope)", _phi3),
    "gpt-oss": ("gpt-oss (YaRN, attention sinks, MoE, local/global)", _gpt_oss),
    "deepseek-v3": ("DeepSeek-V3 (MLA, MoE, YaRN)", _deepseek_v3),
    "olmo2": ("OLMo-2", _olmo2),
    "glm4": ("GLM-4 (partial rotary)", _glm4),
    "llama4-text": ("Llama 4 text backbone of the Llama 4 VLM (chunked attention, NoPE layers, MoE)", _llama4_text),
    "qwen3-next": ("Qwen3-Next (hybrid: gated delta-net + attention, MoE)", _qwen3_next),
    "qwen3.5": ("Qwen3.5 text (hybrid: gated delta-net + attention)", _qwen3_5),
    "qwen3.5-moe": ("Qwen3.5-MoE text (hybrid: gated delta-net + attention, MoE)", _qwen3_5_moe),
    "lfm2": ("LFM2 (hybrid: short convolutions + attention)", _lfm2),
    "falcon-h1": ("Falcon-H1 (hybrid: Mamba-2 and attention in every layer)", _falcon_h1),
    "nemotron-h": ("Nemotron-H (hybrid: Mamba-2, attention and MLP-only layers)", _nemotron_h),
    "granite-4-hybrid": ("Granite-4 hybrid (granitemoehybrid: Mamba-2 + attention, MoE)", _granite_hybrid),
    "kimi-linear": ("Kimi-Linear (hybrid: KDA linear attention + MLA, MoE)", _kimi_linear),
    "gemma3-vl": ("Gemma-3 with its SigLIP vision tower (Gemma3ForConditionalGeneration), text prompts", _gemma3_vl),
    "qwen2.5-vl": ("Qwen2.5-VL (vision tower, M-RoPE)", _qwen25_vl),
    "qwen3-vl": ("Qwen3-VL (vision tower, interleaved M-RoPE, deepstack)", _qwen3_vl),
    "qwen3-vl-moe": ("Qwen3-VL-MoE (vision tower, interleaved M-RoPE, deepstack, MoE)", _qwen3_vl_moe),
}


def new_cache(config, keep_states: int = 1, state_rollback: str = "keep"):
    """A DynamicCache for the speculative loop that can be rolled back on every layer.

    Sliding-window (and chunked) layers keep only the last window of keys; a rejected draft
    could then not be cropped once the window is full. Past recording keeps the full keys
    until the next crop, which restores the window (transformers' DynamicSlidingWindowLayer).
    Recurrent and convolutional layers of hybrid targets (targets/state_cache.py) keep the state
    at each of the last `keep_states` positions of a forward (state_rollback "keep"), or are
    snapshotted by the loop ("replay").
    """
    from transformers import DynamicCache

    from draftsmith.targets import state_cache

    cache = DynamicCache(config=config)
    state_cache.activate(cache, keep_states, state_rollback)
    return cache


# --------------------------------------------------------------------------- export fields

# Target config keys a draft LM export (a model of the target's own architecture) must carry
# unchanged: soft-capping, windows, the attention scale and the rope; the embedding scale is
# implied by model_type (Gemma multiplies by sqrt(h) in its own forward).
CARRIED_KEYS = ("model_type", "final_logit_softcapping", "attn_logit_softcapping", "sliding_window",
                "query_pre_attn_scalar", "attention_chunk_size", "rope_parameters", "logit_scale", "logits_scaling")


def carried_field_problems(exported: dict, target_config) -> list[str]:
    """config.json of a draft-LM export against the target's config: the keys above must be equal."""
    want = text_config(target_config).to_dict()
    problems = []
    for key in CARRIED_KEYS:
        if want.get(key) is None:
            continue
        if exported.get(key) != want[key]:
            problems.append(f"config.json: {key} is {exported.get(key)!r}, the target's is {want[key]!r} (the engine's "
                            "draft model would run without the target's setting)")
    return problems


def export_record(target) -> dict:
    """What draftsmith.json records about the target's architecture and what the drafter reads of it."""
    t = traits(target.config, target.model)
    return {"model_type": t.model_type, "features": t.summary(), "embedding_scale": t.embedding_scale,
            "final_logit_softcapping": t.final_logit_softcapping, "sliding_window": t.sliding_window,
            "layer_types": t.layer_types, "draft_rope": t.rope,
            "draft_reads": "raw embedding rows (no scale), the draft's own full-attention layer with draft_rope; "
                           "soft labels are the target's own (soft-capped) logits"}
