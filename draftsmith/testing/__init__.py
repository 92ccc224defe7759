"""Tiny seeded targets and tokenizers built in code, for tests and examples (no download).

Random-weight targets give degenerate greedy text: use them for shapes, invariants and
exactness, never for acceptance numbers (use stories260K or the embedded pycode target).
"""
from __future__ import annotations

import torch

from draftsmith.targets.load import Target


def byte_tokenizer(chat_template: str | None = None):
    """A byte-level tokenizer: ids 0-2 are <pad>, <s>, </s>; ids 3..258 are the 256 bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(specials + sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template:
        fast.chat_template = chat_template
    return fast


# A minimal chat template, so tests can cover the tokenizer-template path.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def tiny_target(num_layers: int = 4, hidden: int = 32, vocab: int = 259, seed: int = 0,
                chat_template: str | None = None, dtype: torch.dtype = torch.float32) -> Target:
    """A seeded random Llama (2-4 layers, hidden 32-64) with a byte tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    return Target(model, byte_tokenizer(chat_template), name=f"tiny-llama-{num_layers}x{hidden}-seed{seed}")


def arch_target(name: str, seed: int = 0) -> Target:
    """A seeded random-weight target of architecture `name` (archs.TINY: the architecture matrix's
    tiny configurations) with the byte tokenizer."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from draftsmith.targets.archs import TINY

    if name not in TINY:
        raise KeyError(f"unknown tiny architecture {name!r}; known: {list(TINY)}")
    torch.manual_seed(seed)
    config = TINY[name][1]()
    vision = getattr(config, "vision_config", None) is not None  # the full model, as targets.load builds it
    model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_config(config, dtype=torch.float32)
    model.eval()
    return Target(model, byte_tokenizer(TINY_CHAT_TEMPLATE), name=f"tiny-{name}-seed{seed}")


# llama.cpp's tensor names for a Llama decoder layer (gguf-py's TENSOR_NAMES for MODEL_ARCH.LLAMA).
_GGUF_LAYER_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def _rope_permute(weight, n_head: int):
    """q/k rows reordered from HF's rotate-half layout to llama.cpp's interleaved one (what
    convert_hf_to_gguf.py does; transformers' GGUF loader reverses it)."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(target: Target, path) -> None:
    """Write a Llama target with a byte-level BPE tokenizer as an (unquantized, float32) GGUF file with
    the `gguf` package's writer: architecture "llama", its tokenizer as tokenizer.ggml.model "gpt2"
    (tokens, merges, token types, BOS/EOS/PAD ids). For tests: a GGUF target made in code, no download."""
    import json

    import gguf

    c, tok = target.config, target.tokenizer
    if c.model_type != "llama":
        raise ValueError(f"write_gguf writes Llama targets, not {c.model_type!r}")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(target.name)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_dimension_count(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    writer.add_rope_freq_base(float((c.rope_parameters or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    spec = json.loads(tok.backend_tokenizer.to_str())["model"]
    tokens = [""] * c.vocab_size
    for text, i in tok.get_vocab().items():
        if i < c.vocab_size:
            tokens[i] = text
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec.get("merges", [])])
    special = set(tok.all_special_ids)
    writer.add_token_types([3 if i in special else 1 for i in range(c.vocab_size)])  # 3: CONTROL, 1: NORMAL
    for add, token_id in ((writer.add_bos_token_id, c.bos_token_id), (writer.add_eos_token_id, c.eos_token_id),
                          (writer.add_pad_token_id, c.pad_token_id)):
        if token_id is not None:
            add(int(token_id))
    probe = tok("a").input_ids
    writer.add_add_bos_token(bool(probe) and probe[0] == tok.bos_token_id)  # added by the post-processor or not
    for name, tensor in target.model.state_dict().items():
        w = tensor.detach().float().cpu()
        if name == "lm_head.weight":
            if c.tie_word_embeddings:
                continue  # llama.cpp ties output to token_embd when output.weight is absent
            gguf_name = "output.weight"
        elif name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:  # model.layers.{i}.{rest}
            layer, rest = name.split(".")[2], ".".join(name.split(".")[3:])
            if rest == "self_attn.q_proj.weight":
                w = _rope_permute(w, c.num_attention_heads)
            elif rest == "self_attn.k_proj.weight":
                w = _rope_permute(w, c.num_key_value_heads)
            gguf_name = f"blk.{layer}.{_GGUF_LAYER_TENSORS[rest]}"
        writer.add_tensor(gguf_name, w.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
