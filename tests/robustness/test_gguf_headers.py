"""Robustness harness, issue 44: a received GGUF target's header, damaged at the byte level, through
`inspect` and `eval --target`. The GGUF is builtin:pycode-tiny written by draftsmith.testing.write_gguf
(a byte-level BPE tokenizer with merges; the world's byte tokenizer has none, so a GGUF of it is refused
whole); tests/gguf_damage.py rewrites single fields. test_the_intact_gguf_runs checks that the file
every case damages is itself accepted.

Generated: huge key counts (declared with or without the bytes, 4,097 to 2^40), every scalar key set to
0, 1, 3 or its type's largest value, float keys to NaN, inf, 0 or -1, general.alignment to any uint32,
a tensor's offset or a dimension past the file, the file cut anywhere, duplicate tokens. Each must be a
clean run or one line naming the file, within the CPU budget (the 50,000-key header took 50-90 s).

Generated inputs in CI: 16 through inspect, 10 through eval; fixed: the findings of items 3, 8, 13 and 16."""
from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import gguf_damage as G
from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.conftest import harness_settings
from tests.robustness.sandbox import Case

pytest.importorskip("gguf")

GGUF = "t.gguf"
QUICK = 30
EVAL = ["eval", "--proposer", "ngram", "--target", GGUF, *world.EVAL_FAST, "--out", "out/r.json"]


@pytest.fixture(scope="module")
def gguf_base(world_dir, tmp_path_factory) -> bytes:
    from draftsmith import testing
    from draftsmith.targets import load as target_mod

    path = tmp_path_factory.mktemp("harness-gguf") / GGUF
    testing.write_gguf(target_mod.load("builtin:pycode-tiny"), path)  # its BPE tokenizer has merges (the world's has none)
    return path.read_bytes()


def _declare_keys(data: bytes, count: int) -> bytes:
    return data[:16] + struct.pack("<Q", count) + data[24:]


def _scalar_keys(data: bytes) -> dict[str, tuple[int, int]]:
    """key -> (value type, offset of the value) for the scalar keys of an intact header."""
    out = {}
    for key, at in G.layout(data)["keys"].items():
        kind = struct.unpack_from("<I", data, at)[0]
        if kind in (4, 5, 6, 10, 12):
            out[key] = (kind, at + 4)
    return out


_FORMATS = {4: "<I", 5: "<i", 6: "<f", 10: "<Q", 12: "<d"}
_EDGES = {4: [0, 1, 3, 2**32 - 1], 5: [0, -1, 2**31 - 1], 10: [0, 1, 2**64 - 1], 6: [math.nan, math.inf, 0.0, -1.0],
          12: [math.nan, -math.inf, 0.0]}


@st.composite
def gguf_damage(draw, base_holder: list) -> S.Damage:
    data = base_holder[0]
    op = draw(st.sampled_from(["declare_keys", "insert_keys", "scalar", "alignment", "offset", "dim", "cut",
                               "duplicate_token"]))
    if op == "declare_keys":
        count = draw(st.sampled_from([4097, 50_000, 10**6, 2**40]))
        new, label = _declare_keys(data, count), f"declares {count:,} keys"
    elif op == "insert_keys":
        count = draw(st.sampled_from([4097, 50_000]))
        new, label = G.insert_keys(data, count), f"{count:,} real extra keys"
    elif op == "scalar":
        keys = _scalar_keys(data)
        key = draw(st.sampled_from(sorted(keys)))
        kind, at = keys[key]
        value = draw(st.sampled_from(_EDGES[kind]))
        fmt = _FORMATS[kind]
        new, label = data[:at] + struct.pack(fmt, value) + data[at + struct.calcsize(fmt):], f"{key} = {value}"
    elif op == "alignment":
        value = draw(st.sampled_from([0, 1, 3, 64, 2**31, 2**32 - 1]))
        new, label = G.add_key(data, "general.alignment", 4, struct.pack("<I", value)), f"general.alignment {value}"
    elif op in ("offset", "dim"):
        index = draw(st.integers(0, len(G.layout(data)["tensors"]) - 1))
        value = draw(st.sampled_from([1, 2**20, 2**40, 2**63, 2**64 - 1]))
        new = G.set_tensor_offset(data, index, value) if op == "offset" else G.set_tensor_dim(data, index, 0, value)
        label = f"tensor {index} {op} {value}"
    elif op == "cut":
        at = draw(st.integers(0, len(data) - 1))
        new, label = data[:at], f"cut at {at:,} of {len(data):,} bytes"
    else:
        new, label = G.duplicate_token(data), "duplicate tokens"
    return S.Damage(f"{GGUF}: {label}", lambda root: (root / GGUF).write_bytes(new), [GGUF])


class _Holder(list):
    """The intact GGUF's bytes, shown as a short name in hypothesis's report (not 3.5 MB of bytes)."""

    def __repr__(self) -> str:
        return "<the intact GGUF>"


_BASE = _Holder()


@pytest.fixture
def base_holder(gguf_base):
    _BASE[:] = [gguf_base]
    return _BASE


@harness_settings(16)
@given(data=st.data())
def test_inspect_damaged_gguf_header(check, base_holder, data):
    damage = data.draw(gguf_damage(base_holder))
    check(Case(["inspect", GGUF], names=damage.names, named_at=(1, 2), seconds=QUICK, label=damage.label), [damage])


@harness_settings(10)
@given(data=st.data())
def test_eval_damaged_gguf_header(check, base_holder, data):
    damage = data.draw(gguf_damage(base_holder))
    # a declared context_length of 1 is refused as "--k 2: the target has 1 positions": a flag and the file agree
    check(Case(EVAL, names=damage.names + ["--k", "positions"], outputs=["out"], seconds=60, label=damage.label),
          [damage])


KNOWN = {
    "50,000 keys": lambda d: G.insert_keys(d, 50_000),
    "head_count 0": lambda d: G.set_scalar(d, "llama.attention.head_count", "<I", 0),
    "alignment 0": lambda d: G.add_key(d, "general.alignment", 4, struct.pack("<I", 0)),
    "alignment 3": lambda d: G.add_key(d, "general.alignment", 4, struct.pack("<I", 3)),
    "offset past the file": lambda d: G.set_tensor_offset(d, 1, 2**40),
    "shape past the file": lambda d: G.set_tensor_dim(d, 1, 0, 2**20),
    "duplicate tokens": G.duplicate_token,
    "rope.freq_base nan": lambda d: G.set_scalar(d, "llama.rope.freq_base", "<f", math.nan),
    "truncated tensor data": lambda d: d[:-100],
    "vocab_size 3": lambda d: G.set_scalar(d, "llama.vocab_size", "<I", 3),
    "a tensor renamed": lambda d: d.replace(b"blk.0.attn_q.weight", b"blk.0.attn_x.weight", 1),
}


def test_the_intact_gguf_runs(check, gguf_base):
    intact = S.Damage(f"{GGUF}: intact", lambda root: (root / GGUF).write_bytes(gguf_base), [GGUF])
    assert check(Case(["inspect", GGUF], names=[GGUF], seconds=60), [intact]).code == 0
    assert check(Case(EVAL, names=[GGUF], outputs=["out"], seconds=60), [intact]).code == 0


@pytest.mark.parametrize("name", list(KNOWN))
def test_known_gguf_findings(check, gguf_base, name):
    new = KNOWN[name](gguf_base)
    damage = S.Damage(f"{GGUF}: {name}", lambda root: (root / GGUF).write_bytes(new), [GGUF])
    check(Case(["inspect", GGUF], names=[GGUF], named_at=(1, 2), seconds=QUICK,
               expect_error=name != "a tensor renamed"), [damage])  # inspect reads no tensor data
    out = check(Case(EVAL, names=[GGUF], outputs=["out"], seconds=QUICK, expect_error=True), [damage])
    assert out.code == 2  # never a result, "lossless" or not


@pytest.mark.parametrize("kind", S.SPECIAL_KINDS)
def test_gguf_target_special_file(check, kind):
    out = check(Case(EVAL, names=[GGUF], outputs=["out"], seconds=QUICK, expect_error=True),
                [S.special_file(GGUF, kind)])
    assert "not a regular file" in out.stderr or kind == "link_to_dev_zero"  # (a link to /dev/zero is one too)


@pytest.mark.parametrize("kind", ["fifo", "chardev", "link_to_fifo"])
def test_export_target_gguf_special_file(check, kind):
    """`export --to llama.cpp --target-gguf F` with F a FIFO or device: one line saying what it is."""
    argv = ["export", world.CHECKPOINT, "--to", "llama.cpp", "--out", "exp", "--target-gguf", GGUF]
    out = check(Case(argv, names=["--target-gguf"], outputs=["exp"], seconds=QUICK, expect_error=True),
                [S.special_file(GGUF, kind, ["--target-gguf"])])
    assert "not a regular file" in out.stderr
