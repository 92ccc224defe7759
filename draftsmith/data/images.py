"""Rows with images for a vision-language target: the images read (bounded, regular files only) and the row
encoded by the target's processor into token ids with the image tokens expanded, a loss mask, and the
processor's image tensors (docs/data.md "Rows with images").

    ids, mask, media, truncated = encode_image_row(row, target.processor, data_cfg)
    # media: {"pixel_values": ..., "image_grid_thw": ... (Qwen-VL), "token_type_ids" [s] (Gemma-3) ...}

The loss mask is the chat loss mask (assistant spans, found by rendering prefixes with the processor's
chat template) carried onto the processor's expanded ids: tokens the expansion added (the image tokens and
what the processor writes around them) and every image token get 0. An image cut by data.max_length would
give the target fewer image tokens than image features: such a row is skipped (counted), never cut.
"""
from __future__ import annotations

import difflib
import io
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.files import read_received_bytes
from draftsmith.data import chat, formats

MAX_IMAGE_BYTES = 32 << 20  # one image file (or an HF dataset's encoded image)
MAX_IMAGE_PIXELS = 64_000_000  # width x height: a larger header is a decompression bomb, refused
# Processor outputs that run along the sequence (one value per token; padded like input_ids, 0 = text)
SEQUENCE_KEYS = ("token_type_ids", "mm_token_type_ids")
# Processor outputs per image (concatenated over the rows of a batch, in row order)
IMAGE_KEYS = ("pixel_values", "image_grid_thw", "image_sizes", "pixel_attention_mask")
MEDIA_KEYS = SEQUENCE_KEYS + IMAGE_KEYS
TEXT_TARGET = "images for a text-only target"
IMAGE_PAST_MAX_LENGTH = "image tokens past data.max_length"


def _fail(source: str, what: str, why: str) -> UserError:
    return UserError(f"{source}: image {what}: {why}; fix the row (image paths are read relative to its data file) "
                     "or remove it")


def resolve(ref: str, source: str, data_file: str | None) -> Path:
    """An image path of a row: absolute, or relative to the data file's folder; never a URL (nothing is downloaded)."""
    if "://" in ref:
        raise _fail(source, repr(ref[:200]), "a URL; draftsmith never downloads: give a local file")
    path = Path(ref).expanduser()
    if not path.is_absolute():
        base = Path(data_file) if data_file else None
        if base is None or not base.is_file():
            raise _fail(source, repr(ref[:200]), "a relative path in a row that does not come from a local file; "
                        "give an absolute path")
        path = base.parent / path
    if not path.exists():
        raise _fail(source, str(path), "no such file")
    return path


def _decode(data: bytes, source: str, what: str):
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise _fail(source, what, f"{img.width} x {img.height} pixels, more than {MAX_IMAGE_PIXELS:,}")
            return img.convert("RGB")  # decodes every pixel: a truncated file fails here
    except UserError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise _fail(source, what, f"not a readable image ({' '.join(str(exc).split())[:160]})") from None


def load_image(ref, source: str, data_file: str | None = None):
    """An image reference of a row -> an RGB PIL image: a path (str), an image object (an HF dataset's
    decoded Image column), or {"bytes": ..., "path": ...} (its undecoded form)."""
    from PIL import Image

    if isinstance(ref, Image.Image):
        if ref.width * ref.height > MAX_IMAGE_PIXELS:
            raise _fail(source, f"{ref.width} x {ref.height}", f"more than {MAX_IMAGE_PIXELS:,} pixels")
        return ref.convert("RGB")
    if isinstance(ref, dict) and isinstance(ref.get("bytes"), (bytes, bytearray)):
        if len(ref["bytes"]) > MAX_IMAGE_BYTES:
            raise _fail(source, "bytes", f"{len(ref['bytes']):,} bytes, more than {MAX_IMAGE_BYTES:,}")
        return _decode(bytes(ref["bytes"]), source, str(ref.get("path") or "bytes"))
    if isinstance(ref, dict) and isinstance(ref.get("path"), str):
        ref = ref["path"]
    if not isinstance(ref, str):
        raise _fail(source, type(ref).__name__, "not a path, an image or {\"bytes\"}")
    path = resolve(ref, source, data_file)
    try:
        data = read_received_bytes(path, "image file", MAX_IMAGE_BYTES)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    return _decode(data, source, str(path))


def expanded_mask(base_ids: list[int], base_mask: list[int], ids: list[int]) -> list[int]:
    """The mask of `base_ids` (the rendered text, tokenized) carried onto `ids` (the same text after the
    processor expanded its image placeholders): tokens that match keep their value, inserted ones get 0."""
    mask = [0] * len(ids)
    matcher = difflib.SequenceMatcher(None, base_ids, ids, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        mask[b:b + size] = base_mask[a:a + size]
    return mask


def _messages(row: formats.Row) -> list[dict]:
    """The conversation as a processor's chat template reads it: content parts, images as {"type": "image"}."""
    out = []
    for m in row.messages:
        parts = m.get("parts")
        content = [{"type": "image"} if p["type"] == "image" else p for p in parts] if parts else m["content"]
        out.append({"role": m["role"], "content": content})
    return out


def encode_image_row(row: formats.Row, processor, data_cfg) -> tuple[list[int], list[int], dict, bool]:
    """A chat row with images -> (input_ids, loss_mask, media, truncated); RowError for a row to skip."""
    if processor is None:
        raise formats.RowError(TEXT_TARGET, f"{len(row.images)} image(s) but the target has no processor "
                                            "(a text-only target, or a model directory without its processor files)")
    images = [load_image(ref, row.source, row.data_file) for ref in row.images]
    tokenizer = processor.tokenizer
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if not template:
        raise UserError(f"{row.source}: the target's processor has no chat template to place the images; add its "
                        "chat_template.json to the model directory")
    text, spans = chat.render_template(tokenizer, _messages(row), template=template)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    base_mask = chat.mask_from_offsets(enc["offset_mapping"], spans)
    try:
        out = processor(text=[text], images=[images], return_tensors="pt")
    except (ValueError, TypeError, RuntimeError) as exc:
        raise formats.RowError(formats.BAD_IMAGE, f"the processor refused the row: {' '.join(str(exc).split())[:200]}") from None
    ids = out["input_ids"][0].tolist()
    mask = expanded_mask(list(enc["input_ids"]), base_mask, ids)
    media = {k: v[0] if k in SEQUENCE_KEYS else v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
    image_token = torch.zeros(len(ids), dtype=torch.bool)
    for key in SEQUENCE_KEYS:
        if key in media:
            image_token |= media[key] != 0
    mask = [0 if flag else m for m, flag in zip(mask, image_token.tolist())]
    truncated = len(ids) > data_cfg.max_length
    if truncated:
        if image_token[data_cfg.max_length:].any():
            raise formats.RowError(IMAGE_PAST_MAX_LENGTH, f"{len(ids)} tokens with the images, max_length "
                                                          f"{data_cfg.max_length}; raise data.max_length")
        ids, mask = ids[:data_cfg.max_length], mask[:data_cfg.max_length]
        media.update({k: media[k][:data_cfg.max_length] for k in SEQUENCE_KEYS if k in media})
    mask[0] = 0
    if sum(mask) == 0:
        raise formats.RowError(chat.EMPTY_AFTER_TRUNCATION, f"{len(ids)} tokens, max_length {data_cfg.max_length}")
    return ids, mask, media, truncated


def made_image(seed: int = 0, size: tuple[int, int] = (40, 32)):
    """A small RGB image made in code (tests, and eval's `images` workload): a seeded colour gradient with a
    bright square, as a PIL image of size (height, width)."""
    import numpy as np
    from PIL import Image

    g = np.random.default_rng(seed)
    h, w = size
    base = np.linspace(0, 255, w)[None, :, None] * g.uniform(0.2, 1.0, 3)[None, None, :]
    pixels = np.broadcast_to(base, (h, w, 3)).copy()
    y, x = int(g.integers(0, h // 2)), int(g.integers(0, w // 2))
    pixels[y:y + h // 3, x:x + w // 3] = g.uniform(128, 255, 3)
    return Image.fromarray(pixels.astype("uint8"), "RGB")
