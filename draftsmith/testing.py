"""Tiny seeded targets and tokenizers built in code, for tests and examples (no download).

Random-weight targets give degenerate greedy text: use them for shapes, invariants and
exactness, never for acceptance numbers (use stories260K or the embedded pycode target).
"""
from __future__ import annotations

import torch

from draftsmith.target import Target


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
    from transformers import AutoModelForCausalLM

    from draftsmith.archs import TINY

    if name not in TINY:
        raise KeyError(f"unknown tiny architecture {name!r}; known: {list(TINY)}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(TINY[name][1](), dtype=torch.float32).eval()
    return Target(model, byte_tokenizer(TINY_CHAT_TEMPLATE), name=f"tiny-{name}-seed{seed}")
