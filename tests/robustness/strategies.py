"""Hypothesis strategies for what a user types and what others send: bad values, damaged YAML,
JSON, safetensors and tokenizer files. Each damage strategy draws a `Damage`: a function that
changes one file in a sandbox, with a label for the report and the names (file, key) an error
about it must mention."""
from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path
from typing import Callable

import yaml
from hypothesis import strategies as st


@dataclasses.dataclass
class Damage:
    label: str
    apply: Callable[[Path], None]  # (sandbox root) -> None
    names: list[str]
    value: object = None  # the bad value written, when there is one (for filters)


# --------------------------------------------------------------------------- values

SPECIAL_VALUES = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e-320, 0, -1, -1000, 10**6, 10**12,
                  2**63, "", "x", "nan", "1e999", True, False, None, [], {}, [3, 1, 2], [1, 1, 2], [1, 3], [-1],
                  [10**9], "../outside", "/dev/zero", "\x1b]0;pwned\x07", "é" * 3, {"a": {"b": [1]}}]

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=24))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
bad_values = st.one_of(st.sampled_from(SPECIAL_VALUES), json_values)
# integers a flag may get: around the edges, and huge
flag_ints = st.one_of(st.sampled_from([0, -1, -3, 1, 2, 10**5, 10**8, 2**31, -(2**31)]), st.integers(-50, 50))
flag_floats = st.sampled_from(["nan", "inf", "-inf", "-0.5", "0", "1e308", "-1e308", "1.5", "2", "1e-30"])
flag_texts = st.one_of(st.sampled_from(["", ",", ",,", " ", "-1", "0", "1,,2", "a,b", "x" * 300, "1e9", "nan",
                                        "\x1b[31mred", "../x", "/dev/null"]), st.text(max_size=12))


def yaml_text(value) -> str:
    """A value as an override's right-hand side (YAML), on one line."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


# --------------------------------------------------------------------------- bytes

def _write(path: Path, data: bytes | str) -> None:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))


@st.composite
def byte_damage(draw, relpath: str, text_only: bool = False) -> Damage:
    """Truncate, overwrite, splice garbage into, or empty one file. text_only: the file stays valid
    UTF-8 (a non-UTF-8 recipe is an issue-22 finding with its own test)."""
    ops = ["truncate", "garbage", "flip", "empty", "prefix"] + ([] if text_only else ["non_utf8"])
    op = draw(st.sampled_from(ops))
    cut = draw(st.floats(0, 1))
    junk = draw(st.text(min_size=1, max_size=64).map(str.encode) if text_only else st.binary(min_size=1, max_size=64))
    name = Path(relpath).name

    def apply(root: Path) -> None:
        path = root / relpath
        data = path.read_bytes()
        at = int(cut * len(data))
        if text_only:  # cut at a character boundary; a "flip" swaps in a different printable character
            at = len(data.decode()[:int(cut * len(data.decode()))].encode())
        flipped = bytes([data[at] ^ (0x01 if text_only else 0xFF)]) if at < len(data) else junk
        new = {"truncate": data[:at], "garbage": junk, "empty": b"", "prefix": junk + data,
               "flip": data[:at] + flipped + data[at + 1:], "non_utf8": data[:at] + b"\xff\xfe\xc3(" + data[at:]}[op]
        path.write_bytes(new)

    return Damage(f"{relpath}: {op} at {cut:.2f} ({junk[:8]!r})", apply, [name])


# --------------------------------------------------------------------------- YAML

def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs document of issue 22 (about 450 bytes at 9 x 9): top-level keys a0..a8."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def alias_bomb_value(levels: int = 9, width: int = 9) -> str:
    """The same bomb as one flow value (a list whose last item expands to width**(levels-1) items)."""
    items = ['&a0 ["lol"]'] + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


YAML_DOCUMENT_KINDS = ["list", "scalar", "tabs", "deep_list", "deep_map", "duplicate_key", "bomb_value",
                       "bomb_document", "binary_tag", "python_tag", "huge_int"]


def yaml_document_damage(relpath: str, kind: str, depth: int = 100_000) -> Damage:
    """Whole-document damage of a YAML file: bombs, deep nesting, duplicate keys, a list, tabs."""
    def apply(root: Path) -> None:
        path = root / relpath
        text = path.read_text()
        new = {"list": "- 1\n- 2\n", "scalar": "42\n", "tabs": text.replace("  ", "\t"),
               "deep_list": "x: " + "[" * depth + "]" * depth + "\n" + text,
               "deep_map": "x: " + "{a: " * depth + "1" + "}" * depth + "\n" + text,
               "duplicate_key": text + "train:\n  lr: 0.5\n",
               "bomb_value": "name: " + alias_bomb_value() + "\n" + text,
               "bomb_document": alias_bomb(),
               "binary_tag": text + "extra: !!binary AAAA\n",
               "python_tag": text + "extra: !!python/object/apply:os.system ['true']\n",
               "huge_int": text + "seed: " + "9" * 5000 + "\n"}[kind]
        _write(path, new)

    return Damage(f"{relpath}: {kind} (depth {depth})", apply, [Path(relpath).name])


def yaml_structure_damage(relpath: str, kinds: list[str] = YAML_DOCUMENT_KINDS) -> st.SearchStrategy[Damage]:
    return st.builds(lambda kind, depth: yaml_document_damage(relpath, kind, depth), st.sampled_from(kinds),
                     st.sampled_from([50, 5000, 100_000]))


def leaf_keys(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        keys.append(path)
        if isinstance(value, dict) and value:
            keys.extend(leaf_keys(value, path + "."))
    return keys


def set_key(data: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


@st.composite
def yaml_value_damage(draw, relpath: str, keys: list[str]) -> Damage:
    """One key of a YAML mapping set to a bad value (or deleted, or a typo added beside it)."""
    key = draw(st.sampled_from(keys))
    op = draw(st.sampled_from(["set", "set", "set", "delete", "typo"]))
    value = draw(bad_values)

    def apply(root: Path) -> None:
        path = root / relpath
        data = yaml.safe_load(path.read_text())
        if op == "set":
            set_key(data, key, value)
        elif op == "typo":
            set_key(data, key + "x", value)
        else:
            parent = data
            for part in key.split(".")[:-1]:
                parent = parent[part]
            parent.pop(key.split(".")[-1], None)
        path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))

    shown = f"{relpath}: {op} {key}" + (f" = {value!r}"[:120] if op != "delete" else "")
    return Damage(shown, apply, [Path(relpath).name, key + ("x" if op == "typo" else "")], None if op == "delete" else value)


# --------------------------------------------------------------------------- JSON

def json_paths(data, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            paths.extend(json_paths(value, prefix + (key,)))
    elif isinstance(data, list):
        for i, value in enumerate(data[:4]):
            paths.extend(json_paths(value, prefix + (i,)))
    return paths


@st.composite
def json_damage(draw, relpath: str, paths: list[tuple]) -> Damage:
    """One value of a JSON document replaced by a bad value, or deleted."""
    where = draw(st.sampled_from(paths))
    op = draw(st.sampled_from(["set", "set", "set", "delete"]))
    value = draw(bad_values)

    def apply(root: Path) -> None:
        path = root / relpath
        data = json.loads(path.read_text())
        node = data
        for part in where[:-1]:
            node = node[part]
        if op == "delete":
            node.pop(where[-1]) if isinstance(node, dict) else node.pop(where[-1])
        else:
            node[where[-1]] = value
        path.write_text(json.dumps(data, allow_nan=True))

    dotted = ".".join(map(str, where))
    return Damage(f"{relpath}: {op} {dotted}" + (f" = {value!r}"[:120] if op == "set" else ""), apply,
                  [Path(relpath).name, str(where[-1])], value if op == "set" else None)


CONTROL = ("\x1b", "\x07", "\x9b")


def has_control(value) -> bool:
    """True when a value (or anything inside it) holds a terminal control character."""
    return any(c in json.dumps(value, allow_nan=True, ensure_ascii=False) for c in CONTROL)


DEEP_JSON = ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000]


def whole_json_damage(relpath: str, deep: bool = True) -> st.SearchStrategy[Damage]:
    """The whole document replaced: another JSON type, deep nesting (unless deep=False: an issue-22
    finding with its own tests), NaN, a huge number."""
    name = Path(relpath).name
    docs = st.one_of(json_values.map(lambda v: json.dumps(v, allow_nan=True)),
                     st.sampled_from((DEEP_JSON if deep else []) + ["NaN", "1e999999", '"' + "x" * 10_000 + '"', "{", ""]))
    return st.builds(lambda doc: Damage(f"{relpath}: replaced by {doc[:60]!r}",
                                        lambda root: _write(root / relpath, doc), [name]), docs)


# --------------------------------------------------------------------------- safetensors

def read_safetensors_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write_safetensors(path: Path, header: dict, body: bytes) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


@st.composite
def safetensors_damage(draw, relpath: str, tensor_names: list[str], allow_non_finite: bool = True,
                       only: list[str] | None = None) -> Damage:
    """A tensor's header entry made wrong (shape, dtype, offsets), a bogus header length, or (when
    allow_non_finite) NaN / inf written into a tensor's values."""
    ops = ["shape_huge", "shape_negative", "shape_other", "dtype", "offsets_past_end", "offsets_swapped",
           "header_length", "drop_tensor", "extra_tensor"] + (["nan", "inf"] if allow_non_finite else [])
    op = draw(st.sampled_from(only or ops))
    tensor = draw(st.sampled_from(tensor_names))
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))

    def apply(root: Path) -> None:
        path = root / relpath
        header, body = read_safetensors_header(path)
        entry = header[tensor]
        start, end = entry["data_offsets"]
        if op in ("nan", "inf"):
            value = struct.pack("<f", math.nan if op == "nan" else math.inf)
            assert entry["dtype"] == "F32", entry
            body = body[:start] + value * ((end - start) // 4) + body[end:]
        elif op == "shape_huge":
            entry["shape"] = [10**9, 10**9]
        elif op == "shape_negative":
            entry["shape"] = [-1] + entry["shape"][1:]
        elif op == "shape_other":
            entry["shape"] = shape
        elif op == "dtype":
            entry["dtype"] = "F64" if entry["dtype"] != "F64" else "I8"
        elif op == "offsets_past_end":
            entry["data_offsets"] = [start, len(body) + 10**6]
        elif op == "offsets_swapped":
            entry["data_offsets"] = [end, start]
        elif op == "drop_tensor":
            header.pop(tensor)
        elif op == "extra_tensor":
            header["zz.unexpected"] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
        if op == "header_length":
            data = path.read_bytes()
            path.write_bytes(struct.pack("<Q", 2**62) + data[8:])
            return
        _write_safetensors(path, header, body)

    return Damage(f"{relpath}: {op} of {tensor} ({shape})", apply, [Path(relpath).name, tensor])


# --------------------------------------------------------------------------- chat templates

TEMPLATES = {
    "syntax_error": "{% for m in messages %}{{ m['content'] }",
    "raises": "{{ raise_exception('template refuses') }}",
    "undefined_filter": "{{ messages | nosuchfilter }}",
    "include": "{% include 'other.jinja' %}",
    "nested_loops": "{% for a in range(10000) %}{% for b in range(10000) %}{% for c in range(10000) %}x"
                    "{% endfor %}{% endfor %}{% endfor %}",
    "huge_output": "{{ 'x' * 10**9 }}",
    "attribute_escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "empty": "",
    "no_messages": "hello",
}


def template_damage(relpath: str) -> st.SearchStrategy[Damage]:
    """The target's chat template replaced by a broken or hostile one."""
    def make(kind: str) -> Damage:
        return Damage(f"{relpath}: chat template {kind}", lambda root: _write(root / relpath, TEMPLATES[kind]),
                      [Path(relpath).name, "chat template", "chat_template", "template"])

    return st.builds(make, st.sampled_from(sorted(TEMPLATES)))


# --------------------------------------------------------------------------- special files (issue 34)

SPECIAL_KINDS = ["fifo", "socket", "chardev", "link_to_dev_zero", "link_to_fifo"]


def _make_special(path: Path, kind: str) -> None:
    import os
    import socket
    import stat as stat_mod

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(path))
        except OSError:  # a path too long for AF_UNIX: a FIFO stands in
            os.mkfifo(path)
        finally:
            sock.close()
    elif kind == "chardev" and os.geteuid() == 0:
        os.mknod(path, 0o666 | stat_mod.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null's node, never /dev/null
    elif kind == "link_to_dev_zero":
        path.symlink_to("/dev/zero")
    else:  # link_to_fifo, or chardev without root
        os.mkfifo(path.with_name(path.name + ".fifo"))
        path.symlink_to(path.name + ".fifo")


def special_file(relpath: str, kind: str, names: list[str] | None = None) -> Damage:
    """`relpath` replaced by a device node (a copy of /dev/null's), FIFO, socket, or a link to /dev/zero or a FIFO."""
    return Damage(f"{relpath} is a {kind}", lambda root: _make_special(root / relpath, kind),
                  names or [Path(relpath).name])


# --------------------------------------------------------------------------- feature cache (issue 44, item 2)

MANIFEST_PATHS = [("format_version",), ("target_fingerprint",), ("layers",), ("layers", 0), ("dtype",),
                  ("features",), ("features", 0), ("rows",), ("shard_rows",), ("hidden_size",), ("tokens",),
                  ("loss_tokens",), ("complete",), ("shards",), ("shards", 0), ("shards", 0, "file"),
                  ("shards", 0, "start"), ("shards", 0, "end"), ("shards", 0, "tokens"), ("shards", 0, "size"),
                  ("shards", 0, "sha256"), ("shards", 1, "file"), ("shards", 1, "start")]
SHARD_DAMAGES = ["other_shard", "escape_relative", "escape_absolute", "range"]


def _shard_damage(cache: str, op: str) -> Damage:
    first, second = f"{cache}/shard_00000.safetensors", f"{cache}/shard_00001.safetensors"

    def apply(root: Path) -> None:
        manifest = root / cache / "manifest.json"
        data = json.loads(manifest.read_text())
        if op == "other_shard":
            (root / second).write_bytes((root / first).read_bytes())
        elif op == "range":
            data["shards"][0].update(start=-5, end=10**9)
        else:
            data["shards"][0]["file"] = "../../x.safetensors" if op == "escape_relative" else str(root / first)
        manifest.write_text(json.dumps(data))

    return Damage(f"{cache}: {op}", apply, ["manifest.json", "shard_00000.safetensors", "shard_00001.safetensors"])


def feature_cache_damage(cache: str) -> st.SearchStrategy[Damage]:
    """One damage to a feature cache at `cache`: a manifest value, the whole manifest, its bytes, a special
    file in its place; a shard's bytes, a special shard, another shard's bytes, a shard outside the cache."""
    manifest = f"{cache}/manifest.json"
    shard = st.sampled_from([f"{cache}/shard_00000.safetensors", f"{cache}/shard_00001.safetensors"])
    return st.one_of(json_damage(manifest, MANIFEST_PATHS), whole_json_damage(manifest), byte_damage(manifest),
                     st.sampled_from(SPECIAL_KINDS).map(lambda k: special_file(manifest, k)),
                     shard.flatmap(byte_damage),
                     st.tuples(shard, st.sampled_from(SPECIAL_KINDS)).map(lambda a: special_file(a[0], a[1])),
                     st.sampled_from(SHARD_DAMAGES).map(lambda op: _shard_damage(cache, op)))


# --------------------------------------------------------------------------- vLLM hidden-states files (issue 43)

VLLM_DAMAGES = ["fewer_layers", "narrower", "layer_order", "other_tokens", "zstd_bomb", "zstd_unsized", "zstd_garbage",
                "sidecar_fingerprint", "sidecar_layers"]


def _vllm_damage(folder: str, op: str, row: int) -> Damage:
    name = f"hs_{row}.safetensors"

    def apply(root: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        path = root / folder / name
        if op.startswith("zstd"):
            import zstandard

            raw = b"\0" * (8 << 20) if op == "zstd_bomb" else path.read_bytes()
            comp = zstandard.ZstdCompressor(write_content_size=op != "zstd_unsized").compress(raw)
            path.unlink()
            (root / folder / (name + ".zst")).write_bytes(b"junk" + comp if op == "zstd_garbage" else comp)
        elif op.startswith("sidecar"):
            side_path = root / folder / "draftsmith_vllm.json"
            side = json.loads(side_path.read_text())
            side.update(target_fingerprint="0" * 16) if op == "sidecar_fingerprint" else side.update(layer_ids=[0, 1])
            side_path.write_text(json.dumps(side))
        else:
            data = load_file(str(path))
            h = data["hidden_states"]
            data["hidden_states"] = {"fewer_layers": h[:, :2], "narrower": h[:, :, :16], "layer_order": h.flip(1),
                                     "other_tokens": h}[op].contiguous()
            if op == "other_tokens":
                data["token_ids"] = torch.flip(data["token_ids"], [0]).contiguous()
            save_file(data, str(path))

    return Damage(f"{folder}/{name}: {op}", apply, [name, name + ".zst", "draftsmith_vllm.json", "features.dir"])


def vllm_folder_damage(folder: str, rows: int) -> st.SearchStrategy[Damage]:
    """One damage to a folder of vLLM hidden-states files: its bytes, a special file in its place, fewer layers,
    a narrower hidden size, another layer order, other tokens, a zstd bomb, an unsized or garbled zstd frame, a
    sidecar naming another target or other layers."""
    row = st.integers(0, rows - 1)
    return st.one_of(row.flatmap(lambda r: byte_damage(f"{folder}/hs_{r}.safetensors")),
                     st.tuples(row, st.sampled_from(SPECIAL_KINDS)).map(
                         lambda a: special_file(f"{folder}/hs_{a[0]}.safetensors", a[1])),
                     st.tuples(st.sampled_from(VLLM_DAMAGES), row).map(lambda a: _vllm_damage(folder, a[0], a[1])))
