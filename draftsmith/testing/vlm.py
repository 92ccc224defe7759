"""Tiny vision-language targets built in code, with a real processor (image processor + tokenizer + chat
template), and tiny images generated in code: for tests of the image data path (no download).

    target = vlm.vlm_target("qwen2.5-vl")     # Target with .processor; archs.TINY's config, random weights
    vlm.save(target, directory)               # a model directory `targets.load` reads (model + processor)
    image = vlm.tiny_image(seed=3)            # a PIL image

The tokenizer is the byte tokenizer of draftsmith.testing (ids 0-2 specials, 3..258 bytes) padded to id 289,
with the image tokens at ids 290-293 (archs.VISION_TOKENS). Random weights: shapes and exactness only.
"""
from __future__ import annotations

import torch

from draftsmith.targets.load import Target

VOCAB = 300
# name -> (tokens at ids 290, 291, 292, 293; the tokenizer attributes the processor reads)
TOKENS = {
    "gemma3-vl": (["<image_soft_token>", "<video>", "<start_of_image>", "<end_of_image>"],
                  {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}),
    "qwen": (["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"],
             {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
              "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}),
}
# What an image part of a message renders as in the chat template (the processor expands it).
IMAGE_PLACEHOLDER = {"gemma3-vl": "<start_of_image>", "qwen": "<|vision_start|><|image_pad|><|vision_end|>"}
IMAGE_SIZE = 56  # pixels: Gemma-3's tiny SigLIP image, and a 4 x 4 patch grid (4 merged tokens) for Qwen


def chat_template(placeholder: str) -> str:
    """The byte tokenizer's tiny template (testing.TINY_CHAT_TEMPLATE) with content parts: text, and image."""
    return ("{% for m in messages %}<s>{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}" + placeholder +
            "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant: {% endif %}")


def _family(name: str) -> str:
    return "gemma3-vl" if name == "gemma3-vl" else "qwen"


def vlm_tokenizer(name: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names, attributes = TOKENS[_family(name)]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>"] + sorted(alphabet))}
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), 290)})
    vocab.update({tok: 290 + j for j, tok in enumerate(names)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<s>", "</s>", *names]])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   extra_special_tokens=attributes)
    fast.chat_template = chat_template(IMAGE_PLACEHOLDER[_family(name)])
    return fast


def vlm_config(name: str):
    """archs.TINY's config of `name` with the vocabulary and image token ids of vlm_tokenizer."""
    from draftsmith.targets.archs import TINY

    config = TINY[name][1]()
    if name == "gemma3-vl":
        config.text_config.vocab_size = VOCAB
        config.image_token_id, config.boi_token_id, config.eoi_token_id = 290, 292, 293
        config.image_token_index, config.boi_token_index, config.eoi_token_index = 290, 292, 293
        config.vision_config.image_size = IMAGE_SIZE
    return config


def processor_for(name: str, config):
    tokenizer = vlm_tokenizer(name)
    template = chat_template(IMAGE_PLACEHOLDER[_family(name)])
    size = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    if name == "gemma3-vl":
        from transformers import Gemma3ImageProcessorPil, Gemma3Processor

        return Gemma3Processor(Gemma3ImageProcessorPil(size=size), tokenizer, chat_template=template,
                               image_seq_length=config.mm_tokens_per_image)
    from transformers import Qwen2VLImageProcessorPil

    pixels = IMAGE_SIZE * IMAGE_SIZE
    vision = config.vision_config
    images = Qwen2VLImageProcessorPil(size={"shortest_edge": pixels, "longest_edge": pixels},
                                      patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                      temporal_patch_size=vision.temporal_patch_size)
    if name == "qwen2.5-vl":
        from transformers import Qwen2_5_VLProcessor as Processor
    else:
        from transformers import Qwen3VLProcessor as Processor

    class ImagesOnly(Processor):
        """Its video processor needs torchvision (not installed here): built without one (images only)."""

        def check_argument_for_proper_class(self, argument_name, argument):
            return None if argument is None else super().check_argument_for_proper_class(argument_name, argument)

    return ImagesOnly(image_processor=images, tokenizer=tokenizer, chat_template=template)


def vlm_target(name: str = "gemma3-vl", seed: int = 0) -> Target:
    """A seeded random-weight vision-language target (gemma3-vl, qwen2.5-vl or qwen3-vl) with its processor."""
    from transformers import AutoModelForImageTextToText

    config = vlm_config(name)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # transformers starts Gemma-3's image projection at zero: every image would look alike
        for param_name, p in model.named_parameters():
            if "projector" in param_name and p.dim() > 1 and not p.any():
                p.normal_(0.0, p.shape[0] ** -0.5)
    processor = processor_for(name, config)
    return Target(model, processor.tokenizer, name=f"tiny-{name}-seed{seed}", processor=processor)


def save(target: Target, directory) -> None:
    """Write the model and its processor where `targets.load` reads them."""
    target.model.save_pretrained(directory)
    target.processor.save_pretrained(directory)


def count_images(target) -> list[int]:
    """A counter on the target's vision tower: one entry per call, that call's number of images."""
    calls: list[int] = []
    inner = target.model.model
    tower = getattr(inner, "vision_tower", None) or inner.visual

    def hook(_module, args, kwargs, _out):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)  # Qwen-VL: one row per image
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        calls.append(int(grid.shape[0]) if grid is not None else int(pixels.shape[0]))

    tower.register_forward_hook(hook, with_kwargs=True)
    return calls


def tiny_image(seed: int = 0, size: tuple[int, int] = (40, 32)):
    """A small RGB image made in code (data/images.py made_image)."""
    from draftsmith.data.images import made_image

    return made_image(seed, size)
