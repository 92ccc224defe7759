"""Training on a corpus read as a stream (data.streaming: true), for corpora larger than memory:
rows are read, rendered and tokenized lazily (hf_tokenize.stream_rows) and batched as they come;
nothing but a shuffle buffer is held.

  - heldout: the first data.eval_samples sequences (kept in memory, as the in-memory path keeps
    the last ones: a stream has no known end);
  - draft vocabulary counts: over the first VOCAB_ROWS training sequences;
  - order: a seeded shuffle buffer of data.shuffle_buffer sequences per epoch; rank r of W takes
    the training sequences r, r + W, ... of the stream;
  - train.max_steps is required (the number of rows is unknown);
  - resume: state_dict() holds (epoch, micro-batches taken); load_state_dict() replays the same
    seeded stream up to that point, so the next batch is the one the interrupted run would have seen.
"""
from __future__ import annotations

import itertools
import random
from typing import Iterator

import torch

from draftsmith.core.errors import UserError
from draftsmith.data.dataset import DataReport, TokenDataset, collate

VOCAB_ROWS = 10_000


class StreamingSource:
    """The training part of a streamed corpus; iterate `epoch(e)` for the sequences of one pass."""

    def __init__(self, data_cfg, tokenizer, report: DataReport):
        self.data_cfg, self.tokenizer, self.report = data_cfg, tokenizer, report
        self.skip = data_cfg.eval_samples

    def sequences(self, report: DataReport | None = None) -> Iterator[dict]:
        from draftsmith.data import hf_tokenize

        rows = hf_tokenize.stream_rows(self.data_cfg, self.tokenizer, report if report is not None else DataReport())
        if self.data_cfg.max_samples is not None:
            rows = itertools.islice(rows, self.data_cfg.max_samples)
        return rows

    def training(self, report: DataReport | None = None) -> Iterator[dict]:
        return itertools.islice(self.sequences(report), self.skip, None)


def open_stream(data_cfg, tokenizer) -> tuple[StreamingSource, TokenDataset, DataReport]:
    """(training source, heldout rows, report of the rows read so far)."""
    report = DataReport(renderer="streaming")  # filled by the first training pass (heldout rows included)
    source = StreamingSource(data_cfg, tokenizer, report)
    held = list(itertools.islice(source.sequences(DataReport()), data_cfg.eval_samples))
    if len(held) < data_cfg.eval_samples:
        raise UserError(f"data.path {list(data_cfg.path)}: only {len(held)} sequence(s) in the stream, "
                         f"data.eval_samples={data_cfg.eval_samples}; lower data.eval_samples")
    heldout = TokenDataset([h["input_ids"].int() for h in held], [h["loss_mask"].to(torch.uint8) for h in held],
                           [h["id"] for h in held])
    return source, heldout, report


def token_counts(source: StreamingSource, vocab_size: int) -> torch.Tensor:
    """[V] frequencies of training targets over the first VOCAB_ROWS training sequences."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    seen = 0
    for item in itertools.islice(source.training(), VOCAB_ROWS):
        targets = item["input_ids"][item["loss_mask"].bool()]
        if len(targets) and int(targets.max()) >= vocab_size:
            raise UserError(f"row {item['id']} has token id {int(targets.max())} >= vocab_size {vocab_size}; "
                             "the data was tokenized for another target")
        counts += torch.bincount(targets, minlength=vocab_size)
        seen += 1
    if seen == 0:
        raise UserError(f"data.path {list(source.data_cfg.path)}: no training sequences in the stream after the "
                         f"{source.skip} heldout ones (see the data report)")
    return counts


def check(cfg) -> None:
    """Recipe checks for data.streaming (the row count is unknown; features come from the target)."""
    if not cfg.train.max_steps:
        raise UserError("data.streaming: true needs train.max_steps (a stream has no known length); set e.g. "
                         "train.max_steps=1000")
    if cfg.features.mode == "offline":
        raise UserError("data.streaming: true reads rows lazily, features.mode: offline needs every row cached "
                         "first; use features.mode: online, or build the cache from a non-streaming recipe")
    if cfg.data.num_proc:
        raise UserError("data.streaming: true tokenizes lazily in this process; unset data.num_proc")


def batch_stream(train_set, batch_size: int, seed: int, rank: int, world_size: int, pad_id: int, shuffle_buffer: int):
    """The training loop's micro-batch iterator: streamed (StreamingSource) or in memory (BatchStream)."""
    from draftsmith.data.dataset import BatchStream

    if isinstance(train_set, StreamingSource):
        return StreamBatchStream(train_set, batch_size, seed, rank, world_size, pad_id, shuffle_buffer)
    return BatchStream(train_set, batch_size, seed, rank, world_size, pad_id)


class StreamBatchStream:
    """Infinite iterator of collated micro-batches for one rank, from a StreamingSource."""

    def __init__(self, source: StreamingSource, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                 pad_id: int = 0, shuffle_buffer: int = 1024):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.source, self.batch_size, self.seed = source, batch_size, seed
        self.rank, self.world_size, self.pad_id, self.buffer = rank, world_size, pad_id, max(1, shuffle_buffer)
        self.epoch, self.taken = 0, 0
        self._it: Iterator[dict] | None = None

    def _epoch_items(self, epoch: int) -> Iterator[dict]:
        """This rank's sequences of one pass, through a seeded shuffle buffer."""
        rng = random.Random(self.seed + epoch)
        mine = itertools.islice(self.source.training(self.source.report if epoch == 0 else None),
                                self.rank, None, self.world_size)
        buf: list[dict] = []
        for item in mine:
            buf.append(item)
            if len(buf) >= self.buffer:
                yield buf.pop(rng.randrange(len(buf)))
        rng.shuffle(buf)
        yield from buf

    def _batches(self, epoch: int) -> Iterator[dict]:
        items = self._epoch_items(epoch)
        while True:
            chunk = list(itertools.islice(items, self.batch_size))
            if not chunk:
                return
            yield collate(chunk, self.pad_id)

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        for _ in range(2):
            if self._it is None:
                self._it = self._batches(self.epoch)
            batch = next(self._it, None)
            if batch is not None:
                self.taken += 1
                return batch
            self.epoch, self.taken, self._it = self.epoch + 1, 0, None
        raise UserError("the stream has no training sequences on this rank; check data.path and data.eval_samples")

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.taken, "streaming": True}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.taken, self._it = int(state["epoch"]), 0, None
        for _ in range(int(state["position"])):  # replay the seeded stream to the same point
            self._it = self._it or self._batches(self.epoch)
            next(self._it)
            self.taken += 1
