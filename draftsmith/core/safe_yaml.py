"""YAML from files others wrote (recipes, overrides, a received checkpoint's config.yaml), read with
bounds: aliases may not expand a document past MAX_NODES nodes (a 500-byte "billion laughs" file
otherwise expands to hundreds of millions of values), nesting may not pass MAX_DEPTH levels (the
composer is recursive), and a key given twice in one mapping is an error naming the key and line
(PyYAML keeps the last one silently).

    raw = safe_yaml.load(text, "recipes/x.yaml")     # raises YAMLBoundError (a ValueError) naming the source
"""
from __future__ import annotations

import reprlib

import yaml

from draftsmith.core.errors import UserError

MAX_NODES = 100_000  # values in the expanded document; recipes hold a few hundred
MAX_DEPTH = 64  # nesting levels; recipes use 3 or 4
MAX_REPR = 120  # characters of a value quoted in an error message
MAX_CHARS = 2**20  # characters of one document; recipes hold a few KiB (a 50 MB scalar hung `validate`)
MAX_KEYS = 2_000  # mapping keys in one document; recipes hold a few hundred (45,000 unknown keys took 35 s)


class YAMLBoundError(UserError):
    """A YAML document past a bound (aliases, depth), with a repeated key, or not YAML at all; the
    message names the source, `detail` is the same without it."""

    def __init__(self, source: str, detail: str):
        self.source, self.detail = source, detail
        super().__init__(f"{source}: {detail}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 6, 6, 60, 60


def short_repr(value) -> str:
    """repr() bounded in work and length: a value built from aliases is never fully expanded."""
    text = _REPR.repr(value)
    return text if len(text) <= MAX_REPR else text[:MAX_REPR - 3] + "..."


def _where(node) -> str:
    mark = getattr(node, "start_mark", None)
    return f"line {mark.line + 1}" if mark is not None else "?"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts nesting while composing and refuses repeated keys while constructing."""

    source = "YAML"

    def compose_node(self, parent, index):
        if index is None and isinstance(parent, yaml.MappingNode):  # a key: count it while composing
            self._keys = getattr(self, "_keys", 0) + 1
            if self._keys > MAX_KEYS:
                raise YAMLBoundError(self.source, f"more than {MAX_KEYS:,} keys (a recipe holds a few hundred); the "
                                     "file is damaged or not a recipe")
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLBoundError(self.source, f"nested deeper than {MAX_DEPTH} levels "
                                     f"(at {_where(self.peek_event())}); flatten the document")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _value in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = key_node.value
                    if key in seen and key_node.tag != "tag:yaml.org,2002:merge":
                        raise YAMLBoundError(self.source, f"key {short_repr(key)} is given twice ({seen[key]} and "
                                             f"{_where(key_node)}); keep one")
                    seen[key] = _where(key_node)
        return super().construct_mapping(node, deep)


def _expanded_size(root) -> int:
    """Values in the document once every alias is expanded (memoised per node, so this is cheap)."""
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if children_done:
            sizes[id(node)] = min(1 + sum(sizes.get(id(c), 0) for c in children), 10 * MAX_NODES)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes.get(id(root), 0)


def load(text: str, source: str = "YAML"):
    """yaml.safe_load with the bounds above; errors (bounds and syntax) are ValueErrors naming `source`."""
    if len(text) > MAX_CHARS:
        raise YAMLBoundError(source, f"{len(text):,} characters, more than the {MAX_CHARS:,} a recipe may hold; "
                             "the file is damaged or not a recipe")
    try:
        loader = _BoundedLoader(text)  # the reader refuses control characters here, before any parsing
    except yaml.YAMLError as exc:
        raise YAMLBoundError(source, f"not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise YAMLBoundError(source, f"its aliases (*name) expand to more than {MAX_NODES:,} values; "
                                 "write the values out instead of nesting aliases")
        return loader.construct_document(node)
    except RecursionError:
        raise YAMLBoundError(source, "nested too deeply to read; flatten the document") from None
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())
        raise YAMLBoundError(source, f"not valid YAML: {first[:300]}") from None
    finally:
        loader.dispose()
