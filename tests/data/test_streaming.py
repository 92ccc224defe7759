"""data.streaming: rows read, tokenized and batched lazily. An epoch of the stream holds exactly
the rows the in-memory path trains on (heldout = the first rows), ranks split it, a resumed stream
continues with the identical batch, the report keeps read = used + skipped, and training runs."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.config import DataConfig
from draftsmith.data import build_dataset, streaming
from draftsmith.testing import TINY_CHAT_TEMPLATE, byte_tokenizer
from draftsmith.train.loop import train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "chat.jsonl"
    rows = [{"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i} " * (1 + i % 4)}]}
            for i in range(23)]
    rows.insert(5, {"conversations": [{"from": "human", "value": "no answer"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cfg(path, **kw):
    return DataConfig(path=[str(path)], max_length=32, eval_samples=3, streaming=True, shuffle_buffer=4, **kw)


def ids_of(batches):
    return [tuple(row[row != 0].tolist()) for b in batches for row in b["input_ids"]]


def test_one_epoch_is_the_training_rows_and_ranks_split_it(corpus):
    tok = byte_tokenizer(TINY_CHAT_TEMPLATE)
    source, heldout, report = streaming.open_stream(cfg(corpus), tok)
    full, _, _ = build_dataset(DataConfig(path=[str(corpus)], max_length=32, eval_samples=0), tok)
    rows = [tuple(x.tolist()) for x in full.input_ids]
    assert [tuple(x.tolist()) for x in heldout.input_ids] == rows[:3]  # heldout: the first rows of the stream
    stream = streaming.StreamBatchStream(source, batch_size=4, seed=0, shuffle_buffer=4)
    epoch = ids_of([next(stream) for _ in range(5)])  # 20 training rows = 5 batches of 4
    assert sorted(epoch) == sorted(rows[3:]) and epoch != rows[3:]  # all of them, shuffled
    assert (report.read, report.used, sum(report.skipped.values())) == (24, 23, 1)
    assert report.skipped == {"no assistant turn": 1}
    parts = [ids_of(list(streaming.StreamBatchStream(source, 4, 0, rank, 2, 0, 4)._batches(0))) for rank in (0, 1)]
    assert sorted(parts[0] + parts[1]) == sorted(rows[3:]) and not set(parts[0]) & set(parts[1])


def test_resume_continues_with_the_same_batch(corpus):
    tok = byte_tokenizer(TINY_CHAT_TEMPLATE)
    source, _, _ = streaming.open_stream(cfg(corpus), tok)
    a = streaming.StreamBatchStream(source, 3, seed=1, shuffle_buffer=4)
    for _ in range(9):  # past the end of epoch 0 (7 batches)
        next(a)
    state = a.state_dict()
    b = streaming.StreamBatchStream(source, 3, seed=1, shuffle_buffer=4)
    b.load_state_dict(state)
    for _ in range(3):
        assert torch.equal(next(a)["input_ids"], next(b)["input_ids"])


def test_training_on_a_stream(tiny_run, tmp_path):
    result = train(tiny_run("stream", "data.streaming=true", "train.max_steps=3", "data.shuffle_buffer=8"))
    assert len(result.losses) == 3 and all(torch.isfinite(torch.tensor(result.losses)))
    with pytest.raises(ValueError, match="needs train.max_steps"):
        train(tiny_run("stream2", "data.streaming=true", "train.max_steps=null"))
