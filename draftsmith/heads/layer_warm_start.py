"""Warm start of a draft decoder layer from one of the target's decoder layers (drafter.layer_init=target).

A draft layer whose attention reads [norm(embed(x)) ; norm(hidden)] (2h inputs, EAGLE-3) takes the
target layer's weights as follows:
  - q/k/v_proj [out, 2h]: the hidden half (columns h..2h) is the target's [out, h] projection; the
    embedding half (columns 0..h) is zeros (embed_half="zeros": the layer starts as the target layer
    applied to the hidden state, and learns what the next token adds) or the same copy
    (embed_half="copy": both halves read like the target's input);
  - o_proj and the MLP (gate/up/down): copied;
  - the norms by the scale they apply (norm_scale): post_attention_layernorm's into the draft layer's, the
    target's input_layernorm into both norms in front of the attention (hidden_norm and input_layernorm).
The drafter's final norm (in front of its lm_head, which starts as the target's rows) takes the scale of the
target's final norm (`copy_final_norm`): with the target's lm_head behind it, only the target's own scale
turns a target-like state into the target's logits.
A layer with norms the draft layer does not run (Qwen3's and Gemma 3's q_norm / k_norm, Gemma's sandwich
norms around the MLP) is refused by `train` (check_layer, before any data): its copy would not compute what that
layer computes. Loading a drafter trained that way earlier does not ask: its own weights replace the start.
The target layer must have the draft layer's shape (drafter.num_heads / num_kv_heads / head_dim /
intermediate_size left at the target's); otherwise one line says which option to drop.
"""
from __future__ import annotations

import torch
from torch import nn

from draftsmith.core.errors import UserError

COPIED = ("self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
          "post_attention_layernorm.weight")
SPLIT = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")


def target_layer(target, layer_id: int) -> nn.Module:
    """The target's decoder layer `layer_id` (0-based)."""
    try:
        layers = target.model.get_decoder().layers
    except AttributeError:
        raise UserError(f"drafter.layer_init=target: {target.name} has no decoder `layers` list to copy from; "
                        "use drafter.layer_init=random") from None
    if not 0 <= layer_id < len(layers):
        raise UserError(f"drafter.layer_init=target: layer {layer_id} is not one of the target's {len(layers)} layers")
    return layers[layer_id]


LLAMA_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


def check_layer(source: nn.Module, where: str) -> None:
    """Training's check (heads.check_for_training, before any data is read): `source` is a layer the draft layer
    can start as. Loading a trained drafter does not ask it: its own weights replace the copy."""
    src = source.state_dict()
    _require_llama_weights(src, where)
    extra_norms = sorted(k for k in src if "norm" in k and k not in LLAMA_NORMS)
    if extra_norms:
        raise UserError(f"drafter.layer_init=target: {where} also runs {', '.join(extra_norms)}, which the draft layer "
                        "does not have, so a copy would not compute what that layer computes; use "
                        "drafter.layer_init=random")
    for name in ("input_layernorm", "post_attention_layernorm"):
        _check_rms_norm(getattr(source, name, None), f"{where}'s {name}")


def _require_llama_weights(src: dict, where: str) -> None:
    for name in (*COPIED, *SPLIT, "input_layernorm.weight"):
        if name not in src:
            raise UserError(f"drafter.layer_init=target: {where} has no {name} (not a Llama-style layer); "
                            "use drafter.layer_init=random")


def check_final_norm(target) -> None:
    """Training's check: the target's final norm is an RMSNorm with a weight, whose scale the drafter's can take."""
    _check_rms_norm(getattr(target.model.get_decoder(), "norm", None), f"{target.name}'s final norm")


def _check_rms_norm(norm: nn.Module | None, what: str) -> None:
    if norm is None or "RMSNorm" not in type(norm).__name__ or getattr(norm, "weight", None) is None:
        raise UserError(f"drafter.layer_init=target: {what} is {type(norm).__name__ if norm is not None else 'missing'}, "
                        "not an RMSNorm with a weight that the drafter's norms can copy; use drafter.layer_init=random")


@torch.no_grad()
def norm_scale(norm: nn.Module, width: int) -> torch.Tensor:
    """[width] fp32: the per-channel scale an RMSNorm applies, read off the module itself (a constant input comes
    out as its scale; a large one, so eps does not show), so a norm that stores 1 + w (Gemma) reads right too."""
    held = norm.weight
    constant = torch.full((1, width), 1e3, dtype=torch.float32, device=held.device)
    return norm(constant).reshape(-1).float()


@torch.no_grad()
def copy_layer(draft_layer: nn.Module, hidden_norm: nn.Module, input_norm: nn.Module, source: nn.Module,
               embed_half: str, where: str) -> None:
    """Copy `source` (a target decoder layer that passed check_layer) into a 2h-input draft layer as the module
    docstring says; the norms by their scale (norm_scale)."""
    src = source.state_dict()
    dst = draft_layer.state_dict()
    _require_llama_weights(src, where)
    for name in COPIED:
        if dst[name].shape != src[name].shape:
            raise UserError(f"drafter.layer_init=target: {where}'s {name} is {tuple(src[name].shape)}, the draft layer's "
                            f"{tuple(dst[name].shape)}; leave drafter.num_heads / num_kv_heads / head_dim / "
                            "intermediate_size at the target's, or use drafter.layer_init=random")
        dst[name].copy_(src[name].to(dst[name].dtype))
    for name in SPLIT:
        w = dst[name]
        h = src[name].shape[1]
        if w.shape != (src[name].shape[0], 2 * h):
            raise UserError(f"drafter.layer_init=target: {where}'s {name} is {tuple(src[name].shape)}, the draft layer's "
                            f"{tuple(w.shape)} (expected [out, 2 x {h}]); leave the draft layer's shape at the target's")
        copy = src[name].to(w.dtype)
        w[:, h:].copy_(copy)
        w[:, :h].copy_(copy if embed_half == "copy" else torch.zeros_like(copy))
    h = hidden_norm.weight.shape[0]
    for target_norm, draft_norms in (("input_layernorm", (hidden_norm, input_norm)),
                                     ("post_attention_layernorm", (draft_layer.post_attention_layernorm,))):
        module = getattr(source, target_norm, None)
        if module is None or getattr(module, "weight", None) is None:
            continue  # a layer check_layer refuses; a trained drafter's load replaces these weights anyway
        scale = norm_scale(module, h)
        for norm in draft_norms:
            norm.weight.copy_(scale.to(norm.weight))


@torch.no_grad()
def copy_final_norm(draft_norm: nn.Module, target) -> None:
    """The drafter's final RMSNorm takes the scale of the target's final norm (norm_scale). A target whose final
    norm check_final_norm refuses keeps the drafter's start (only a load gets here with one: its weights follow)."""
    source = getattr(target.model.get_decoder(), "norm", None)
    if source is None or getattr(source, "weight", None) is None:
        return
    weight = draft_norm.weight
    weight.copy_(norm_scale(source, weight.shape[0]).to(weight))


@torch.no_grad()
def select_last(fc: nn.Linear, num_aux: int) -> None:
    """fc [h, n*h] as a selector of the last aux layer's hidden state: zeros, the identity in the last block."""
    h = fc.weight.shape[0]
    fc.weight.zero_()
    fc.weight[:, (num_aux - 1) * h :].copy_(torch.eye(h, dtype=fc.weight.dtype))
