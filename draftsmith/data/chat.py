"""Conversations -> token ids + loss masks, and prompts for generation.

Two renderers, chosen by data.chat_template:
  "auto" with a tokenizer that has a chat template: the tokenizer's own template. Assistant
      spans are found by rendering prefixes: for assistant turn i, the text of
      messages[:i] with the generation prompt is a prefix of the text of messages[:i+1];
      the characters between them (the answer and the end-of-turn token) are the span.
  otherwise the plain format (docs/data.md):
      {bos}System: S\\nUser: Q1\\nAssistant: A1{eos}\\nUser: Q2\\nAssistant: A2{eos}
      with the span " A{eos}" of every assistant turn.
The whole text is tokenized once (no special tokens added: the text carries them) with
character offsets; a token gets loss_mask 1 when its characters overlap an assistant span.
"""
from __future__ import annotations

from typing import Optional

from draftsmith.core.errors import UserError
from draftsmith.data.formats import RowError

PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
TEMPLATE_ERROR = "chat template error"
NOT_PREFIX_STABLE = "chat template is not prefix-stable"
EMPTY_AFTER_TRUNCATION = "empty after truncation (no assistant token within data.max_length)"


def check_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(
            f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer; draftsmith needs character offsets "
            "to build loss masks: load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )


def uses_template(tokenizer, mode: str) -> bool:
    """True when conversations are rendered with the tokenizer's own chat template."""
    return mode == "auto" and bool(getattr(tokenizer, "chat_template", None))


def renderer_name(tokenizer, mode: str) -> str:
    return "tokenizer chat template" if uses_template(tokenizer, mode) else "draftsmith plain format"


def _special(tokenizer, name: str) -> str:
    value = getattr(tokenizer, name, None)
    return value if isinstance(value, str) else ""


def render_plain(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """The plain format: (text, assistant character spans)."""
    eos = _special(tokenizer, "eos_token")
    if not eos:
        raise UserError("the plain chat format needs an end-of-turn token but the tokenizer has no eos_token; "
                         "set tokenizer.eos_token or use a tokenizer with a chat template")
    text = _special(tokenizer, "bos_token")
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            text += "Assistant:"
            start = len(text)
            text += " " + m["content"] + eos
            spans.append((start, len(text)))
            if i < len(messages) - 1:
                text += "\n"
        else:
            text += f"{PLAIN_ROLES[m['role']]}: {m['content']}\n"
    if add_generation_prompt:
        text += "Assistant:"
    return text, spans


def _apply(tokenizer, messages: list[dict], add_generation_prompt: bool, template: str | None = None) -> str:
    """The tokenizer's template (or `template`: a vision-language processor's), bounded in time and output
    (data/template_bounds.py); the sandbox's refusals, includes and bounds become a RowError with one line."""
    from jinja2 import TemplateError

    from draftsmith.data import template_bounds

    template_bounds.install()
    try:
        extra = {"chat_template": template} if template else {}
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **extra)
    except (TemplateError, ValueError, TypeError) as exc:
        raise RowError(TEMPLATE_ERROR, " ".join(str(exc).split())[:300]) from exc
    except RecursionError:
        raise RowError(TEMPLATE_ERROR, "the chat template recurses too deeply") from None


def _trim_end(tokenizer, text: str, start: int, end: int) -> int:
    """Drop whitespace the template writes after the end-of-turn token (the model never emits it)."""
    body = text[start:end].rstrip()
    specials = [s for s in getattr(tokenizer, "all_special_tokens", []) if s]
    if len(body) < end - start and any(body.endswith(s) for s in specials):
        return start + len(body)
    return end


def render_template(tokenizer, messages: list[dict], template: str | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The tokenizer's chat template (or `template`): (text, assistant character spans), by prefix rendering."""
    full = _apply(tokenizer, messages, add_generation_prompt=False, template=template)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        if i == 0:
            raise RowError(TEMPLATE_ERROR, "turn 0 is an assistant turn; a chat template needs a prompt first")
        prefix = _apply(tokenizer, messages[:i], add_generation_prompt=True, template=template)
        upto = _apply(tokenizer, messages[: i + 1], add_generation_prompt=False, template=template)
        if not upto.startswith(prefix) or not full.startswith(upto):
            raise RowError(NOT_PREFIX_STABLE, f"rendering turn {i} changes the earlier text; use data.chat_template=plain")
        spans.append((len(prefix), _trim_end(tokenizer, upto, len(prefix), len(upto))))
    return full, spans


def render(tokenizer, messages: list[dict], mode: str) -> tuple[str, list[tuple[int, int]]]:
    if uses_template(tokenizer, mode):
        return render_template(tokenizer, messages)
    return render_plain(tokenizer, messages)


def mask_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    mask = []
    for a, b in offsets:
        b = max(b, a + 1)  # zero-width tokens count at their start position
        mask.append(int(any(a < e and b > s for s, e in spans)))
    return mask


def encode_chat(tokenizer, messages: list[dict], mode: str, max_length: int) -> tuple[list[int], list[int], bool]:
    """-> (input_ids, loss_mask, truncated). loss_mask[0] is always 0 (nothing predicts token 0)."""
    text, spans = render(tokenizer, messages, mode)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    ids = list(enc["input_ids"])
    mask = mask_from_offsets(enc["offset_mapping"], spans)
    truncated = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    if mask:
        mask[0] = 0
    if sum(mask) == 0:
        raise RowError(EMPTY_AFTER_TRUNCATION, f"{len(enc['input_ids'])} tokens, max_length {max_length}")
    return ids, mask, truncated


def prompt_text(tokenizer, messages: list[dict], mode: str, template: str | None = None) -> str:
    """The text a generator continues: the conversation so far plus the assistant header (template: a
    vision-language processor's chat template, for messages with image parts)."""
    if template:
        return _apply(tokenizer, messages, add_generation_prompt=True, template=template)
    if uses_template(tokenizer, mode):
        return _apply(tokenizer, messages, add_generation_prompt=True)
    return render_plain(tokenizer, messages, add_generation_prompt=True)[0]


def encode_prompt(tokenizer, messages: list[dict], mode: str = "auto") -> list[int]:
    """Token ids of prompt_text (what regeneration and eval feed the target)."""
    return list(tokenizer(prompt_text(tokenizer, messages, mode), add_special_tokens=False, verbose=False)["input_ids"])


def encode_text(tokenizer, text: str, chunk_tokens: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """A plain-text document -> chunks of (ids, loss_mask): {bos} text {eos}, cut every
    min(chunk_tokens, max_length) tokens; loss on every token except each chunk's first.
    A trailing chunk of a single token (nothing to predict) is dropped."""
    bos: Optional[int] = tokenizer.bos_token_id
    eos: Optional[int] = tokenizer.eos_token_id
    body = list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    ids = ([bos] if bos is not None else []) + body + ([eos] if eos is not None else [])
    size = max(2, min(chunk_tokens, max_length))
    chunks = []
    for start in range(0, len(ids), size):
        piece = ids[start:start + size]
        if len(piece) >= 2:
            chunks.append((piece, [0] + [1] * (len(piece) - 1)))
    return chunks
