"""One normalised row -> token ids and a loss mask: the step both tokenization paths share (in process,
data/dataset.py; through datasets.map, data/hf_tokenize.py, whose cache fingerprint hashes this source)."""
from __future__ import annotations

from draftsmith.data import chat, formats


def encode_row(row: formats.Row, tokenizer, data_cfg, processor=None) -> tuple[list[tuple], bool]:
    """One normalised row -> its sequences (ids, mask) and whether it was truncated. A chat row with images
    gives one (ids, mask, media) through the vision-language target's processor (data/images.py)."""
    if row.kind == "text":
        chunks = chat.encode_text(tokenizer, row.text, data_cfg.text_chunk_tokens, data_cfg.max_length)
        if not chunks:
            raise formats.RowError(formats.EMPTY_TEXT, "fewer than 2 tokens")
        return chunks, False
    if row.kind == "prompt":
        reason = formats.PROMPT_ONLY if row.form in ("prompts", "alpaca") else formats.NO_ASSISTANT
        raise formats.RowError(reason, "no assistant turn to learn from")
    if row.images:
        from draftsmith.data import images

        ids, mask, media, truncated = images.encode_image_row(row, processor, data_cfg)
        return [(ids, mask, media)], truncated
    ids, mask, truncated = chat.encode_chat(tokenizer, row.messages, data_cfg.chat_template, data_cfg.max_length)
    return [(ids, mask)], truncated
