"""Regenerated answers kept as a file, so nobody regenerates just to start (`regenerate.generator: answers`).

A regeneration's output (data/regenerate.py) holds the prompts and the target's answers. The prompts stay
where they came from (../shared/data, each under its own licence); what is kept is one gzip JSONL file of
answers keyed by the conversation that asked for them:

    line 1:  {"format": "draftsmith-answers", "version": 1, "answered_by": {...the regeneration's settings...},
              "rows": N, "answers": M}
    then:    {"key": "<sha256 of the history>", "answer": "<the assistant's text>"}

The key is the SHA-256 of the history the generator was given (every turn before the answer, as
{"role", "content"} objects, canonical JSON), so a multi-turn row keeps one answer per turn and a prompt
that changed by one character finds no answer. data/regenerate.py's AnswersGenerator answers from the file: a history with no
answer is an error row, counted and retried by a rerun with another generator (`regenerate.generator:
openai`), never silently dropped.

    python -m draftsmith.data.shipped_answers pack runs/smollm2-regen128/answers.jsonl OUT.jsonl.gz
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.core.files import read_received_bytes, read_received_text

FORMAT = "draftsmith-answers"
VERSION = 1
MAX_FILE_BYTES = 64 << 20  # compressed, as received
MAX_TEXT_BYTES = 512 << 20  # decompressed: a gzip bomb stops here
MAX_LINE_BYTES = 1 << 20
# Settings of the regeneration that a recipe must repeat to use the file (the rest is recorded, not checked).
MATCHED_SETTINGS = ("max_new_tokens", "temperature", "top_p")


def history_key(history: list[dict]) -> str:
    """The key of the answer that follows `history` (the turns the generator was given)."""
    turns = [{"role": m["role"], "content": m["content"]} for m in history]
    text = json.dumps(turns, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _decompress(path: Path) -> tuple[str, str]:
    """(the decompressed text, the SHA-256 of the file as received)."""
    data = read_received_bytes(path, "answers file", MAX_FILE_BYTES)
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            while chunk := f.read(1 << 20):
                out.write(chunk)
                if out.tell() > MAX_TEXT_BYTES:
                    raise UserError(f"{path}: decompresses to more than {MAX_TEXT_BYTES:,} bytes; the answers file "
                                    "is damaged or not draftsmith's")
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: not a complete gzip file ({exc}); fetch the answers file again") from None
    try:
        return out.getvalue().decode("utf-8"), hashlib.sha256(data).hexdigest()
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text at byte {exc.start}; the answers file is damaged") from None


def read_answers(path: str | Path) -> tuple[dict, dict[str, str], str]:
    """(header, {key: answer}, the file's SHA-256) of an answers file; anything else is one line naming the file
    and line."""
    path = Path(path)
    text, sha256 = _decompress(path)
    lines = text.splitlines()
    if not lines:
        raise UserError(f"{path}: empty; the answers file needs its header line")
    rows = []
    for n, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_BYTES:
            raise UserError(f"{path}:{n}: a line of over {MAX_LINE_BYTES:,} characters; the answers file is damaged")
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{n}: not JSON ({exc.msg}); the answers file is damaged") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n}: not a JSON object; the answers file is damaged")
        rows.append(row)
    header = rows[0]
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise UserError(f"{path}:1: not a {FORMAT} version {VERSION} header; write it with "
                        "`python -m draftsmith.data.shipped_answers pack`")
    answers: dict[str, str] = {}
    for n, row in enumerate(rows[1:], 2):
        key, answer = row.get("key"), row.get("answer")
        if not (isinstance(key, str) and len(key) == 64 and isinstance(answer, str)):
            raise UserError(f"{path}:{n}: needs a 64-character \"key\" and a string \"answer\"")
        if answers.setdefault(key, answer) != answer:
            raise UserError(f"{path}:{n}: key {key[:12]}... has two different answers; the file is damaged")
    if header.get("answers") != len(answers):
        raise UserError(f"{path}: the header counts {header.get('answers')} answers but the file holds "
                        f"{len(answers)}; it was cut short or edited: fetch it again")
    return header, answers, sha256


class AnswersFile:
    """The answers of an answers file for a recipe's regenerate section (regenerate.answers_file), checked
    against its generation settings; data/regenerate.py's AnswersGenerator answers from it."""

    def __init__(self, rcfg):
        if not rcfg.answers_file:
            raise UserError("regenerate.generator=answers needs regenerate.answers_file (a file written by "
                            "`python -m draftsmith.data.shipped_answers pack`)")
        self.path = Path(rcfg.answers_file)
        if not self.path.exists():
            raise UserError(f"regenerate.answers_file {self.path}: no such file")
        self.header, self.answers, self.file_sha256 = read_answers(self.path)
        made = self.header.get("answered_by") or {}
        for name in MATCHED_SETTINGS:
            if name in made and made[name] != getattr(rcfg, name):
                raise UserError(f"regenerate.{name} is {getattr(rcfg, name)!r} but {self.path}'s answers were "
                                f"generated with {made[name]!r}: set regenerate.{name}={made[name]!r}, or "
                                "regenerate with another generator")
        self.missing = (f"no answer in {self.path.name} for this prompt (it is not one the file was made from, or "
                        "its text changed); regenerate it with regenerate.generator=openai or local")

    def settings(self) -> dict:
        return {"generator": "answers", "answers_file_sha256": self.file_sha256,
                "answered_by": self.header.get("answered_by")}

    def lookup(self, history: list[dict]) -> str | None:
        return self.answers.get(history_key(history))


def pack(output: str | Path, dest: str | Path) -> dict:
    """Write the answers of a regeneration output (and its .summary.json settings) to dest."""
    output = Path(output)
    summary = json.loads(read_received_text(f"{output}.summary.json", "regeneration summary"))
    answers: dict[str, str] = {}
    rows = 0
    for line in output.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        messages = json.loads(line)["messages"]
        rows += 1
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                answers[history_key(messages[:i])] = m["content"]
    header = {"format": FORMAT, "version": VERSION, "answered_by": summary.get("settings", {}), "rows": rows,
              "answers": len(answers)}
    lines = [json.dumps(header, ensure_ascii=False)]
    lines += [json.dumps({"key": k, "answer": a}, ensure_ascii=False) for k, a in sorted(answers.items())]
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))  # mtime 0, no name: the same answers, the same bytes
    tmp.replace(dest)
    return header


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draftsmith.data.shipped_answers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="write a regeneration output's answers, keyed by prompt, to a gzip file")
    p.add_argument("output", help="regenerate.output of a finished regeneration (its .summary.json beside it)")
    p.add_argument("dest", help="the answers file to write (.jsonl.gz)")
    args = ap.parse_args(argv)
    header = pack(args.output, args.dest)
    print(f"{args.dest}: {header['answers']} answers from {header['rows']} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
