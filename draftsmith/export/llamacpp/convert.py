"""Run llama.cpp's own convert_hf_to_gguf.py, unchanged, with one fallback for small byte-level BPE
tokenizers that its pre-tokenizer table does not list (draftsmith's embedded pycode-tiny):

    python -m draftsmith.export.llamacpp.convert CONVERTER.py MODEL_DIR --outfile F.gguf --outtype f32 \
        [--target-model-dir TARGET]

The converter names a BPE pre-tokenizer by hashing the token ids a reference text encodes to,
so a model trained with its own vocabulary is unknown to it and the conversion stops
("BPE pre-tokenizer was not recognized"). When that happens and the model's tokenizer.json
pre-tokenizer is exactly GPT-2's (a ByteLevel pre-tokenizer with use_regex and no other split),
the name is "gpt-2", the pre-tokenizer llama.cpp implements with that same regex
(src/llama-vocab.cpp: "gpt-2" -> LLAMA_VOCAB_PRE_TYPE_GPT2). Any other
unknown tokenizer still fails as the converter would. Everything else (tensors, metadata, the
GGUF writer) is the converter's.
"""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def gpt2_byte_level(tokenizer_json: Path) -> bool:
    """True when tokenizer.json splits text exactly as GPT-2 does (ByteLevel, use_regex, alone)."""
    try:
        data = json.loads(tokenizer_json.read_text())
    except (OSError, ValueError):
        return False
    pre = data.get("pre_tokenizer") or {}
    if pre.get("type") == "Sequence" and len(pre.get("pretokenizers") or []) == 1:
        pre = pre["pretokenizers"][0]
    return (data.get("model", {}).get("type") == "BPE" and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) is True and not data.get("normalizer"))


def install_fallback() -> None:
    import importlib

    # the converter's own package `conversion/` beside convert_hf_to_gguf.py (put on sys.path by main),
    # not a distribution on PyPI: imported by name so that it is not mistaken for a dependency
    TextModel = importlib.import_module("conversion.base").TextModel
    original = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if gpt2_byte_level(Path(self.dir_model) / "tokenizer.json"):
                print(f"[draftsmith] {self.dir_model}: unlisted byte-level BPE vocabulary with GPT-2's "
                      "pre-tokenizer: tokenizer.ggml.pre = gpt-2", file=sys.stderr)
                return "gpt-2"
            raise

    TextModel.get_vocab_base_pre = get_vocab_base_pre


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m draftsmith.export.llamacpp.convert CONVERTER.py MODEL_DIR [converter args]")
    converter = Path(argv[0]).resolve()
    sys.path.insert(0, str(converter.parent))  # conversion/ beside the script
    sys.path.insert(1, str(converter.parent / "gguf-py"))  # what the script itself does unless NO_LOCAL_GGUF
    install_fallback()
    sys.argv = [str(converter), *argv[1:]]
    runpy.run_path(str(converter), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
