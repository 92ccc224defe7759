"""Issue 34 (trust, round 4), declared sizes: a config.json or GGUF declaring 100,000 layers over 4 real
ones is refused before any model is built, and a damaged GGUF header or tokenizer is one line naming
the file (no struct.error, KeyError 'scores', IndexError or RuntimeError)."""
from __future__ import annotations

import json
import shutil
import struct
import time

import pytest

from draftsmith import testing
from draftsmith.cli import main as cli_main
from draftsmith.core.errors import UserError
from draftsmith.targets import load as target_mod

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("gguf4") / "t.gguf"
    testing.write_gguf(target_mod.load("builtin:pycode-tiny"), out)
    return out.read_bytes()


def _key_value_at(data: bytes, key: str) -> int:
    """Offset of the value type (uint32) that follows `key` in a GGUF header."""
    raw = key.encode()
    return data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)


def _set_scalar(data: bytes, key: str, fmt: str, value) -> bytes:
    at = _key_value_at(data, key) + 4
    return data[:at] + struct.pack(fmt, value) + data[at + struct.calcsize(fmt):]


def _architecture(data: bytes, name: bytes) -> bytes:
    at = _key_value_at(data, "general.architecture") + 4 + 8
    return data[:at] + name + data[at + len(name):]


def _array_count(data: bytes, key: str, count: int) -> bytes:
    at = _key_value_at(data, key) + 4 + 4
    return data[:at] + struct.pack("<Q", count) + data[at + 8:]


def _rename_key(data: bytes, key: str, new: str) -> bytes:
    assert len(key) == len(new)
    return data.replace(key.encode(), new.encode(), 1)


DAMAGE = {
    "block_count 100000": (lambda d: _set_scalar(d, "llama.block_count", "<I", 100_000), "block_count declares 100000"),
    "truncated header": (lambda d: d[:2000], "more than the file holds"),
    "header cut short": (lambda d: d[:300], "does not fit its 300 bytes"),
    "tokens claim 2^40": (lambda d: _array_count(d, "tokenizer.ggml.tokens", 1 << 40), "claims 1,099,511,627,776 entries"),
    "no merges": (lambda d: _rename_key(d, "tokenizer.ggml.merges", "tokenizer.ggml.mergez"), "neither tokenizer.ggml.merges"),
    "eos out of range": (lambda d: _set_scalar(d, "tokenizer.ggml.eos_token_id", "<I", 10**6),
                         "eos_token_id 1000000 lies outside"),
    "wrong architecture": (lambda d: _architecture(d, b"xxxxx"), "general.architecture 'xxxxx'"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_gguf_is_one_line_naming_it(gguf_bytes, tmp_path, capsys, name):
    damage, needle = DAMAGE[name]
    path = tmp_path / "t.gguf"
    path.write_bytes(damage(gguf_bytes))
    start = time.monotonic()
    with pytest.raises(UserError, match="t.gguf: .*" + needle.replace("(", r"\(").replace("^", r"\^")):
        target_mod.load(str(path))
    assert cli_main(["inspect", str(path)]) in (1, 2)
    err = capsys.readouterr().err
    assert "t.gguf" in err and needle in err and len(err.strip().splitlines()) == 1, err
    assert time.monotonic() - start < 30


def test_an_empty_token_list_is_one_line(gguf_bytes, tmp_path):
    path = tmp_path / "t.gguf"
    data = _array_count(gguf_bytes, "tokenizer.ggml.tokens", 0)
    path.write_bytes(data)  # the token strings now read as the next keys: refused either way, naming the file
    with pytest.raises(UserError, match="t.gguf: "):
        target_mod.load(str(path))


def test_config_json_declaring_100000_layers_is_refused_before_building(tmp_path, capsys):
    target = target_mod.load("builtin:pycode-tiny")
    target.model.save_pretrained(tmp_path / "t")
    target.tokenizer.save_pretrained(tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    cfg["num_hidden_layers"] = 100_000
    (tmp_path / "t" / "config.json").write_text(json.dumps(cfg))
    start = time.monotonic()
    with pytest.raises(UserError, match="config.json: num_hidden_layers declares 100000 layers but its tensors hold"):
        target_mod.load(str(tmp_path / "t"))
    assert cli_main(["inspect", str(tmp_path / "t")]) == 1
    assert "num_hidden_layers declares 100000" in capsys.readouterr().err
    assert time.monotonic() - start < 20
    shutil.rmtree(tmp_path / "t")
