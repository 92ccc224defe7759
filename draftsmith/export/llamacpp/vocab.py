"""The draft GGUF takes the target GGUF's own tokenizer (draft LM exports on a GGUF target).

llama.cpp speculates with a draft model only when its vocabulary matches the target's
(common/speculative.cpp `common_speculative_are_compatible`: the same vocab type, add_bos / bos,
add_eos / eos, and token texts). A GGUF target such as Gemma-3-270M Q4_K_M carries its
SentencePiece vocabulary as `tokenizer.ggml.model = "llama"`; the tokenizer transformers rebuilds
from that file and saves with the draft is a tokenizer.json BPE model, which llama.cpp's converter
writes as `tokenizer.ggml.model = "gpt2"` with whichever pre-tokenizer its hash table matches. The
token ids are the same, the vocab type is not, and llama-server then drafts nothing. So the draft's
`tokenizer.*` metadata is replaced by the target file's (the ids the draft was trained on are the
target's ids), through the gguf package's reader and writer; tensors and every other key are copied
unchanged. One tokenizer key belongs to the draft's graph, not to the vocabulary, and stays the draft's:
`tokenizer.ggml.mask_token_id`, the placeholder a block drafter (DFlash, DSpark) was trained with. A target
file may have none (SmolLM2's Q4_1 has none), and without it llama.cpp's draft-dflash reads mask -1 and aborts
("get_sub_batch: failed to add embedding").
"""
from __future__ import annotations

import os
from pathlib import Path

TOKENIZER_PREFIX = "tokenizer."
DRAFT_OWN_KEYS = ("tokenizer.ggml.mask_token_id",)  # the draft graph's, kept whatever the target file says


def _fields(reader) -> dict:
    """{key: (value, types)} of a GGUF file's metadata, without the header's own GGUF.* fields."""
    return {key: (field.contents(), field.types) for key, field in reader.fields.items()
            if not key.startswith("GGUF.")}


def tokenizer_fields(path: Path) -> dict:
    """{key: value} of the tokenizer.* metadata of a GGUF file."""
    import gguf

    return {k: v for k, (v, _) in _fields(gguf.GGUFReader(str(path))).items() if k.startswith(TOKENIZER_PREFIX)}


def adopt_vocabulary(draft: Path, target: Path) -> bool:
    """Rewrite `draft` (in place, atomically) with `target`'s tokenizer.* metadata. False when they
    already agree (nothing written)."""
    import gguf

    draft, target = Path(draft), Path(target)
    reader = gguf.GGUFReader(str(draft))
    own = _fields(reader)
    theirs = {k: kv for k, kv in _fields(gguf.GGUFReader(str(target))).items()
              if k.startswith(TOKENIZER_PREFIX) and k not in DRAFT_OWN_KEYS}
    theirs.update({k: own[k] for k in DRAFT_OWN_KEYS if k in own})
    if {k: v for k, (v, _) in own.items() if k.startswith(TOKENIZER_PREFIX)} == {k: v for k, (v, _) in theirs.items()}:
        return False
    arch = own["general.architecture"][0]
    tmp = draft.with_name(f".{draft.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        kept = {k: kv for k, kv in own.items() if not k.startswith(TOKENIZER_PREFIX) and k != "general.architecture"}
        for key, (value, types) in {**kept, **theirs}.items():
            sub_type = types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, value, types[0], sub_type=sub_type)
        for tensor in reader.tensors:  # the stored data and type (quantized: bytes; the writer reads their shape)
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        del reader  # its memory map of `draft`
        tmp.replace(draft)
    finally:
        tmp.unlink(missing_ok=True)
    return True
