"""Reading a serve command or an engine config the way the engines read them, with bounds: a command line
is split as a POSIX shell splits it (shlex), in one pass and at most MAX_COMMAND_WORDS words; leading `env` and
NAME=VALUE words are the environment; `scan` reads the flags with the spelling rules each engine's reader passes
(vLLM: export/vllm/doctor.py, dotted keys included; SGLang: argparse's aliases and prefixes; llama.cpp: arg.cpp's
'_' rewrite and no `=value`); the last of a repeated flag wins unless the engine adds the values up.
JSON and YAML that a user hands over are bounded in size, nesting and integer digits; every problem is one
UserError line.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.core import safe_yaml
from draftsmith.core.errors import UserError
from draftsmith.core.files import read_received_text

MAX_COMMAND_CHARS = 2**20  # a serve command with its JSON: a few hundred characters when written by hand
MAX_CONFIG_BYTES = 2**20  # a speculative_config JSON, SGLang args, TRT-LLM extra_llm_api_options: a few KiB
MAX_DEPTH = 32  # nesting of a speculative_config: 2 levels in every engine
MAX_COMMAND_WORDS = 4096  # words of one serve command: a few dozen when written by hand
MAX_INT_DIGITS = 30  # an integer in a config: k, a layer id, a port (Python refuses to read past 4,300 digits)
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_NUMBER = re.compile(r"^-\d")


@dataclass
class Command:
    """A command line split into the environment it sets and its words."""

    env: dict[str, str]
    argv: list[str]


@dataclass
class Flags:
    """What a command's flags set, by the canonical names an engine module gave them."""

    values: dict[str, list[str]] = field(default_factory=dict)  # canonical -> the value(s) of its last use
    positionals: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # flags doctor does not read, as written

    def get(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None


def split_command(command, source: str = "the serve command") -> Command:
    """`command` (a string, or the words after `--`; one word holding spaces is split again) as env + argv.
    Comment lines are skipped and of several command lines the last is the serve command (export prints
    a `# vLLM >= ...` line above some, and a merge step above Medusa-2's). One pass over the words, however
    many `env` and NAME=VALUE words lead (a received command of 200,000 `env` words recursed once per word)."""
    words = [command] if isinstance(command, str) else [str(w) for w in command]
    if sum(len(w) for w in words) > MAX_COMMAND_CHARS:
        raise UserError(f"{source}: more than {MAX_COMMAND_CHARS:,} characters; a serve command is a few hundred: "
                        "pass the engine's own command line")
    if len(words) == 1 and (" " in words[0].strip() or "\n" in words[0]):
        words = _split_text(words[0], source)
    if len(words) > MAX_COMMAND_WORDS:
        raise UserError(f"{source}: {len(words):,} words, more than the {MAX_COMMAND_WORDS:,} a serve command may "
                        "hold (one is a few dozen); pass the engine's own command line")
    env: dict[str, str] = {}
    start = 0
    while start < len(words) and (words[start] == "env" or _ENV_WORD.match(words[start])):  # `env A=1 vllm serve`
        if words[start] != "env":
            name, _, value = words[start].partition("=")
            env[name] = value
        start += 1
    if start == len(words):
        raise UserError(f"{source}: no command; pass the engine's command after `--`, e.g. `-- vllm serve MODEL ...`")
    return Command(env, words[start:])


def _split_text(text: str, source: str) -> list[str]:
    text = text.replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise UserError(f"{source}: holds only comments; pass the engine's command")
    try:
        return shlex.split(lines[-1])
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise UserError(f"{source}: cannot be split as a shell would ({exc}); balance the quotes around the "
                        "--speculative-config JSON (e.g. '{\"method\": ...}')") from None


def canonical_flag(word: str) -> str:
    """`--a_b` -> `--a-b`, in the flag name only, never its `=value` (llama.cpp's arg.cpp rewrites every '_' of a
    `--` word; vLLM's rewrite, up to the first '.', is export/vllm/doctor.py's)."""
    if not word.startswith("--"):
        return word
    name, eq, value = word.partition("=")
    return name.replace("_", "-") + eq + value


def scan(argv: list[str], known: dict[str, tuple[str, int]], source: str, *, equals: bool = True,
         rename=canonical_flag, accumulate: tuple[str, ...] = ()) -> Flags:
    """Flags of `argv` (the words after the engine's program): `known` maps each spelling (as `rename` writes
    it) to (name, number of values). `equals`: `--flag=value` is a flag and its value (argparse), else the whole
    word is the flag's name (llama.cpp). A name in `accumulate` keeps the values of every use, in order (llama.cpp's
    --spec-type); of any other repeated flag the last wins. A flag doctor does not know is listed in `unchecked`,
    with the word after it taken as its value unless that word is a flag."""
    flags, i = Flags(), 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-") or _NUMBER.match(word) or word == "-":
            flags.positionals.append(word)
            i += 1
            continue
        name, has_eq, inline = rename(word).partition("=") if equals else (rename(word), "", "")
        entry = known.get(name)
        if entry is None:
            flags.unchecked.append(word.split("=")[0] if equals else word)
            takes_next = not has_eq and i + 1 < len(argv) and (not argv[i + 1].startswith("-") or _NUMBER.match(argv[i + 1]))
            i += 2 if takes_next else 1
            continue
        canon, nargs = entry
        if has_eq:
            values, i = [inline], i + 1
        else:
            values, i = argv[i + 1:i + 1 + nargs], i + 1 + nargs
            if len(values) < nargs:
                raise UserError(f"{source}: {word[:80]} needs {nargs} value(s) and the command ends; give it, or drop "
                                "the flag")
        if canon in accumulate:
            flags.values[canon] = flags.values.get(canon, []) + values
        else:
            flags.values[canon] = values
    return flags


def as_int(value: str, flag: str) -> int:
    if len(str(value)) > MAX_INT_DIGITS:
        raise UserError(f"{flag}: a value of {len(str(value)):,} characters, not a count the engine takes; give the "
                        "number the export printed")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag} {str(value)[:40]!r}: not an integer; the engine would refuse it too") from None


def as_float(value: str, flag: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag} {str(value)[:40]!r}: not a number; the engine would refuse it too") from None


def bounded_int(digits: str, source: str) -> int:
    """A JSON integer of at most MAX_INT_DIGITS digits (json.loads would raise a bare ValueError past 4,300)."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise UserError(f"{source}: holds an integer of {len(digits.lstrip('-')):,} digits; no engine setting takes "
                        f"more than {MAX_INT_DIGITS}: write the value the engine should use")
    return int(digits)


def huge_int_in(value, source: str) -> None:
    """One line for an integer past MAX_INT_DIGITS anywhere in a parsed YAML / JSON value (walked without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > 3.33 * MAX_INT_DIGITS:
            raise UserError(f"{source}: holds an integer of more than {MAX_INT_DIGITS} digits; no engine setting "
                            "takes one: write the value the engine should use")
        stack.extend(item.values() if isinstance(item, dict) else item if isinstance(item, list) else ())


def _depth(value) -> int:
    """Nesting depth of a JSON / YAML value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def load_json_value(text: str, source: str):
    """Any JSON value, bounded in size, nesting and integer digits (each one UserError line); text that is not
    JSON raises json.JSONDecodeError (a ValueError) for the caller to read otherwise."""
    if len(text) > MAX_CONFIG_BYTES:
        raise UserError(f"{source}: {len(text):,} characters of JSON, more than the {MAX_CONFIG_BYTES:,} a "
                        "speculative config may hold; pass the engine's own small config")

    def no_constant(name):
        raise UserError(f"{source}: holds {name}, which is not JSON (vLLM's json.loads would take it, then fail); "
                        "write a number")

    try:
        data = json.loads(text, parse_constant=no_constant, parse_int=lambda digits: bounded_int(digits, source))
    except RecursionError:
        raise UserError(f"{source}: nested too deeply to be a speculative config; flatten it") from None
    if _depth(data) > MAX_DEPTH:
        raise UserError(f"{source}: nested deeper than {MAX_DEPTH} levels; a speculative config has 2")
    return data


def load_json_object(text: str, source: str) -> dict:
    """A JSON object from a flag or file, bounded in size and nesting; one UserError line otherwise."""
    try:
        data = load_json_value(text, source)
    except json.JSONDecodeError as exc:
        raise UserError(f"{source}: not valid JSON ({exc.msg} at column {exc.colno}); quote the JSON for your shell, "
                        "e.g. --speculative-config '{\"model\": ...}'") from None
    if not isinstance(data, dict):
        raise UserError(f"{source}: a JSON {type(data).__name__}, not the object the engine reads")
    return data


def read_config_file(path, what: str) -> dict:
    """A config file a user names (JSON, or YAML for any other suffix), bounded; a mapping, else one line."""
    path = Path(path)
    try:
        if not path.exists():
            raise UserError(f"{str(path)[:200]}: no such file; name the {what} the engine reads")
        text = read_received_text(path, what, limit=MAX_CONFIG_BYTES)
    except OSError as exc:  # a name too long, a directory without permission
        raise UserError(f"{str(path)[:200]}: cannot be read ({exc.strerror}); name the {what} the engine reads") from None
    if path.suffix.lower() == ".json":
        return load_json_object(text, str(path))
    try:
        data = safe_yaml.load(text, str(path))
    except UserError:
        raise
    except ValueError as exc:  # an integer past Python's 4,300 digits: "Exceeds the limit ... for integer string"
        raise UserError(f"{path}: a value the {what} cannot hold ({str(exc)[:80]}); write the value the engine "
                        "should use") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: holds a YAML {type(data).__name__}, not the mapping a {what} holds")
    if _depth(data) > MAX_DEPTH:
        raise UserError(f"{path}: nested deeper than {MAX_DEPTH} levels; a {what} has 2 or 3")
    huge_int_in(data, str(path))
    return data
