"""Data through `datasets`: hf:ORG/NAME served offline from a local hub cache built here (and a
clear error when it is not cached), parquet / arrow files, save_to_disk folders; tokenization
through Dataset.map(num_proc) equal to the in-process path, with the same row accounting, and not
repeated on a second run; streaming with the same accounting."""
from __future__ import annotations

import dataclasses
import json

import pytest

from draftsmith.config import DataConfig
from draftsmith.data import build_dataset, hf_sources, hf_tokenize
from draftsmith.data.dataset import DataReport
from draftsmith.testing import TINY_CHAT_TEMPLATE, byte_tokenizer

datasets = pytest.importorskip("datasets")

GOOD = [{"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i} " * 3}]}
        for i in range(8)]
BAD = [{"conversations": [{"from": "human", "value": "no answer"}]},  # no assistant turn
       {"conversations": [{"from": "robot", "value": "x"}, {"from": "gpt", "value": "y"}]}]  # unknown role
ROWS = GOOD[:3] + BAD[:1] + GOOD[3:6] + BAD[1:] + GOOD[6:]  # bad rows at indexes 3 and 7


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(TINY_CHAT_TEMPLATE)


def cfg(*paths, **kw) -> DataConfig:
    return DataConfig(path=[str(p) for p in paths], **{"max_length": 64, **kw})


def as_lists(ds):
    return [x.tolist() for x in ds.input_ids], [m.tolist() for m in ds.loss_mask], list(ds.ids)


def check_accounting(report, source: str):
    assert (report.read, report.used, sum(report.skipped.values())) == (10, 8, 2)
    assert report.skipped == {"no assistant turn": 1, "unknown role": 1}
    assert report.examples[0].startswith(f"{source}:3: ") and report.examples[1].startswith(f"{source}:7: ")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A Hugging Face hub cache holding dataset acme/chats (revision main -> commit abc123), as a download leaves it."""
    root = tmp_path_factory.mktemp("hf-home")
    repo = root / "hub" / "datasets--acme--chats"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    data = repo / "snapshots" / "abc123" / "data"
    data.mkdir(parents=True)
    datasets.Dataset.from_list(ROWS).to_parquet(str(data / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(GOOD[:2]).to_parquet(str(data / "test-00000-of-00001.parquet"))
    return root


def test_hf_dataset_offline_from_the_local_cache(hub_cache, tok, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train, _, report = build_dataset(cfg("hf:acme/chats"), tok)
    check_accounting(report, "hf:acme/chats[train]")
    assert len(train) == 8 and train.ids[0] == "hf:acme/chats[train]:0"
    test, _, _ = build_dataset(cfg("hf:acme/chats?split=test&revision=main"), tok)
    assert len(test) == 2
    with pytest.raises(FileNotFoundError, match=r"acme/missing is not in the local cache .*huggingface-cli download"):
        build_dataset(cfg("hf:acme/missing"), tok)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['splt'\]"):
        build_dataset(cfg("hf:acme/chats?splt=test"), tok)


def test_parquet_arrow_and_saved_folders_match_jsonl(tmp_path, tok):
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "chat.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "saved_dict"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    ref, _, ref_report = build_dataset(cfg(jsonl), tok)
    for path, source in ((tmp_path / "chat.parquet", "chat.parquet"), (arrow, arrow.name), (tmp_path / "saved", "saved"),
                         (f"{tmp_path / 'saved_dict'}?split=train", "saved_dict")):
        got, _, report = build_dataset(cfg(path), tok)
        check_accounting(report, source)
        assert as_lists(got)[:2] == as_lists(ref)[:2]  # same tokens and masks as the JSONL copy
    with pytest.raises(ValueError, match=r"splits \['train', 'test'\], not 'dev'"):
        build_dataset(cfg(f"{tmp_path / 'saved_dict'}?split=dev"), tok)


def test_datasets_map_equals_in_process_and_caches(tmp_path, tok, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "ds-cache"))
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "{not json\n")
    ref, _, ref_report = build_dataset(cfg(jsonl), tok)
    assert ref_report.read == 11 and ref_report.skipped["bad JSON"] == 1
    for num_proc in (1, 2):
        got, _, report = build_dataset(cfg(jsonl, num_proc=num_proc), tok)
        assert as_lists(got) == as_lists(ref)
        assert (report.read, report.used, dict(report.skipped), report.examples) == (
            ref_report.read, ref_report.used, dict(ref_report.skipped), ref_report.examples)
        assert report.tokenized_from_cache is (num_proc == 2)  # the second run loads the first run's tokens
    _, _, report = build_dataset(cfg(jsonl, num_proc=2), tok)  # num_proc 2 shards: found too
    assert report.tokenized_from_cache is True
    other, _, report = build_dataset(cfg(jsonl, num_proc=1, max_length=32), tok)  # another recipe: tokenized again
    assert report.tokenized_from_cache is False and max(len(x) for x in other.input_ids) <= 32
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:5]))  # the data changed: tokenized again
    _, _, report = build_dataset(cfg(jsonl, num_proc=1), tok)
    assert report.tokenized_from_cache is False and report.read == 5


def test_streaming_keeps_the_accounting(tmp_path, tok):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "chat.parquet"))
    ref, _, _ = build_dataset(cfg(tmp_path / "chat.parquet"), tok)
    report = DataReport()
    rows = list(hf_tokenize.stream_rows(cfg(tmp_path / "chat.parquet"), tok, report))
    check_accounting(report, "chat.parquet")
    assert [r["input_ids"].tolist() for r in rows] == as_lists(ref)[0]
    assert hf_sources.is_dataset_source(str(tmp_path / "chat.parquet"))
    assert dataclasses.replace(cfg(), num_proc=3).num_proc == 3
