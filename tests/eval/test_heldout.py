"""Evaluation prompts are held out of the regeneration prompts by text (draftsmith/eval/heldout.py,
scripts/build_regen_prompts.py): the first N of every workload, wherever a copy of one sits
(Spec-Bench copies MT-bench and GSM8K questions), while later rows of the same files are used."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from draftsmith.eval import heldout, workloads
from tests.helpers import load_repo_module

ROOT = Path(__file__).resolve().parents[2]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def _data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    _write_jsonl(d / "humaneval" / "HumanEval.jsonl.gz",
                 [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n    pass\n"} for i in range(4)])
    _write_jsonl(d / "gsm8k" / "test.jsonl", [{"question": f"How many apples {i}?", "answer": "1"} for i in range(4)])
    cats = ["writing", "writing", "roleplay", "roleplay"]  # round-robin: the first 2 are rows 0 and 2
    _write_jsonl(d / "mt_bench" / "question.jsonl",
                 [{"question_id": 81 + i, "category": c, "turns": [f"MT question {i}", "next"]} for i, c in enumerate(cats)])
    _write_jsonl(d / "mt_bench" / "vicuna_bench_question.jsonl", [{"question_id": 1, "turns": ["vicuna only"]}])
    (d / "alpaca").mkdir(parents=True)
    (d / "alpaca" / "alpaca_en_demo.json").write_text(json.dumps(
        [{"instruction": f"Do task {i}.", "input": "with input" if i == 0 else "", "output": "x"} for i in range(4)]))
    spec = [{"question_id": 1, "category": "writing", "turns": ["MT   question 0"]},  # a copy, other whitespace
            {"question_id": 2, "category": "math_reasoning", "turns": ["How many apples 1?"]},  # a held-out copy
            {"question_id": 3, "category": "math_reasoning", "turns": ["spec math A"]},
            {"question_id": 4, "category": "math_reasoning", "turns": ["spec math B"]},
            {"question_id": 5, "category": "qa", "turns": ["spec qa A"]},
            {"question_id": 6, "category": "qa", "turns": ["spec qa B"]},
            {"question_id": 7, "category": "qa", "turns": ["spec qa C"]}]
    _write_jsonl(d / "spec_bench" / "question.jsonl", spec)
    (d / "chat_corpus").mkdir(parents=True)
    (d / "chat_corpus" / "lima.json").write_text(json.dumps(
        [{"instruction": "How many apples 0?", "input": "", "output": "a", "history": []},  # an eval prompt in LIMA
         {"instruction": "lima only", "input": "", "output": "a", "history": []}]))
    (d / "chat_corpus" / "dpo_en_demo.json").write_text(json.dumps(
        [{"conversations": [{"from": "human", "value": "dpo only"}], "chosen": {}, "rejected": {}}]))
    return d


def _builder():
    return load_repo_module("scripts/build_regen_prompts.py")


def test_eval_prompt_texts_are_what_eval_takes(tmp_path):
    d = _data_dir(tmp_path)
    held = heldout.eval_prompt_texts(["gsm8k", "mt_bench", "alpaca"], 2, d)
    taken = {heldout.normalize(i["prompt"]) for name in ("gsm8k", "mt_bench", "alpaca") for i in workloads.load(name, d, 2)}
    assert held == taken
    assert "MT question 2" in held and "MT question 1" not in held  # round-robin over categories
    assert "Do task 0. with input" in held  # instruction + input, whitespace collapsed


def test_build_drops_every_eval_prompt_and_its_copies(tmp_path):
    d = _data_dir(tmp_path)
    rows, counts = _builder().build(d, holdout=2, caps={s: 100 for s in
                                                        ("humaneval", "gsm8k", "mt_bench", "vicuna_bench", "alpaca",
                                                         "spec_bench", "lima", "dpo")}, max_chars=1000)
    texts = [heldout.normalize(heldout.user_text(r)) for r in rows]
    for name in ("humaneval", "gsm8k", "mt_bench", "alpaca", "spec_bench/math_reasoning", "spec_bench/qa"):
        for item in workloads.load(name, d, 2):
            assert heldout.normalize(item["prompt"]) not in texts, (name, item["prompt"])
    # later rows of the same files are kept, once each
    for kept in ("How many apples 2?", "MT question 1", "Do task 3.", "def f3(): pass", "spec qa C", "lima only",
                 "dpo only", "vicuna only"):
        assert texts.count(kept) == 1, kept
    assert counts["spec_bench"][1] == 5  # the two copies and the first 2 of math_reasoning and qa
    assert counts["lima"][1] == 1
    lengths = [len(heldout.user_text(r)) for r in rows]
    assert lengths == sorted(lengths)  # shortest first: a regeneration batch pads little


def test_minus_leaves_out_what_the_first_rows_of_a_smaller_build_hold(tmp_path):
    d = _data_dir(tmp_path)
    builder = _builder()
    caps = {s: 100 for s in ("humaneval", "gsm8k", "mt_bench", "vicuna_bench", "alpaca", "spec_bench", "lima", "dpo")}
    rows, _ = builder.build(d, holdout=2, caps=caps, max_chars=1000)
    smaller = tmp_path / "smaller.jsonl"
    _write_jsonl(smaller, rows[:5])
    rest = builder.without_rows_of(rows, f"{smaller}:3")
    assert rest == rows[3:]  # the first 3 rows of the file are left out, its rows 4-5 are not
    assert builder.without_rows_of(rows, str(smaller)) == rows[5:]  # no :N, every row of the file
