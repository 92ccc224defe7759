"""Image workloads for a vision-language target (docs/eval.md "Image prompts"):

    images          8 questions, each about one small image made in code (data/images.py made_image):
                    exercises the image path anywhere, no data needed (random-looking images: acceptance
                    on them says little about real photos)
    images:DIR      one prompt per image file in DIR (.png .jpg .jpeg .webp .bmp .gif, sorted by name; at
                    most --num-prompts), each asking the questions below in turn; the files are read
                    bounded (data/images.py load_image), never downloaded

An item is {"id", "prompt", "images": [path or image]}; `encode` runs the target's processor over the chat
template with the images before the question: (prompt ids with the image tokens expanded, the image tensors
the prefill takes). The speculative loop passes the image tensors to the prefill only (eval/loop.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.core.errors import UserError

QUESTIONS = ("Describe this image.", "What colour is the square?", "Where is the bright square?",
             "What is in the picture?")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")
GENERATED = 8  # prompts of the `images` workload


def generated(n: int | None = None) -> list[dict]:
    from draftsmith.data.images import made_image

    return [{"id": f"images-{i}", "prompt": QUESTIONS[i % len(QUESTIONS)], "images": [made_image(100 + i)]}
            for i in range(n or GENERATED)]


def check_folder(folder: Path) -> list[Path]:
    """The image files of an images:DIR workload (regular files with an image suffix, sorted)."""
    if not folder.is_dir():
        raise UserError(f"images:{folder}: no such folder; give a folder of image files ({', '.join(IMAGE_SUFFIXES)})")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise UserError(f"images:{folder}: no image files ({', '.join(IMAGE_SUFFIXES)}) in the folder")
    return files


def from_folder(folder: Path, n: int | None = None) -> list[dict]:
    files = check_folder(folder)[:n] if n else check_folder(folder)
    return [{"id": f"images-{p.name}", "prompt": QUESTIONS[i % len(QUESTIONS)], "images": [str(p.resolve())]}
            for i, p in enumerate(files)]


def encode(item: dict, target, max_tokens: int | None = None) -> tuple[torch.Tensor, bool, dict]:
    """An image item -> ([n] prompt ids, truncated (always False: an image prompt is never cut), media)."""
    from draftsmith.data import chat
    from draftsmith.data.formats import RowError
    from draftsmith.data.images import load_image

    processor = getattr(target, "processor", None)
    if processor is None:
        raise UserError(f"workload item {item['id']} has images, and target {target.name} has no processor (a text "
                        "target, or a model directory without its processor files); evaluate images on a "
                        "vision-language target")
    images = [load_image(ref, f"workload item {item['id']}") for ref in item["images"]]
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": item["prompt"]}]
    template = getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)
    try:
        text = chat.prompt_text(processor.tokenizer, [{"role": "user", "content": content}], "auto", template=template)
    except RowError as exc:
        raise UserError(f"the target's chat template cannot render an image prompt ({exc})") from None
    out = processor(text=[text], images=[images], return_tensors="pt")
    ids = out["input_ids"][0]
    if max_tokens is not None and len(ids) > max_tokens:
        raise UserError(f"workload item {item['id']}: {len(ids)} prompt tokens with its images, more than the "
                        f"{max_tokens} that leave room for --max-new-tokens; lower --max-new-tokens")
    return ids, False, {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
