"""A received GGUF target's header (targets/gguf_header.py, targets/declared.check_gguf), issue 44 items
3, 8, 13, 16 and 18: 50,000 metadata keys are refused in seconds (transformers' reader is quadratic in
them); head count 0, general.alignment 0 or 3, a tensor offset or shape past the file, a truncated file,
duplicate tokens and a NaN rope.freq_base are one line naming the file in `inspect` and `eval` (were a
ZeroDivisionError, numpy reshape errors, a BPE error, and an eval result marked lossless); the messages
say what is wrong (a string block_count, a missing block_count, a FIFO or directory target)."""
from __future__ import annotations

import json
import os
import struct
import time

import pytest

from draftsmith import testing
from draftsmith.cli import main as cli_main
from draftsmith.core.errors import UserError
from draftsmith.targets import gguf_header
from draftsmith.targets import load as target_mod
from tests import gguf_damage as G

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("gguf5") / "t.gguf"
    testing.write_gguf(target_mod.load("builtin:pycode-tiny"), out)
    return out.read_bytes()


DAMAGE = {
    "head_count 0": (lambda d: G.set_scalar(d, "llama.attention.head_count", "<I", 0),
                     "llama.attention.head_count is 0, not a whole number"),
    "head_count_kv 0": (lambda d: G.set_scalar(d, "llama.attention.head_count_kv", "<I", 0),
                        "llama.attention.head_count_kv is 0"),
    "alignment 0": (lambda d: G.add_key(d, "general.alignment", 4, struct.pack("<I", 0)),
                    "general.alignment 0 is not a power of two"),
    "alignment 3": (lambda d: G.add_key(d, "general.alignment", 4, struct.pack("<I", 3)),
                    "general.alignment 3 is not a power of two"),
    "offset past the file": (lambda d: G.set_tensor_offset(d, 3, 1 << 40), "ends past the file's"),
    "shape past the file": (lambda d: G.set_tensor_dim(d, 3, 0, 1 << 20), "ends past the file's"),
    "truncated tensor data": (lambda d: d[:len(d) - 1000], "ends past the file's"),
    "duplicate tokens": (G.duplicate_token, "tokenizer.ggml.tokens holds"),
    "rope.freq_base nan": (lambda d: G.set_scalar(d, "llama.rope.freq_base", "<f", float("nan")),
                           "llama.rope.freq_base is nan, not a finite number"),
    "50,000 keys": (lambda d: G.insert_keys(d, 50_000), "declares 50,020 metadata keys, more than the 4,096"),
    "string block_count": (lambda d: G.set_type_and_value(d, "llama.block_count", 8, struct.pack("<Q", 1) + b"4", 4),
                           "llama.block_count is the string '4', not a whole number of layers"),
    # metadata that disagrees with the tensors: transformers printed its load report, then a RuntimeError
    "vocab_size 3": (lambda d: G.set_scalar(d, "llama.vocab_size", "<I", 3),
                     "llama.vocab_size is 3 but its tensor token_embd.weight holds 1024"),
    "embedding_length 64": (lambda d: G.set_scalar(d, "llama.embedding_length", "<I", 64),
                            "llama.embedding_length is 64 but its tensor token_embd.weight holds 128"),
    # head_count 3 over 128 columns: shapes transformers builds differ from the file's (its load report, then
    # a RuntimeError)
    "head_count 8": (lambda d: G.set_scalar(d, "llama.attention.head_count", "<I", 8),
                     "its metadata declares shapes its tensors do not hold"),
    # a weight without a tensor would have started at random
    "a tensor renamed": (lambda d: d.replace(b"blk.0.attn_q.weight", b"blk.0.attn_x.weight", 1),
                         "of the model's weights have no tensor in the file"),
    # another architecture's keys are absent (a gpt2 file said "declares None layers")
    "no block_count": (lambda d: G.set_type_and_value(d, "general.architecture", 8, struct.pack("<Q", 5) + b"qwen2",
                                                      8 + 5),
                       "has no qwen2.block_count (the number of layers)"),
}


WEIGHTS_ONLY = {"a tensor renamed", "head_count 8"}


def _write(tmp_path, data: bytes):
    path = tmp_path / "t.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_gguf_is_one_line_naming_it_in_inspect_and_eval(gguf_bytes, tmp_path, capsys, name):
    damage, needle = DAMAGE[name]
    path = _write(tmp_path, damage(gguf_bytes))
    start = time.process_time()
    with pytest.raises(UserError, match="t.gguf: ") as caught:
        target_mod.load(str(path))
    assert needle in str(caught.value)
    if name not in WEIGHTS_ONLY:  # inspect builds no weights: these show only when the tensors are read
        assert cli_main(["inspect", str(path)]) in (1, 2)
        err = capsys.readouterr().err.strip()
        assert str(path) in err and needle in err and len(err.splitlines()) == 1, err
    assert cli_main(["eval", "--proposer", "ngram", "--target", str(path), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(path) in err and needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r.json").exists()  # no result (the NaN rope base was written as "lossless")
    assert time.process_time() - start < 30


def test_the_header_is_read_in_linear_time_and_the_key_bound_comes_first(gguf_bytes, tmp_path):
    """4,096 keys (the bound) read in well under a second; 50,000 are refused before any is walked."""
    path = _write(tmp_path, G.insert_keys(gguf_bytes, 4096 - 20))
    start = time.process_time()
    header = gguf_header.read(path)
    assert len(header.meta) == 4096 and time.process_time() - start < 2
    path = _write(tmp_path, G.insert_keys(gguf_bytes, 50_000))
    start = time.process_time()
    with pytest.raises(UserError, match="50,020 metadata keys"):
        gguf_header.read(path)
    assert time.process_time() - start < 0.5


def test_an_intact_header_locates_every_tensor(gguf_bytes, tmp_path):
    header = gguf_header.read(_write(tmp_path, gguf_bytes))
    assert header.data_start % 32 == 0 and len(header.tensors) == len(G.layout(gguf_bytes)["tensors"])
    last = max(header.tensors, key=lambda t: t.offset)
    assert header.data_start + last.offset + 4 * last.dims[0] * (last.dims[1] if len(last.dims) > 1 else 1) == \
        header.size  # float32 tensors fill the file exactly


def test_a_header_past_the_read_bound_says_so(gguf_bytes, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_header, "MAX_HEADER_BYTES", 4096)
    with pytest.raises(UserError, match="its header runs past"):
        gguf_header.read(_write(tmp_path, gguf_bytes))


def test_an_array_past_the_entry_bound_is_refused(gguf_bytes, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_header, "MAX_ARRAY_ENTRIES", 100)
    with pytest.raises(UserError, match="tokenizer.ggml.tokens' claims 1,024 entries, more than the 100 draftsmith reads"):
        gguf_header.read(_write(tmp_path, gguf_bytes))


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_gguf_target_that_is_not_a_regular_file_says_what_it_is(tmp_path, capsys, kind):
    path = tmp_path / "t.gguf"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    assert cli_main(["eval", "--proposer", "ngram", "--target", str(path), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a regular file" in err and "no such" not in err, err
    assert cli_main(["inspect", str(path)]) in (1, 2)
    assert "not a regular file" in capsys.readouterr().err


def test_eval_target_gguf_flag_that_is_a_fifo_says_so(tmp_path, capsys):
    fifo = tmp_path / "t.gguf"
    os.mkfifo(fifo)
    assert cli_main(["eval", str(tmp_path / "ckpt"), "--engine", "llama.cpp", "--target-gguf", str(fifo),
                     "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--target-gguf" in err and "not a regular file" in err and "no such" not in err, err


def test_a_gguf_config_error_names_the_gguf_not_a_config_json(tmp_path):
    err = target_mod.config_json_error(str(tmp_path), ValueError("bad value"), "t.gguf")
    assert str(tmp_path / "t.gguf") in str(err) and "config.json" not in str(err)


def test_config_json_layers_under_another_name(tmp_path):
    """gpt2's config.json says n_layer: its layers are compared under that name, not 'None layers'."""
    import torch
    from safetensors.torch import save_file

    from draftsmith.targets import declared

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    save_file({f"h.{i}.ln_1.weight": torch.ones(2) for i in range(2)}, str(tmp_path / "model.safetensors"))
    declared.check_checkpoint_layers(tmp_path)  # 2 declared, 2 held
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 9}))
    with pytest.raises(UserError, match="n_layer declares 9 layers but its tensors hold 2"):
        declared.check_checkpoint_layers(tmp_path)
