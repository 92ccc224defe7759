"""Answers kept as a file (regenerate.generator: answers): a regeneration packed by prompt and replayed gives
the same output rows, with no model; prompts it does not hold are error rows; a damaged file is one line."""
from __future__ import annotations

import gzip
import json

import pytest

from draftsmith.config import RegenerateConfig
from draftsmith.core.errors import UserError
from draftsmith.data import regenerate, shipped_answers
from draftsmith.data.regenerate import Result


class Echo:
    """A generator whose answer depends on the whole history (so each turn of a row gets its own)."""

    def settings(self):
        return {"generator": "echo", "max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0}

    def generate(self, histories):
        return [Result("ok", f"answer to {len(h)} turns ending {h[-1]['content']!r}") for h in histories]


def _prompts(tmp_path, n=5):
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(n)]
    rows.append({"turns": ["first turn", "second turn"]})  # multi-turn: one answer per turn
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _regenerated(tmp_path, prompts):
    out = tmp_path / "made" / "answers.jsonl"
    regenerate.regenerate([prompts], Echo(), str(out), log=lambda *_: None)
    return out


def _replay(tmp_path, prompts, packed, **rc):
    cfg = RegenerateConfig(generator="answers", answers_file=str(packed), max_new_tokens=16, **rc)
    out = tmp_path / "replayed" / "answers.jsonl"
    summary = regenerate.regenerate([prompts], regenerate.AnswersGenerator(cfg), str(out), log=lambda *_: None)
    return summary, out


def test_packed_answers_replay_the_same_rows(tmp_path):
    prompts = _prompts(tmp_path)
    made = _regenerated(tmp_path, prompts)
    packed = tmp_path / "answers.jsonl.gz"
    header = shipped_answers.pack(made, packed)
    assert (header["rows"], header["answers"]) == (6, 7)  # 5 one-turn rows, one two-turn row
    assert header["answered_by"]["generator"] == "echo"
    again = tmp_path / "again.jsonl.gz"
    shipped_answers.pack(made, again)
    assert again.read_bytes() == packed.read_bytes()  # the same answers, the same bytes
    summary, out = _replay(tmp_path, prompts, packed)
    assert (summary.success, summary.error) == (6, 0)
    assert [json.loads(x)["messages"] for x in out.read_text().splitlines()] == \
           [json.loads(x)["messages"] for x in made.read_text().splitlines()]
    assert json.loads((out.parent / "answers.jsonl.summary.json").read_text())["settings"]["generator"] == "answers"


def test_a_prompt_without_an_answer_is_an_error_row_not_a_drop(tmp_path):
    prompts = _prompts(tmp_path)
    packed = tmp_path / "answers.jsonl.gz"
    shipped_answers.pack(_regenerated(tmp_path, prompts), packed)
    with open(prompts, "a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "a question nobody answered"}]}) + "\n")
    summary, out = _replay(tmp_path, prompts, packed)
    assert (summary.input, summary.success, summary.error) == (7, 6, 1)
    assert "no answer in answers.jsonl.gz" in summary.examples[0]
    assert len(out.read_text().splitlines()) == 6


def test_other_generation_settings_are_refused_in_one_line(tmp_path):
    prompts = _prompts(tmp_path)
    packed = tmp_path / "answers.jsonl.gz"
    shipped_answers.pack(_regenerated(tmp_path, prompts), packed)
    with pytest.raises(UserError, match=r"regenerate.temperature is 0.7 but .* generated with 0.0"):
        _replay(tmp_path, prompts, packed, temperature=0.7)


def _gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("case,match", [
    ("not gzip", "not a complete gzip file"),
    ("cut", "not a complete gzip file"),
    ("no header", "not a draftsmith-answers version 1 header"),
    ("count", "the header counts 2 answers but the file holds 1"),
    ("bad row", ":2: needs a 64-character"),
    ("two answers", "has two different answers"),
])
def test_damaged_answers_files_are_one_line(tmp_path, case, match):
    head = json.dumps({"format": "draftsmith-answers", "version": 1, "answered_by": {}, "rows": 1, "answers": 1})
    row = json.dumps({"key": "a" * 64, "answer": "x"})
    path = tmp_path / "a.jsonl.gz"
    if case == "not gzip":
        path.write_text("plain text")
    elif case == "cut":
        _gz(path, [head, row])
        path.write_bytes(path.read_bytes()[:-6])
    elif case == "no header":
        _gz(path, [row])
    elif case == "count":
        _gz(path, [head.replace('"answers": 1', '"answers": 2'), row])
    elif case == "bad row":
        _gz(path, [head, json.dumps({"key": "short", "answer": "x"})])
    else:
        _gz(path, [head, row, json.dumps({"key": "a" * 64, "answer": "y"})])
    with pytest.raises(UserError, match=match):
        shipped_answers.read_answers(path)


def test_a_gzip_bomb_stops_at_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(shipped_answers, "MAX_TEXT_BYTES", 1 << 20)
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb") as f:
        for _ in range(8):
            f.write(b" " * (1 << 20))
    assert path.stat().st_size < 64 << 10
    with pytest.raises(UserError, match="decompresses to more than 1,048,576 bytes"):
        shipped_answers.read_answers(path)


def test_the_shipped_smollm2_answers_answer_every_prompt_of_the_recipe(tmp_path, monkeypatch):
    """recipes/cpu/eagle3-smollm2-135m.yaml trains without a server: its prompts, rebuilt from ../shared, all
    find their answer in data/regenerated/ (a changed corpus or prompt builder would show up here)."""
    import subprocess
    import sys

    from tests.conftest import REPO, SHARED, shared_path

    shared_path("data", "chat_corpus", "lima.json")
    from draftsmith import config

    cfg = config.load(str(REPO / "recipes" / "cpu" / "eagle3-smollm2-135m.yaml"))
    assert cfg.regenerate.generator == "answers"
    monkeypatch.chdir(tmp_path)  # the recipe's prompt paths are relative to where it runs
    extra, base = (tmp_path / path for path in cfg.data.path)  # what --scale 10 adds, then the --scale 2.5 rows
    build = [sys.executable, str(REPO / "scripts" / "build_regen_prompts.py"), "--data-dir", str(SHARED / "data")]
    subprocess.run([*build, "--scale", "2.5", "--out", str(base)], check=True, capture_output=True)
    subprocess.run([*build, "--scale", "10", "--minus", f"{base}:1648", "--out", str(extra)], check=True,
                   capture_output=True)
    rc = cfg.regenerate
    answers = regenerate.AnswersGenerator(
        RegenerateConfig(generator="answers", answers_file=str(REPO / rc.answers_file),
                         max_new_tokens=rc.max_new_tokens, temperature=rc.temperature))
    summary = regenerate.regenerate(cfg.data.path, answers, str(tmp_path / "answers.jsonl"), limit=rc.limit,
                                    log=lambda *_: None)
    assert (summary.input, summary.success, summary.error) == (rc.limit, rc.limit, 0)
    # the held-out rows (the last eval_samples) are the last of the --scale 2.5 file's first 1,648, as before
    assert len(extra.read_text().splitlines()) == rc.limit - 1648
    base_rows = [json.loads(line)["messages"] for line in base.read_text().splitlines()][:1648]
    written = [json.loads(line)["messages"] for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    held = cfg.data.eval_samples
    assert [m[:-1] for m in written[-held:]] == base_rows[-held:]
