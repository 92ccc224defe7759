"""A draft LM exported for llama.cpp on a GGUF target takes the target file's tokenizer metadata
(llama.cpp refuses to speculate across vocab types: a Gemma-3 Q4_K_M target is SentencePiece,
"llama", while the converter writes the draft's rebuilt tokenizer.json as "gpt2"); tensors and the
other keys are kept byte for byte."""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from draftsmith.export.llamacpp.vocab import adopt_vocabulary, tokenizer_fields  # noqa: E402


def write(path, model: str, pre: str, tokens: list[str], tensors: dict, extra: dict | None = None):
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(1)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_bos_token_id(2)
    for key, value in (extra or {}).items():
        w.add_uint32(key, value)
    for name, t in tensors.items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_draft_takes_the_target_tokenizer_and_keeps_its_tensors(tmp_path):
    tokens = ["<pad>", "<eos>", "<bos>", "▁a", "b"]
    weight = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    norm = np.linspace(-1, 1, 4).astype(np.float32)
    draft, target = tmp_path / "draft.gguf", tmp_path / "target.gguf"
    write(draft, "gpt2", "granite-embed-multi-311m", tokens, {"token_embd.weight": weight, "output_norm.weight": norm},
          {"gemma3.context_length": 512})
    write(target, "llama", "default", tokens, {"token_embd.weight": np.zeros((5, 4), np.float32)})
    assert tokenizer_fields(draft)["tokenizer.ggml.model"] == "gpt2"

    assert adopt_vocabulary(draft, target) is True
    assert tokenizer_fields(draft) == tokenizer_fields(target)
    r = gguf.GGUFReader(str(draft))
    assert r.fields["general.architecture"].contents() == "gemma3"
    assert r.fields["gemma3.context_length"].contents() == 512 and r.fields["gemma3.block_count"].contents() == 1
    got = {t.name: np.array(t.data) for t in r.tensors}
    np.testing.assert_array_equal(got["token_embd.weight"], weight)  # the draft's, not the target's zeros
    np.testing.assert_array_equal(got["output_norm.weight"], norm)
    assert not list(tmp_path.glob(".draft.gguf.tmp-*"))
    assert adopt_vocabulary(draft, target) is False  # already the same: nothing rewritten


def test_a_block_drafters_mask_token_stays_the_drafts(tmp_path):
    """tokenizer.ggml.mask_token_id is the block drafter's trained placeholder, not vocabulary: a target file
    without one (SmolLM2's Q4_1) must not erase it (llama.cpp's draft-dflash aborts on mask -1)."""
    tokens = ["<unk>", "<s>", "</s>", "a", "b"]
    w = np.zeros((5, 4), np.float32)
    draft, target = tmp_path / "draft.gguf", tmp_path / "target.gguf"
    write(draft, "gpt2", "smollm", tokens, {"fc.weight": w}, {"tokenizer.ggml.mask_token_id": 2})
    write(target, "gpt2", "smollm", tokens, {"token_embd.weight": w}, {"tokenizer.ggml.padding_token_id": 2})
    assert adopt_vocabulary(draft, target) is True
    got = tokenizer_fields(draft)
    assert got["tokenizer.ggml.mask_token_id"] == 2 and got["tokenizer.ggml.padding_token_id"] == 2
    assert {k: v for k, v in got.items() if k != "tokenizer.ggml.mask_token_id"} == tokenizer_fields(target)
    assert adopt_vocabulary(draft, target) is False


def test_a_gguf_target_is_served_from_its_own_file(tmp_path):
    """Before issue 20's Gemma export, every GGUF target was refused ("needs the target as a local
    directory"): the export now serves the target's own GGUF and converts only an HF directory."""
    from types import SimpleNamespace

    from draftsmith.export.llamacpp.layouts import served_target

    own = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    gguf_target = SimpleNamespace(target=SimpleNamespace(gguf_file=str(own)))
    hf_target = SimpleNamespace(target=SimpleNamespace(gguf_file=None))
    given = tmp_path / "other.gguf"
    assert served_target(gguf_target, None) == own.resolve()
    assert served_target(gguf_target, given) == given  # --target-gguf wins
    assert served_target(hf_target, None) is None  # converted from the HF directory, as before
