"""Hypothesis strategies for engine command lines (issue 44): the export's own serve command respelled the ways each
engine's parser allows or refuses, with bad values in its flags.

- vLLM: `--a_b` spellings, `--flag=value`, the --speculative-config JSON split into dotted keys
  (`--speculative-config.KEY VALUE`, `--speculative_config.KEY=VALUE`, `KEY+` lists), a key's value replaced;
- SGLang: its aliases (`--model`, `--speculative-draft-model`, the DFLASH / DSPARK block sizes), unique and
  ambiguous prefixes, underscores, `=`;
- llama-server: `-md` / `--model-draft` / `--spec-draft-model`, underscores, `--flag=value` (refused), repeated
  --spec-type, LLAMA_ARG_* variables, removed flags;
- every engine: leading `env` and NAME=VALUE words, unknown flags, bad values (huge integers, escapes, deep JSON).

A drawn `EngineLine` is the words and the names an error about them may give (every flag written, and the places
doctor names: the serve command, draftsmith.json)."""
from __future__ import annotations

import dataclasses
import json

from hypothesis import strategies as st

from draftsmith.export.sglang.cli_flags import OPTIONS as SGLANG_OPTIONS

BAD_VALUES = ["0", "-1", "65", "1" + "0" * 18, "9" * 5000, "true", "null", "nan", "1e999", "1k", "2K", "1_000", "",
              "x" * 300, "\x1b]0;pwned\x07\x1b[2J", "[" * 5000, '{"a": ' * 60, "../x", "/dev/zero", "a\nb", "3abc",
              "-0.5", "[1, 2]", '{"model": null}']
values = st.one_of(st.sampled_from(BAD_VALUES), st.text(max_size=12))


@dataclasses.dataclass
class EngineLine:
    words: list[str]
    label: str

    @property
    def names(self) -> list[str]:
        flags = {w.split("=", 1)[0][:60] for w in self.words if w.startswith("-")}
        flags |= {f.split(".", 1)[0] for f in flags}
        return sorted(flags | {"serve command", "serve_command", "draftsmith.json", "config.json"})


def _flag_indices(words: list[str]) -> list[int]:
    return [i for i, w in enumerate(words) if w.startswith("-") and len(w) > 1]


@st.composite
def respelled(draw, words: list[str], engine: str) -> tuple[list[str], str]:
    """One flag of `words` respelled as `engine`'s parser may read it (or refuse it)."""
    indices = _flag_indices(words)
    if not indices:
        return words, "no flag"
    i = draw(st.sampled_from(indices))
    flag = words[i]
    has_value = i + 1 < len(words) and not words[i + 1].startswith("-")
    choices = ["underscores", "equals"]
    if engine == "sglang":
        choices += ["prefix", "alias"]
    if engine == "llama.cpp":
        choices += ["alias", "env"]
    how = draw(st.sampled_from(choices))
    new = list(words)
    if how == "underscores":
        new[i] = flag[:2] + flag[2:].replace("-", "_")
    elif how == "equals" and has_value:
        new[i:i + 2] = [f"{flag}={words[i + 1]}"]
    elif how == "prefix":
        cut = draw(st.integers(3, max(3, len(flag) - 1)))
        new[i] = flag[:cut]
    elif how == "alias":
        aliases = {"--model-path": "--model", "--speculative-draft-model-path": "--speculative-draft-model",
                   "-md": draw(st.sampled_from(["--model-draft", "--spec-draft-model", "--spec_draft_model"])),
                   "--spec-draft-n-max": draw(st.sampled_from(["--draft-max", "--draft", "--spec_draft_n_max"])),
                   "--speculative-num-draft-tokens": draw(st.sampled_from(
                       ["--speculative-dflash-block-size", "--speculative-dspark-block-size"]))}
        new[i] = aliases.get(flag, flag)
    elif how == "env" and has_value:
        variables = {"-m": "LLAMA_ARG_MODEL", "-md": "LLAMA_ARG_SPEC_DRAFT_MODEL", "--spec-type": "LLAMA_ARG_SPEC_TYPE",
                     "--spec-draft-n-max": "LLAMA_ARG_SPEC_DRAFT_N_MAX", "--spec-draft-p-min": "LLAMA_ARG_SPEC_DRAFT_P_MIN"}
        if flag in variables:
            new = [f"{variables[flag]}={words[i + 1]}"] + words[:i] + words[i + 2:]
    return new, f"{how} {flag}"


@st.composite
def dotted(draw, words: list[str]) -> tuple[list[str], str]:
    """vLLM: some keys of the --speculative-config JSON as dotted flags (the JSON kept or dropped)."""
    if "--speculative-config" not in words:
        return words, "no JSON"
    i = words.index("--speculative-config")
    try:
        spec = json.loads(words[i + 1])
    except (IndexError, ValueError, RecursionError):
        return words, "JSON unreadable"
    if not isinstance(spec, dict):
        return words, "JSON not an object"
    keys = draw(st.lists(st.sampled_from(sorted(spec) or ["model"]), min_size=1, max_size=4, unique=True))
    out = words[:i] + words[i + 2:] if draw(st.booleans()) else list(words)
    for key in keys:
        spelling = draw(st.sampled_from(["--speculative-config.", "--speculative_config.", "--speculative-config."]))
        value = json.dumps(spec.get(key)) if draw(st.booleans()) else draw(values)
        if draw(st.booleans()):
            out.append(f"{spelling}{key}={value}")
        else:
            out += [f"{spelling}{key}{draw(st.sampled_from(['', '+']))}", value]
    return out, f"dotted {keys}"


@st.composite
def bad_value(draw, words: list[str]) -> tuple[list[str], str]:
    """A flag's value (or a JSON key's) replaced by a bad one."""
    indices = [i for i in _flag_indices(words) if i + 1 < len(words)]
    if not indices:
        return words, "no value"
    i = draw(st.sampled_from(indices))
    new, value = list(words), draw(values)
    try:
        spec = json.loads(words[i + 1])
    except (ValueError, RecursionError):
        spec = None
    if isinstance(spec, dict) and spec:
        key = draw(st.sampled_from(sorted(spec)))
        new[i + 1] = json.dumps(spec).replace(json.dumps(spec[key]), value if value else '""', 1)
    else:
        new[i + 1] = value
    return new, f"{words[i]} = {value[:20]!r}"


@st.composite
def engine_line(draw, words: list[str], engine: str) -> EngineLine:
    """The export's own command (`words`) with 1-3 changes an engine user or a received file makes."""
    labels = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = ["respell", "bad_value", "extra", "env"] + (["dotted"] * 2 if engine == "vllm" else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "respell":
            words, label = draw(respelled(words, engine))
        elif kind == "dotted":
            words, label = draw(dotted(words))
        elif kind == "bad_value":
            words, label = draw(bad_value(words))
        elif kind == "extra":
            extra = draw(st.sampled_from(["--enforce-eager", "--gpu-memory-utilization", "--spec-type", "--port",
                                          "--speculative-num-steps", "--no-repack", "-md", "--config",
                                          sorted(SGLANG_OPTIONS)[draw(st.integers(0, len(SGLANG_OPTIONS) - 1))]]))
            words, label = words + [extra, draw(values)], f"extra {extra}"
        else:
            words = [draw(st.sampled_from(["env", "A=1", "VLLM_USE_V1=0", "LLAMA_ARG_SPEC_TYPE=draft-dflash"]))] + words
            label = f"env {words[0]}"
        labels.append(label)
    return EngineLine(words, "; ".join(labels))
