"""Evaluation workloads: named prompt sets read from a data directory (never downloaded).

Each loader returns items {"id": str, "prompt": str} (optionally "messages": [...] and
"category"). Multi-turn sources (Spec-Bench's MT-bench part, MT-bench) use their FIRST turn only:
the loop evaluates single requests, and a second turn would need the model's own first answer.

    spec_bench            the six Spec-Bench tasks, reported separately as spec_bench/<task>:
                          mt_bench (its 8 MT-bench categories), translation, summarization,
                          qa, math_reasoning, rag                 <data>/spec_bench/question.jsonl
    mt_bench              80 MT-bench questions                   <data>/mt_bench/question.jsonl
    humaneval             164 code prompts                        <data>/humaneval/HumanEval.jsonl.gz
    gsm8k                 1,319 grade-school math questions       <data>/gsm8k/test.jsonl
    alpaca                instruction (+ input)                   <data>/alpaca/alpaca_en_demo.json
    pycode                held-out Python stdlib prefixes (draftsmith.data.stdlib_corpus), no data dir
    long_context          MT-bench first turns after 0..64k characters of real Wikipedia text, so that
                          prompts fill the target's positions (encode keeps the LAST tokens that fit);
                          category prefix-<chars> (acceptance by context)  <data>/pretrain_text/wiki_demo.txt
    jsonl:PATH            one JSON object a line with "prompt" (or "messages", or "turns"), optional "id"
    images                questions about 8 small images made in code (a vision-language target;
                          eval/image_workloads.py)
    images:DIR            one question per image file in DIR (a vision-language target)

The data directory defaults to ../shared/data next to the repository (DRAFTSMITH_DATA overrides;
`draftsmith eval --data-dir` overrides both).
"""
from __future__ import annotations

import difflib
import gzip
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch

from draftsmith.core.errors import UnknownNameError, UserError
from draftsmith.core.registry import Registry

WORKLOADS: Registry[Callable[[Path], list[dict]]] = Registry("workload")
SPEC_BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                 "humanities"})
GROUPS = {"spec_bench": [f"spec_bench/{t}" for t in SPEC_BENCH_TASKS]}
PROMPT_FORMATS = ("auto", "chat", "plain", "raw")


def default_data_dir() -> Path:
    env = os.environ.get("DRAFTSMITH_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _need(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"workload file {path} is missing; pass --data-dir DIR (the directory holding "
                                "spec_bench/, mt_bench/, humaneval/, gsm8k/, alpaca/) or set DRAFTSMITH_DATA")
    return path


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(_need(path), "rt", encoding="utf-8") as f:
        rows = []
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{line_no}: not valid JSON ({e.msg})") from e
                except RecursionError:
                    raise UserError(f"{path}:{line_no}: not valid JSON (nested too deeply)") from None
        return rows


def _spec_bench_task(category: str) -> str:
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def _spec_bench(task: str) -> Callable[[Path], list[dict]]:
    def load(data_dir: Path) -> list[dict]:
        rows = _jsonl(data_dir / "spec_bench" / "question.jsonl")
        return [{"id": f"spec_bench-{r['question_id']}", "prompt": r["turns"][0], "category": r["category"]}
                for r in rows if _spec_bench_task(r["category"]) == task]

    return load


for _task in SPEC_BENCH_TASKS:
    WORKLOADS.register(f"spec_bench/{_task}")(_spec_bench(_task))


@WORKLOADS.register("mt_bench")
def _mt_bench(data_dir: Path) -> list[dict]:
    rows = _jsonl(data_dir / "mt_bench" / "question.jsonl")
    return [{"id": f"mt_bench-{r['question_id']}", "prompt": r["turns"][0], "category": r["category"]} for r in rows]


@WORKLOADS.register("humaneval")
def _humaneval(data_dir: Path) -> list[dict]:
    return [{"id": r["task_id"], "prompt": r["prompt"]} for r in _jsonl(data_dir / "humaneval" / "HumanEval.jsonl.gz")]


@WORKLOADS.register("gsm8k")
def _gsm8k(data_dir: Path) -> list[dict]:
    return [{"id": f"gsm8k-{i}", "prompt": r["question"]} for i, r in enumerate(_jsonl(data_dir / "gsm8k" / "test.jsonl"))]


@WORKLOADS.register("alpaca")
def _alpaca(data_dir: Path) -> list[dict]:
    path = _need(data_dir / "alpaca" / "alpaca_en_demo.json")
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [{"id": f"alpaca-{i}", "prompt": r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")}
            for i, r in enumerate(rows)]


@WORKLOADS.register("pycode")
def _pycode(data_dir: Path, n: int = 20) -> list[dict]:
    from draftsmith.data import stdlib_corpus  # lazy: only this workload needs the stdlib scan

    return [{"id": f"pycode-{p['id']}", "prompt": p["prompt"]} for p in stdlib_corpus.prompts("heldout", n=n)]


LONG_CONTEXT_CHARS = (0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@WORKLOADS.register("long_context")
def _long_context(data_dir: Path) -> list[dict]:
    """Real prompts extended with real text: each MT-bench first turn follows a slice of Wikipedia of
    each length in LONG_CONTEXT_CHARS (a different slice per prompt). select() takes the lengths
    round-robin, so the first n items cover every length."""
    wiki = _need(data_dir / "pretrain_text" / "wiki_demo.txt").read_text(encoding="utf-8")
    items = []
    for i, q in enumerate(_mt_bench(data_dir)):
        start = (i * 7919) % max(1, len(wiki) - max(LONG_CONTEXT_CHARS))
        for chars in LONG_CONTEXT_CHARS:
            prefix = wiki[start:start + chars] + "\n\n" if chars else ""
            items.append({"id": f"long_context-{q['id']}-{chars}", "prompt": prefix + q["prompt"],
                          "category": f"prefix-{chars}"})
    return items
@WORKLOADS.register("images")
def _images(data_dir: Path) -> list[dict]:
    from draftsmith.eval import image_workloads

    return image_workloads.generated()


def _need_user_file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"jsonl:{path}: no such file; give the path of a JSONL prompt file "
                                "(one JSON object a line with \"prompt\", \"messages\" or \"turns\")")
    return path


def _user_jsonl(path: Path) -> list[dict]:
    _need_user_file(path)
    items = []
    for i, r in enumerate(_jsonl(path)):
        if not isinstance(r, dict):  # a row `[1, 2]`: AttributeError on r.get before
            raise UserError(f"jsonl:{path}: row {i + 1} is a JSON {type(r).__name__}, not an object with \"prompt\", "
                            "\"messages\" or \"turns\"")
        item = {"id": str(r.get("id", r.get("question_id", f"row-{i}")))}
        if isinstance(r.get("prompt"), str):
            item["prompt"] = r["prompt"]
        elif isinstance(r.get("messages"), list) and r["messages"]:
            item["messages"] = r["messages"]
            item["prompt"] = r["messages"][-1]["content"]
        elif isinstance(r.get("turns"), list) and r["turns"]:
            item["prompt"] = r["turns"][0]
        else:
            raise UserError(f"{path} row {i + 1}: needs a string 'prompt', a 'messages' list or a 'turns' list")
        items.append(item)
    return items


def expand(names: list[str]) -> list[str]:
    """Workload names with groups (spec_bench) expanded; unknown names fail with a suggestion."""
    out: list[str] = []
    known = sorted(set(WORKLOADS.names()) | set(GROUPS))
    for name in names:
        if name not in known and not name.startswith(("jsonl:", "images:")):
            hint = difflib.get_close_matches(name, known, n=1)
            tip = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise UnknownNameError(f"unknown workload {name!r}{tip}; known: {', '.join(known)}, jsonl:PATH, images:DIR")
        if name.startswith("jsonl:"):
            _need_user_file(Path(name.split(":", 1)[1]))  # fail before the target loads
        if name.startswith("images:"):
            from draftsmith.eval import image_workloads

            image_workloads.check_folder(Path(name.split(":", 1)[1]))
        for concrete in GROUPS.get(name, [name]):
            if concrete not in out:
                out.append(concrete)
    return out


def select(items: list[dict], n: int | None) -> list[dict]:
    """The first n items, taken round-robin over categories when items have one (so that 8
    MT-bench prompts are one per category, not 8 writing prompts)."""
    if n is None or n >= len(items):
        return items
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_cat[item.get("category", "")].append(item)
    queues, out = list(by_cat.values()), []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out[:n]


def load(name: str, data_dir: Path | str | None = None, num_prompts: int | None = None) -> list[dict]:
    """The prompts of one concrete workload (see `expand` for groups)."""
    if name.startswith("jsonl:"):
        return select(_user_jsonl(Path(name.split(":", 1)[1])), num_prompts)
    if name.startswith("images:"):
        from draftsmith.eval import image_workloads

        return image_workloads.from_folder(Path(name.split(":", 1)[1]), num_prompts)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    if name == "pycode":
        return _pycode(data_dir, n=num_prompts or 20)
    return select(WORKLOADS.get(name)(data_dir), num_prompts)


def checkpoint_recipe(path: str | Path) -> dict | None:
    """The recipe a training checkpoint was made with (its config.yaml, parsed as data), or None."""
    from draftsmith.core.safe_yaml import load as load_yaml

    recipe = Path(path) / "config.yaml"
    return load_yaml(recipe.read_text(encoding="utf-8"), str(recipe)) if recipe.exists() else None


def training_prompt_format(recipe: dict | None, tokenizer) -> str:
    """The prompt format a checkpoint's drafter saw in training, which `--prompt-format auto` uses for it:
    plain text data -> raw; chat data -> the tokenizer's chat template when the recipe used it, else
    draftsmith's plain chat format (what training renders for a target without a template)."""
    data = (recipe or {}).get("data") or {}
    if data.get("format") == "text":
        return "raw"
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return "chat" if has_template and data.get("chat_template", "auto") == "auto" else "plain"


def encode(item: dict, tokenizer, prompt_format: str = "auto", max_tokens: int | None = None) -> tuple[torch.Tensor, bool]:
    """item -> ([n] prompt ids, truncated?).

    auto: the tokenizer's chat template when it has one (a chat target), else the raw text
    with the tokenizer's special tokens (a base target). plain: draftsmith's plain chat format
    (data/chat.py, what a base target's drafter was trained on). Prompts longer than
    max_tokens keep their LAST max_tokens tokens (the end is what the model continues).
    """
    from draftsmith.data import chat
    from draftsmith.data.formats import RowError

    if prompt_format not in PROMPT_FORMATS:
        raise UserError(f"prompt format {prompt_format!r} is not one of {PROMPT_FORMATS}")
    messages = item.get("messages") or [{"role": "user", "content": item["prompt"]}]
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" and not has_template:
        raise UserError("--prompt-format chat needs a tokenizer with a chat template; use auto, plain or raw")
    if prompt_format == "chat" or (prompt_format == "auto" and has_template):
        try:  # the target's own template: bounded in time and output (data/template_bounds.py)
            ids = chat.encode_prompt(tokenizer, messages, "auto")
        except RowError as exc:
            raise UserError(f"the target's chat template cannot render a prompt ({exc}); fix the template in its "
                             "tokenizer_config.json, or pass --prompt-format plain") from None
    elif prompt_format == "plain":
        ids = chat.encode_prompt(tokenizer, messages, "plain")
    else:
        ids = list(tokenizer(item["prompt"], verbose=False)["input_ids"])
    truncated = max_tokens is not None and len(ids) > max_tokens
    if truncated:
        ids = ids[-max_tokens:]
    return torch.tensor(ids, dtype=torch.long), truncated
