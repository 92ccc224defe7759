"""Token datasets for training: build_dataset, collate, BatchStream (sharded, resumable) and
token_counts (for the reduced draft vocabulary).

    train, heldout, report = build_dataset(cfg.data, target.tokenizer)
    print(report.summary())
    stream = BatchStream(train, batch_size=4, seed=0, rank=0, world_size=1, pad_id=0)
    batch = next(stream)   # {"input_ids": [b, s], "attention_mask": [b, s], "loss_mask": [b, s]}
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch

from draftsmith.core.errors import UserError
from draftsmith.data import chat, formats
from draftsmith.data.encode import encode_row

MAX_EXAMPLES = 10


class TokenDataset(torch.utils.data.Dataset):
    """Rows of token ids and loss masks; item i -> {"input_ids": [s], "loss_mask": [s], "id": str}. A row with
    images also has its processor's tensors (data/images.py): per-token ones ("token_type_ids" [s]) as keys of
    the item, per-image ones under "media" ({"pixel_values": ..., "image_grid_thw": ...})."""

    def __init__(self, input_ids: list[torch.Tensor], loss_mask: list[torch.Tensor], ids: list[str],
                 media: list[dict | None] | None = None):
        assert len(input_ids) == len(loss_mask) == len(ids)
        self.input_ids = input_ids
        self.loss_mask = loss_mask
        self.ids = ids
        self.media = media if media is not None and any(m for m in media) else None  # None: a text-only set

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        item = {"input_ids": self.input_ids[i].long(), "loss_mask": self.loss_mask[i].long(), "id": self.ids[i]}
        if self.media is not None and self.media[i]:
            from draftsmith.data.images import SEQUENCE_KEYS

            item.update({k: v for k, v in self.media[i].items() if k in SEQUENCE_KEYS})
            item["media"] = {k: v for k, v in self.media[i].items() if k not in SEQUENCE_KEYS}
        return item

    def subset(self, start: int, end: int) -> "TokenDataset":
        media = None if self.media is None else self.media[start:end]
        return TokenDataset(self.input_ids[start:end], self.loss_mask[start:end], self.ids[start:end], media)

    def joined(self, other: "TokenDataset") -> "TokenDataset":
        """This dataset's rows, then other's (images kept)."""
        media = None if self.media is None and other.media is None else \
            (self.media or [None] * len(self)) + (other.media or [None] * len(other))
        return TokenDataset(self.input_ids + other.input_ids, self.loss_mask + other.loss_mask, self.ids + other.ids,
                            media)

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(sum(int(m.sum()) for m in self.loss_mask))


@dataclass
class DataReport:
    """What build_dataset read, used and skipped (by reason, with the first bad rows)."""

    files: list[str] = field(default_factory=list)
    renderer: str = ""
    read: int = 0  # rows read: conversations, JSON rows, text documents
    used: int = 0  # rows that gave at least one training sequence
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # first MAX_EXAMPLES "file:line: reason: detail"
    truncated: int = 0  # used rows cut to data.max_length
    samples: int = 0  # sequences (a text document gives one per chunk)
    train_samples: int = 0
    heldout_samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    stopped_at_max_samples: bool = False
    tokenized_from_cache: Optional[bool] = None  # datasets path (data.num_proc >= 1): loaded, not tokenized again

    def skip(self, source: str, err: formats.RowError) -> None:
        self.skipped[err.reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{source}: {err}")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "skipped": dict(self.skipped)}

    def summary(self) -> str:
        lines = [
            f"data: {len(self.files)} file(s), renderer: {self.renderer}",
            f"  rows read {self.read}, used {self.used}, skipped {sum(self.skipped.values())}"
            + (" (stopped at data.max_samples)" if self.stopped_at_max_samples else ""),
        ]
        for reason, n in self.skipped.most_common():
            lines.append(f"    skipped {n:>6}  {reason}")
        lines.append(f"  sequences {self.samples} (train {self.train_samples}, heldout {self.heldout_samples}), "
                     f"truncated rows {self.truncated}")
        share = self.loss_tokens / max(1, self.tokens)
        lines.append(f"  tokens {self.tokens}, loss tokens {self.loss_tokens} ({share:.1%})")
        if self.tokenized_from_cache is not None:
            lines.append("  tokenized through datasets: " + ("loaded from its cache" if self.tokenized_from_cache
                                                           else "tokenized now (cached for the next run)"))
        if self.examples:
            lines.append("  first bad rows:")
            lines.extend(f"    {e}" for e in self.examples)
        return "\n".join(lines)


def build_dataset(data_cfg, tokenizer, processor=None) -> tuple[TokenDataset, TokenDataset, DataReport]:
    """Read data_cfg.path, render and tokenize every row, skip malformed ones (counted by reason).
    processor: a vision-language target's (Target.processor): rows with images go through it.

    Returns (train, heldout, report); heldout is the last data_cfg.eval_samples sequences.
    Raises ValueError (with the report) when nothing usable remains.
    """
    chat.check_tokenizer(tokenizer)
    report = DataReport(files=formats.expand_paths(list(data_cfg.path)),
                        renderer=chat.renderer_name(tokenizer, data_cfg.chat_template))
    input_ids: list[torch.Tensor] = []
    loss_mask: list[torch.Tensor] = []
    ids: list[str] = []
    media: list[dict | None] = []
    num_proc = getattr(data_cfg, "num_proc", 0) or 0
    rows = () if num_proc >= 1 else formats.iter_rows(report.files, data_cfg.format)
    if num_proc >= 1:  # the datasets path: Dataset.map(num_proc), fingerprint-cached (hf_tokenize.py)
        from draftsmith.data import hf_tokenize

        input_ids, loss_mask, ids = hf_tokenize.build(data_cfg, tokenizer, report, num_proc)
        from draftsmith.data.images import TEXT_TARGET

        if processor is not None and report.skipped.get(TEXT_TARGET):
            raise UserError(f"data.num_proc={num_proc} tokenizes text rows only (through datasets.map), and "
                            f"{report.skipped[TEXT_TARGET]} row(s) of data.path have images: set data.num_proc 0 to "
                            "train on them (their images go through the target's processor)")
    for raw, row, err in rows:
        report.read += 1
        if err is None:
            try:
                pieces, truncated = encode_row(row, tokenizer, data_cfg, processor)
            except formats.RowError as exc:
                err = exc
        if err is not None:
            report.skip(raw.source, err)
            continue
        report.used += 1
        report.truncated += int(truncated)
        for k, (seq, mask, *row_media) in enumerate(pieces):
            input_ids.append(torch.tensor(seq, dtype=torch.int32))
            loss_mask.append(torch.tensor(mask, dtype=torch.uint8))
            ids.append(row.row_id if len(pieces) == 1 else f"{row.row_id}#{k}")
            media.append(row_media[0] if row_media else None)
        if data_cfg.max_samples is not None and len(input_ids) >= data_cfg.max_samples:
            del input_ids[data_cfg.max_samples:], loss_mask[data_cfg.max_samples:], ids[data_cfg.max_samples:]
            del media[data_cfg.max_samples:]
            report.stopped_at_max_samples = True
            break
    full = TokenDataset(input_ids, loss_mask, ids, media if len(media) == len(ids) else None)
    report.samples, report.tokens, report.loss_tokens = len(full), full.num_tokens, full.num_loss_tokens
    n_eval = data_cfg.eval_samples
    if len(full) - n_eval < 1:
        raise UserError(f"no usable training sequences: {len(full)} sequence(s) built, data.eval_samples={n_eval}; "
                         f"fix data.path / data.format or lower data.eval_samples\n{report.summary()}")
    train, heldout = full.subset(0, len(full) - n_eval), full.subset(len(full) - n_eval, len(full))
    report.train_samples, report.heldout_samples = len(train), len(heldout)
    return train, heldout, report


def training_data_config(cfg):
    """The data section training reads: data.path replaced by regenerate.output when that is set
    (the recipe regenerates its answers with `draftsmith prepare` first)."""
    out = cfg.regenerate.output
    if not out:
        return cfg.data
    if not os.path.exists(out):
        raise FileNotFoundError(f"regenerate.output {out!r} does not exist: run `draftsmith prepare RECIPE` first "
                                "(or unset regenerate.output to train on data.path as it is)")
    return dataclasses.replace(cfg.data, path=[out], format="auto")


def collate(items: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of items -> {"input_ids", "attention_mask", "loss_mask", ...} each [b, s, ...].

    Every other tensor whose first dim is the sequence (e.g. cached aux_hidden_states [s, n*h])
    is padded with zeros (document_ids of packed rows with -1); non-tensor keys ("id") are dropped.
    Image rows' per-image tensors ("media": pixel_values, image_grid_thw) are concatenated in row order,
    as a vision-language model takes them for a batch.
    """
    lengths = [len(it["input_ids"]) for it in items]
    s = max(lengths)
    out: dict[str, torch.Tensor] = {}
    keys = list(dict.fromkeys(k for it in items for k, v in it.items() if isinstance(v, torch.Tensor)))
    for key in keys:
        first = next(it[key] for it in items if key in it)
        fill = pad_id if key == "input_ids" else -1 if key == "document_ids" else 0
        batch = torch.full((len(items), s, *first.shape[1:]), fill, dtype=first.dtype)  # [b, s, ...]
        for b, it in enumerate(items):
            if key in it:  # a text row beside image rows has no token_type_ids: 0 (text) throughout
                batch[b, : lengths[b]] = it[key]
        out[key] = batch
    per_image = [it["media"] for it in items if it.get("media")]  # image rows: their images, in row order
    for key in dict.fromkeys(k for m in per_image for k in m):
        out[key] = torch.cat([m[key] for m in per_image if key in m])  # [images (or patches), ...]
    out["attention_mask"] = (torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]).long()  # [b, s]
    return out


class BatchStream:
    """Infinite iterator of collated micro-batches for one rank.

    Epoch e uses the permutation seeded by seed + e; when len(dataset) is not a multiple of
    world_size the permutation is wrapped around so every rank gets ceil(n / world_size)
    samples, rank r taking positions r, r + world, ... Each epoch ends with a possibly shorter
    batch. state_dict() / load_state_dict() resume at the identical next batch.
    """

    def __init__(self, dataset, batch_size: int, seed: int, rank: int = 0, world_size: int = 1, pad_id: int = 0):
        if len(dataset) == 0:
            raise UserError("BatchStream got an empty dataset; check data.path and the data report")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.rank, self.world_size, self.pad_id = rank, world_size, pad_id
        self.per_rank = math.ceil(len(dataset) / world_size)
        self.epoch, self.position = 0, 0
        self._order: Optional[list[int]] = None

    @property
    def steps_per_epoch(self) -> int:
        """Micro-batches per epoch on each rank (equal on every rank)."""
        return math.ceil(self.per_rank / self.batch_size)

    def epoch_indices(self, epoch: int) -> list[int]:
        """This rank's dataset indices for one epoch, in order."""
        n = len(self.dataset)
        g = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(n, generator=g).tolist()
        total = self.per_rank * self.world_size
        padded = (perm * math.ceil(total / n))[:total]  # wrap around to equalise ranks
        return padded[self.rank::self.world_size]

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if self.position >= self.per_rank:
            self.epoch, self.position, self._order = self.epoch + 1, 0, None
        if self._order is None:
            self._order = self.epoch_indices(self.epoch)
        chosen = self._order[self.position:self.position + self.batch_size]
        self.position += len(chosen)
        return collate([self.dataset[i] for i in chosen], self.pad_id)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self._order = int(state["epoch"]), int(state["position"]), None


def token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """[V] frequencies of the training targets (tokens with loss_mask 1)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i in range(len(dataset)):
        item = dataset[i]
        targets = item["input_ids"][item["loss_mask"].bool()]
        if len(targets) and int(targets.max()) >= vocab_size:
            raise UserError(f"row {item.get('id', i)} has token id {int(targets.max())} >= vocab_size {vocab_size}; "
                             "the data was tokenized for another target")
        counts += torch.bincount(targets, minlength=vocab_size)
    return counts
