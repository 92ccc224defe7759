"""Read data files into normalised rows: conversations, plain-text documents and prompts.

Accepted forms (docs/data.md has the full description):
  ShareGPT  {"conversations": [{"from": "human"|"gpt"|"system", "value": str}, ...]}
            (a DPO-style "chosen" reply {"from": "gpt", "value"} is appended as the last turn)
  OpenAI    {"messages": [{"role": "user"|"assistant"|"system", "content": str | [parts]}, ...]}
  Alpaca    {"instruction", "input"?, "output", "history"?: [[user, assistant], ...], "system"?}
  Q&A       {"question", "answer"}
  text      a .txt file (one document) or JSONL rows {"text": str}; "stdlib:SPLIT" documents
  prompts   {"prompt": str} | {"turns": [str, ...]} | {"question": str} | {"instruction"} (no answer)
Files are JSONL (one object per line), a JSON list, or plain text (.txt). A file is a JSON list
only when its whole content is one JSON array; otherwise every line is a row (a line holding an
array is a skipped row, counted). Every row keeps its "file:line" so that a malformed row (bad
JSON, nesting too deep, bytes that are not UTF-8, wrong types) is reported where it is, skipped
and counted. Row ids are "path:line" with the path as data.path gives it, so that files of the
same name in different folders never share an id.
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from draftsmith.core.errors import UserError

DATA_SUFFIXES = (".json", ".jsonl", ".txt")  # plus .parquet / .arrow, save_to_disk folders, hf:ORG/NAME (hf_sources)
PROMPT_KEYS = ("prompt", "turns", "question")
ROLE_ALIASES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant",
    "system": "system", "developer": "system",
}

# Skip reasons (keys of DataReport.skipped); the detail after ":" names the turn or key.
BAD_JSON = "bad JSON"
NOT_OBJECT = "not a JSON object"
UNKNOWN_FORMAT = "unknown format"
WRONG_FORMAT = "not in the configured data.format"
MISSING_ROLE = "missing role"
UNKNOWN_ROLE = "unknown role"
MISSING_CONTENT = "missing content"
EMPTY_TURN = "empty turn"
NO_ASSISTANT = "no assistant turn"
PROMPT_ONLY = "prompt only (regenerate it with `draftsmith prepare`)"
EMPTY_TEXT = "empty text"
NOT_UTF8 = "not UTF-8"
BAD_VALUE = "bad value"
BAD_IMAGE = "bad image part"
IMAGE_KEYS = ("images", "image")  # a row's image files (JSONL) or an HF dataset's image column

# Bytes that are not UTF-8 decode (surrogateescape) to lone surrogates U+DC80..U+DCFF.
_UNDECODABLE = re.compile("[\udc80-\udcff]")
JSON_ERRORS = (json.JSONDecodeError, RecursionError)  # RecursionError: brackets nested too deeply


class RowError(Exception):
    """A malformed row: `reason` is the category (counted), `detail` says where in the row."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


@dataclass
class Row:
    """One normalised row. kind: "chat" (has an assistant turn), "prompt" (none yet) or "text"."""

    source: str  # "file:line"
    row_id: str  # stable id (used by regeneration to resume)
    kind: str
    messages: Optional[list[dict]] = None  # [{"role": "system"|"user"|"assistant", "content": str}]
    text: Optional[str] = None
    form: str = "text"  # the detected form: sharegpt, openai, alpaca, qa, prompts or text
    data_file: Optional[str] = None  # the file the row came from: relative image paths are read beside it

    @property
    def images(self) -> list:
        """Image references in order (paths, image objects or {"bytes"}); [] for a text row."""
        return row_images(self.messages)


@dataclass
class RawRow:
    file: str
    line: int
    value: Any = None  # parsed JSON value, or the text of a .txt file
    error: Optional[RowError] = None
    row_id: Optional[str] = None

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}"


# --------------------------------------------------------------------------- files


def expand_paths(paths: list[str]) -> list[str]:
    """data.path entries -> files: globs and directories (*.json, *.jsonl, *.txt) expanded, sorted."""
    if not paths:
        raise UserError("data.path is empty: set data.path in the recipe (or pass data.path=FILE on the command line)")
    from draftsmith.data import hf_sources

    files: list[str] = []
    for p in paths:
        if p.startswith("stdlib:") or hf_sources.is_hf(p) or hf_sources.is_saved_dataset(p):
            files.append(p)  # read through `datasets` (data/hf_sources.py)
        elif any(c in p for c in "*?["):
            matches = sorted(glob.glob(p))
            if not matches:
                raise FileNotFoundError(f"data.path {p!r} matches no file; fix the pattern in data.path")
            files.extend(matches)
        elif os.path.isdir(p):
            found = sorted(str(f) for f in Path(p).iterdir() if f.suffix in DATA_SUFFIXES + hf_sources.TABLE_SUFFIXES)
            if not found:
                raise FileNotFoundError(f"data.path {p!r} is a directory with no {'/'.join(DATA_SUFFIXES)} files")
            files.extend(found)
        elif not os.path.exists(hf_sources.split_query(p)[0]):
            raise FileNotFoundError(
                f"data file {p!r} does not exist (relative to {os.getcwd()}); fix data.path in the recipe "
                "or override it: data.path=PATH"
            )
        else:
            files.append(p)
    return files


def _stdlib_rows(spec: str) -> Iterator[RawRow]:
    split = spec.split(":", 1)[1]
    from draftsmith.data import stdlib_corpus  # lazy: only recipes that use it pay for it

    for i, (doc_id, text) in enumerate(stdlib_corpus.documents(split), start=1):
        yield RawRow(spec, i, {"text": text}, row_id=f"{spec}:{doc_id}")


def _json_error(exc: Exception) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else "brackets nested too deeply"


def _json_list_rows(file: str, text: str, start: int) -> Iterator[RawRow]:
    """Walk a top-level JSON list element by element so each row keeps its line number."""
    decoder = json.JSONDecoder()
    pos, line, counted = start + 1, 1, 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        line += text.count("\n", counted, pos)
        counted = pos
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            value, end = decoder.raw_decode(text, pos)
        except JSON_ERRORS as exc:
            yield RawRow(file, line, error=RowError(BAD_JSON, f"{_json_error(exc)} (the rest of the file is unreadable)"))
            return
        if _UNDECODABLE.search(text, pos, end):
            yield RawRow(file, line, error=RowError(NOT_UTF8, "the row holds bytes that are not UTF-8"))
        else:
            yield RawRow(file, line, value)
        pos = end


def _is_json_list(text: str, start: int) -> bool:
    """True when the text from `start` (a "[") is one JSON array and nothing else follows it;
    an array that does not parse counts as a (damaged) JSON list unless its first line alone is JSON."""
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
    except JSON_ERRORS:
        first = text[start:].split("\n", 1)[0]
        try:
            json.loads(first)
        except JSON_ERRORS:
            return True
        return False  # JSONL whose first line is an array, with a bad line further on
    return not text[end:].strip()


def read_raw(file: str) -> Iterator[RawRow]:
    """Yield the raw rows of one file (parse errors become rows carrying a RowError)."""
    if file.startswith("stdlib:"):
        yield from _stdlib_rows(file)
        return
    from draftsmith.data import hf_sources

    if hf_sources.is_dataset_source(file):
        for name, i, row in hf_sources.raw_rows(file):
            yield RawRow(name, i, row, row_id=f"{name}:{i}")
        return
    text = Path(file).read_bytes().decode("utf-8", errors="surrogateescape")
    if file.endswith(".txt"):
        if _UNDECODABLE.search(text):
            yield RawRow(file, 1, error=RowError(NOT_UTF8, "the file holds bytes that are not UTF-8"))
        else:
            yield RawRow(file, 1, text)
        return
    stripped = text.lstrip()
    if stripped.startswith("[") and _is_json_list(text, len(text) - len(stripped)):
        yield from _json_list_rows(file, text, len(text) - len(stripped))
        return
    for i, line in enumerate(text.split("\n"), start=1):  # only \n ends a JSONL line (not U+2028 etc.)
        if not line.strip():
            continue
        if _UNDECODABLE.search(line):
            yield RawRow(file, i, error=RowError(NOT_UTF8, "the line holds bytes that are not UTF-8"))
            continue
        try:
            yield RawRow(file, i, json.loads(line))
        except JSON_ERRORS as exc:
            yield RawRow(file, i, error=RowError(BAD_JSON, _json_error(exc)))


# --------------------------------------------------------------------------- rows


def _content(value: Any, where: str) -> str:
    if isinstance(value, list):  # OpenAI content parts: keep the text parts
        value = "".join(p.get("text", "") for p in value if isinstance(p, dict) and p.get("type") == "text")
    if not isinstance(value, str):
        raise RowError(MISSING_CONTENT, f"{where} has no text content")
    if not value.strip():
        raise RowError(EMPTY_TURN, f"{where} is empty")
    return value


def _image_ref(part: dict, where: str) -> Any:
    """An image content part {"type": "image", "path": FILE} (or "image": FILE, an image object, {"bytes"})."""
    ref = part.get("path", part.get("image"))
    if ref is None or (isinstance(ref, str) and not ref.strip()):
        raise RowError(BAD_IMAGE, f"{where}: an image part needs \"path\" (a file relative to the data file)")
    return ref


def _parts(value: Any, where: str) -> Optional[list[dict]]:
    """Content parts in order when they hold an image ({"type": "image"} -> {"type": "image", "ref": ...},
    text parts kept); None for content without images."""
    if not isinstance(value, list) or not any(isinstance(p, dict) and p.get("type") == "image" for p in value):
        return None
    parts = []
    for p in value:
        if isinstance(p, dict) and p.get("type") == "image":
            parts.append({"type": "image", "ref": _image_ref(p, where)})
        elif isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
            parts.append({"type": "text", "text": p["text"]})
    return parts


def _message(role: str, value: Any, where: str) -> dict:
    parts = _parts(value, where)
    if parts is None:
        return {"role": role, "content": _content(value, where)}
    text = "".join(p["text"] for p in parts if p["type"] == "text")  # may be empty: an image-only turn
    return {"role": role, "content": text, "parts": parts}


def _attach_images(messages: list[dict], refs: Any) -> None:
    """A row's top-level "images" (a list of files, or one) go before the text of its first user turn."""
    refs = refs if isinstance(refs, list) else [refs]
    if not refs:
        return
    for i, ref in enumerate(refs):
        if ref is None or (isinstance(ref, str) and not ref.strip()):
            raise RowError(BAD_IMAGE, f"images[{i}] is empty")
    first = next((m for m in messages if m["role"] == "user"), None)
    if first is None:
        raise RowError(BAD_IMAGE, "the row has images but no user turn to put them in")
    parts = first.get("parts") or [{"type": "text", "text": first["content"]}]
    first["parts"] = [{"type": "image", "ref": r} for r in refs] + parts


def row_images(messages: Optional[list[dict]]) -> list:
    """The image references of a conversation, in order (none for a text row)."""
    return [p["ref"] for m in messages or [] for p in m.get("parts") or [] if p["type"] == "image"]


def _turns(turns: Any, role_key: str, content_key: str, label: str) -> list[dict]:
    if not isinstance(turns, list) or not turns:
        raise RowError(EMPTY_TURN, f"'{label}' is not a non-empty list")
    messages = []
    for i, turn in enumerate(turns):
        where = f"turn {i}"
        if not isinstance(turn, dict):
            raise RowError(NOT_OBJECT, f"{where} is not an object")
        role = turn.get(role_key)
        if role is None:
            raise RowError(MISSING_ROLE, f"{where} has no {role_key!r}")
        if str(role).lower() not in ROLE_ALIASES:
            raise RowError(UNKNOWN_ROLE, f"{where} has {role_key}={role!r} (known: {', '.join(ROLE_ALIASES)})")
        messages.append(_message(ROLE_ALIASES[str(role).lower()], turn.get(content_key), where))
    return messages


def _sharegpt(obj: dict) -> list[dict]:
    turns = obj["conversations"]
    chosen = obj.get("chosen")
    if isinstance(chosen, dict) and isinstance(turns, list):
        turns = turns + [chosen]  # DPO rows: the preferred reply ends the conversation
    return _turns(turns, "from", "value", "conversations")


def _alpaca(obj: dict) -> list[dict]:
    messages: list[dict] = []
    if isinstance(obj.get("system"), str) and obj["system"].strip():
        messages.append({"role": "system", "content": obj["system"]})
    history = obj.get("history") or []
    if not isinstance(history, list):
        raise RowError(BAD_VALUE, f"'history' is a {type(history).__name__}, not a list of [user, assistant] pairs")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise RowError(EMPTY_TURN, f"history[{i}] is not a [user, assistant] pair")
        messages.append({"role": "user", "content": _content(pair[0], f"history[{i}][0]")})
        messages.append({"role": "assistant", "content": _content(pair[1], f"history[{i}][1]")})
    user = _content(obj.get("instruction"), "instruction")
    extra = obj.get("input")
    if isinstance(extra, str) and extra.strip():
        user = f"{user}\n\n{extra}"
    messages.append({"role": "user", "content": user})
    if obj.get("output") is not None:
        messages.append({"role": "assistant", "content": _content(obj["output"], "output")})
    return messages


def _prompt(obj: dict) -> list[dict]:
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise RowError(EMPTY_TURN, "'turns' is not a non-empty list")
        return [{"role": "user", "content": _content(t, f"turns[{i}]")} for i, t in enumerate(turns)]
    key = "prompt" if "prompt" in obj else "question"
    return [{"role": "user", "content": _content(obj[key], key)}]


def _detect(obj: dict) -> str:
    if "conversations" in obj:
        return "sharegpt"
    if "messages" in obj:
        return "openai"
    if "instruction" in obj:
        return "alpaca"
    if "question" in obj and "answer" in obj:
        return "qa"
    if "text" in obj:
        return "text"
    if any(k in obj for k in PROMPT_KEYS):
        return "prompts"
    keys = ", ".join(list(obj)[:6])
    raise RowError(UNKNOWN_FORMAT, f"no conversations/messages/instruction/text/prompt/turns/question key (keys: {keys})")


def _finish(raw: RawRow, messages: list[dict], row_id: str, form: str, prompts_only: bool) -> Row:
    if prompts_only:
        messages = [m for m in messages if m["role"] != "assistant"]
        if not any(m["role"] == "user" for m in messages):
            raise RowError(EMPTY_TURN, "no user turn to answer")
        return Row(raw.source, row_id, "prompt", messages=messages, form=form)
    kind = "chat" if any(m["role"] == "assistant" for m in messages) else "prompt"
    return Row(raw.source, row_id, kind, messages=messages, form=form)


def parse(raw: RawRow, fmt: str = "auto") -> Row:
    """Normalise one raw row under data.format `fmt`; raises RowError when it is malformed."""
    if raw.error is not None:
        raise raw.error
    row_id = raw.row_id or f"{os.path.normpath(raw.file)}:{raw.line}"
    if isinstance(raw.value, str):  # a .txt document
        if not raw.value.strip():
            raise RowError(EMPTY_TEXT, "the file is empty")
        return Row(raw.source, row_id, "text", text=raw.value)
    obj = raw.value
    if not isinstance(obj, dict):
        raise RowError(NOT_OBJECT, f"got a JSON {type(obj).__name__}")
    form = _detect(obj)
    if fmt not in ("auto", "prompts") and form != fmt:
        raise RowError(WRONG_FORMAT, f"data.format is {fmt!r} but the row looks like {form!r}")
    if form == "text":
        text = obj["text"]
        if not isinstance(text, str) or not text.strip():
            raise RowError(EMPTY_TEXT, "'text' is empty or not a string")
        if fmt == "prompts":
            raise RowError(WRONG_FORMAT, "data.format is 'prompts' but the row is a text document")
        return Row(raw.source, row_id, "text", text=text)
    builders = {
        "sharegpt": _sharegpt,
        "openai": lambda o: _turns(o["messages"], "role", "content", "messages"),
        "alpaca": _alpaca,
        "qa": lambda o: [{"role": "user", "content": _content(o["question"], "question")},
                         {"role": "assistant", "content": _content(o["answer"], "answer")}],
        "prompts": _prompt,
    }
    try:
        messages = builders[form](obj)
        key = next((k for k in IMAGE_KEYS if obj.get(k) is not None), None)
        if key is not None:
            _attach_images(messages, obj[key])
    except (TypeError, AttributeError, KeyError, ValueError, RecursionError) as exc:  # a value of an unexpected type
        raise RowError(BAD_VALUE, f"{type(exc).__name__}: {exc}") from None
    row = _finish(raw, messages, row_id, form, prompts_only=fmt == "prompts")
    row.data_file = raw.file
    return row


def iter_rows(paths: list[str], fmt: str = "auto") -> Iterator[tuple[RawRow, Optional[Row], Optional[RowError]]]:
    """(raw, row, None) for each good row and (raw, None, error) for each malformed one, in file order."""
    for file in expand_paths(paths):
        for raw in read_raw(file):
            try:
                yield raw, parse(raw, fmt), None
            except RowError as exc:
                yield raw, None, exc
