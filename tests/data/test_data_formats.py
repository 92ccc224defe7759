"""Data formats: every kind of malformed row is counted by reason, reported with file:line and
skipped; good rows of each form are read; missing files and paths are clear errors."""
from __future__ import annotations

import json
import sys
import types

import pytest

from draftsmith.config import DataConfig
from draftsmith.data import build_dataset, chat, formats
from draftsmith.testing import byte_tokenizer

GOOD = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}

# (line content, expected reason) -- one malformed row of each kind
BAD_ROWS = [
    ('{"conversations": [{"from": "human", "value": "hi"}', formats.BAD_JSON),
    ('[1, 2]', formats.NOT_OBJECT),
    ('{"foo": 1}', formats.UNKNOWN_FORMAT),
    ('{"conversations": [{"value": "hi"}, {"from": "gpt", "value": "x"}]}', formats.MISSING_ROLE),
    ('{"conversations": [{"from": "bot", "value": "hi"}]}', formats.UNKNOWN_ROLE),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}', formats.MISSING_CONTENT),
    ('{"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "x"}]}', formats.EMPTY_TURN),
    ('{"messages": [{"role": "user", "content": "only a question"}]}', formats.NO_ASSISTANT),
    ('{"prompt": "write a poem"}', formats.PROMPT_ONLY),
    ('{"text": ""}', formats.EMPTY_TEXT),
]


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_each_malformed_row_is_reported_with_its_line_and_skipped(tmp_path):
    lines = [json.dumps(GOOD)]
    for content, _ in BAD_ROWS:
        lines += [content, json.dumps(GOOD)]
    path = _write(tmp_path / "mixed.jsonl", lines)
    train, heldout, report = build_dataset(DataConfig(path=[path], max_length=64), byte_tokenizer())
    assert report.read == len(BAD_ROWS) * 2 + 1
    assert report.used == len(BAD_ROWS) + 1 == len(train)
    assert sum(report.skipped.values()) == len(BAD_ROWS)
    for i, (_, reason) in enumerate(BAD_ROWS):
        line = 2 + 2 * i
        assert report.skipped[reason] >= 1, reason
        assert any(e.startswith(f"{path}:{line}: {reason}") for e in report.examples), (line, reason, report.examples)
    text = report.summary()
    assert f"rows read {report.read}, used {report.used}, skipped {len(BAD_ROWS)}" in text
    assert len(heldout) == 0


def test_empty_after_truncation_is_skipped(tmp_path):
    long_user = {"messages": [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "ok"}]}
    path = _write(tmp_path / "t.jsonl", [json.dumps(long_user), json.dumps(GOOD)])
    train, _, report = build_dataset(DataConfig(path=[path], max_length=32), byte_tokenizer())
    assert len(train) == 1 and report.skipped[chat.EMPTY_AFTER_TRUNCATION] == 1
    assert report.examples[0].startswith(f"{path}:1: empty after truncation")


def test_json_list_rows_keep_their_line_numbers(tmp_path):
    rows = [GOOD, {"conversations": [{"from": "alien", "value": "hi"}]}, GOOD]
    path = tmp_path / "list.json"
    path.write_text(json.dumps(rows, indent=2))
    starts = [n for n, line in enumerate(path.read_text().splitlines(), start=1) if line == "  {"]
    expected_line = starts[1]  # the second element starts here (line 14)
    _, _, report = build_dataset(DataConfig(path=[str(path)]), byte_tokenizer())
    assert report.used == 2 and report.skipped[formats.UNKNOWN_ROLE] == 1
    assert report.examples[0].startswith(f"{path}:{expected_line}: unknown role")


def test_forms_openai_sharegpt_alpaca_dpo_qa_and_text(tmp_path):
    rows = [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "q"}]},
                      {"role": "assistant", "content": "a"}]},
        {"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "good"}},
        {"instruction": "add", "input": "1+1", "output": "2", "history": [["hi", "hello"]]},
        {"question": "2+2?", "answer": "4"},
        {"text": "a plain document"},
    ]
    path = _write(tmp_path / "forms.jsonl", [json.dumps(r) for r in rows])
    parsed = [row for _, row, err in formats.iter_rows([path]) if err is None]
    assert [r.form for r in parsed] == ["openai", "sharegpt", "alpaca", "qa", "text"]
    assert parsed[0].messages[1]["content"] == "q"
    assert parsed[1].messages[-1] == {"role": "assistant", "content": "good"}
    assert [m["role"] for m in parsed[2].messages] == ["user", "assistant", "user", "assistant"]
    assert parsed[2].messages[2]["content"] == "add\n\n1+1"
    _, _, report = build_dataset(DataConfig(path=[path]), byte_tokenizer())
    assert report.used == 5 and not report.skipped


def test_forced_format_rejects_other_forms(tmp_path):
    path = _write(tmp_path / "f.jsonl", [json.dumps(GOOD), json.dumps({"messages": GOOD["conversations"]})])
    _, _, report = build_dataset(DataConfig(path=[path], format="sharegpt"), byte_tokenizer())
    assert report.used == 1 and report.skipped[formats.WRONG_FORMAT] == 1


def test_prompts_format_keeps_user_turns_only(tmp_path):
    path = _write(tmp_path / "p.jsonl", [json.dumps(GOOD), json.dumps({"turns": ["a", "b"]})])
    rows = [row for _, row, _ in formats.iter_rows([path], "prompts")]
    assert [[m["role"] for m in r.messages] for r in rows] == [["user"], ["user", "user"]]
    assert all(r.kind == "prompt" for r in rows)


def test_missing_file_names_the_path_and_the_fix(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="nope.jsonl.*data.path"):
        build_dataset(DataConfig(path=[missing]), byte_tokenizer())
    with pytest.raises(FileNotFoundError, match="matches no file"):
        build_dataset(DataConfig(path=[str(tmp_path / "*.jsonl")]), byte_tokenizer())
    with pytest.raises(ValueError, match="data.path is empty"):
        build_dataset(DataConfig(path=[]), byte_tokenizer())


def test_text_files_are_chunked_with_loss_on_every_token(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("abcdefghij" * 5)  # 50 bytes -> bos + 50 + eos = 52 tokens
    train, _, report = build_dataset(DataConfig(path=[str(path)], text_chunk_tokens=20), byte_tokenizer())
    lengths = [len(train[i]["input_ids"]) for i in range(len(train))]
    assert lengths == [20, 20, 12] and report.used == 1 and report.samples == 3
    for i in range(len(train)):
        assert train[i]["loss_mask"].tolist() == [0] + [1] * (lengths[i] - 1)


def test_stdlib_paths_read_the_corpus_module_lazily(tmp_path, monkeypatch):
    fake = types.ModuleType("draftsmith.data.stdlib_corpus")
    calls = []

    def documents(split):
        calls.append(split)
        yield "a.py", "import os\n" * 3
        yield "b.py", "x = 1\n"

    fake.documents = documents
    monkeypatch.setitem(sys.modules, "draftsmith.data.stdlib_corpus", fake)
    import draftsmith.data as data_pkg

    monkeypatch.setattr(data_pkg, "stdlib_corpus", fake, raising=False)
    train, _, report = build_dataset(DataConfig(path=["stdlib:drafter"], text_chunk_tokens=64), byte_tokenizer())
    assert calls == ["drafter"] and report.read == 2 and len(train) == 2
    assert train[0]["id"] == "stdlib:drafter:a.py"
    assert all(train[i]["loss_mask"][1:].all() for i in range(2))


def test_max_samples_and_eval_samples(tmp_path):
    path = _write(tmp_path / "g.jsonl", [json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                                 {"role": "assistant", "content": f"a{i}"}]})
                                         for i in range(10)])
    train, heldout, report = build_dataset(DataConfig(path=[path], max_samples=6, eval_samples=2), byte_tokenizer())
    assert (len(train), len(heldout)) == (4, 2) and report.stopped_at_max_samples
    assert heldout[1]["id"] == f"{path}:6"  # ids carry the path as given: unique over folders
    with pytest.raises(ValueError, match="no usable training sequences"):
        build_dataset(DataConfig(path=[path], eval_samples=10), byte_tokenizer())
