"""Toy models for the speculative-loop tests: real HF Llama models (real KV cache, real crop)
whose next-token logits are a FIXED function of the last token only.

How: hidden size = vocab size V, the embedding is the identity, every attention/MLP output
projection is zero (so each layer adds nothing to the residual stream), and the final
RMSNorm maps one-hot e_x to e_x / sqrt(1/V); the lm_head is then set so that
logits(x) = table[x], an arbitrary [V, V] table.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from draftsmith.targets.load import Target


def fixed_logit_lm(table: torch.Tensor):
    """[V, V] table (row x: logits of the token after x) -> a LlamaForCausalLM computing exactly that."""
    from transformers import LlamaConfig, LlamaForCausalLM

    V = table.shape[0]
    cfg = LlamaConfig(vocab_size=V, hidden_size=V, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256, rms_norm_eps=1e-12,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(V))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        scale = 1.0 / math.sqrt(1.0 / V)  # RMSNorm of a one-hot vector
        model.lm_head.weight.copy_(table.float().T / scale)  # logits[j] = W[j, x] * scale = table[x, j]
    return model


def fixed_logit_target(table: torch.Tensor, name: str = "toy") -> Target:
    tokenizer = SimpleNamespace(eos_token_id=None, get_vocab=lambda: {"toy": 0})
    return Target(fixed_logit_lm(table), tokenizer, name=name)


def successor_table(V: int, overrides: dict[int, int] | None = None, margin: float = 10.0) -> torch.Tensor:
    """Greedy table: after x comes (x + 1) % V, except overrides {x: y}."""
    table = torch.zeros(V, V)
    for x in range(V):
        table[x, (overrides or {}).get(x, (x + 1) % V)] = margin
    return table
