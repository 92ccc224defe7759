"""Tokenization through `datasets` (data.num_proc >= 1): the raw rows of every data.path entry
become one Arrow dataset, `Dataset.map(num_proc=N)` renders and tokenizes them with the same code
as the in-process path (data/encode.encode_row), and the result is cached by fingerprint: a second
run over the same data and recipe loads the tokenized rows instead of tokenizing again.

The fingerprint of the tokenized dataset is ours, so that the cache is hit exactly when nothing
that changes the tokens changed: the raw rows' fingerprint (files: path, size, mtime; datasets
sources: datasets' own fingerprint), the tokenizer (its full JSON, chat template and special
tokens), the data options that shape sequences, and the source of the rendering code.

Row accounting is the in-process path's: rows read = used + skipped, every skipped row counted by
reason and the first ones named by SOURCE:LINE (files) or SOURCE:INDEX (datasets sources).

Streaming (data.streaming: true, for corpora larger than memory or disk cache): `stream_rows`
yields tokenized rows lazily from `datasets` streaming (IterableDataset.map), with the same
accounting kept as it goes.
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Iterator

import torch

from draftsmith.data import chat, formats
from draftsmith.data.encode import encode_row


def _raw_generator(files: list[str], stamps: list):
    """Every raw row of every file as {"source", "row_id", "value" (JSON), "reason", "detail"}."""
    del stamps  # part of the cache key only
    for file in files:
        for raw in formats.read_raw(file):
            err = raw.error
            yield {"file": raw.file, "line": raw.line, "row_id": raw.row_id or "",
                   "value": None if err is not None else json.dumps(raw.value),
                   "reason": err.reason if err is not None else "", "detail": err.detail if err is not None else ""}


def _stamp(file: str):
    from draftsmith.data import hf_sources

    if file.startswith("stdlib:"):
        import sys

        return [file, sys.version]
    if hf_sources.is_dataset_source(file):
        return [file, hf_sources.fingerprint(file)]
    st = os.stat(file)
    return [os.path.abspath(file), st.st_size, st.st_mtime_ns]


def raw_dataset(files: list[str], cache_dir: str | None = None):
    """One Arrow dataset of the raw rows (cached by datasets under the file stamps)."""
    import datasets

    features = datasets.Features({"file": datasets.Value("string"), "line": datasets.Value("int64"),
                                  "row_id": datasets.Value("string"), "value": datasets.Value("large_string"),
                                  "reason": datasets.Value("string"), "detail": datasets.Value("string")})
    cache_dir = cache_dir or os.environ.get("HF_DATASETS_CACHE")  # read now: datasets reads it once, at import
    return datasets.Dataset.from_generator(_raw_generator, features=features, cache_dir=cache_dir,
                                           gen_kwargs={"files": files, "stamps": [_stamp(f) for f in files]})


def _encode_batch(batch: dict, tokenizer, data_cfg: dict) -> dict:
    """Batched map function: raw rows -> sequences (several for a long text document) + skip reasons."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(**data_cfg)
    out = {"input_ids": [], "loss_mask": [], "truncated": [], "skip_reason": [], "skip_detail": []}
    for file, line, row_id, value, reason, detail in zip(batch["file"], batch["line"], batch["row_id"], batch["value"],
                                                         batch["reason"], batch["detail"]):
        ids, masks, truncated, err = [], [], False, None
        if reason:
            err = formats.RowError(reason, detail)
        else:
            raw = formats.RawRow(file, line, json.loads(value), row_id=row_id or None)
            try:
                pieces, truncated = encode_row(formats.parse(raw, cfg.format), tokenizer, cfg)
                ids, masks = [p[0] for p in pieces], [p[1] for p in pieces]
            except formats.RowError as exc:
                err = exc
        out["input_ids"].append(ids)
        out["loss_mask"].append(masks)
        out["truncated"].append(bool(truncated))
        out["skip_reason"].append(err.reason if err is not None else "")
        out["skip_detail"].append(err.detail if err is not None else "")
    return out


def recipe_fingerprint(raw_fp: str, tokenizer, data_cfg: dict) -> str:
    """Hash of everything that changes the tokens (see the module docstring)."""
    from datasets.fingerprint import Hasher

    backend = getattr(tokenizer, "backend_tokenizer", None)
    tok = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    code = "".join(inspect.getsource(m) for m in (chat, formats)) + inspect.getsource(encode_row) \
        + inspect.getsource(_encode_batch)
    return Hasher.hash([raw_fp, tok, getattr(tokenizer, "chat_template", None), tokenizer.special_tokens_map,
                        sorted(data_cfg.items()), code])


def _shape_options(data_cfg) -> dict:
    return {"format": data_cfg.format, "max_length": data_cfg.max_length, "chat_template": data_cfg.chat_template,
            "text_chunk_tokens": data_cfg.text_chunk_tokens}


def tokenize(data_cfg, tokenizer, num_proc: int, cache_dir: str | None = None):
    """-> (tokenized Arrow dataset, from_cache): one output row per raw row, in order."""
    files = formats.expand_paths(list(data_cfg.path))
    raw = raw_dataset(files, cache_dir)
    options = _shape_options(data_cfg)
    fp = recipe_fingerprint(raw._fingerprint, tokenizer, options)
    # map writes cache-FP.arrow (one process) or cache-FP_0000i_of_0000N.arrow (num_proc N)
    stem = Path(raw._get_cache_file_path(fp)) if raw.cache_files else None
    cached = stem is not None and any(stem.parent.glob(stem.stem + "*.arrow"))
    import datasets

    features = datasets.Features({
        **{k: v for k, v in raw.features.items() if k != "value"},
        "input_ids": datasets.Sequence(datasets.Sequence(datasets.Value("int32"))),  # sequences of one row
        "loss_mask": datasets.Sequence(datasets.Sequence(datasets.Value("uint8"))),
        "truncated": datasets.Value("bool"), "skip_reason": datasets.Value("string"),
        "skip_detail": datasets.Value("string")})
    tokenized = raw.map(_encode_batch, batched=True, batch_size=256, num_proc=num_proc if num_proc > 1 else None,
                        fn_kwargs={"tokenizer": tokenizer, "data_cfg": options}, remove_columns=["value"],
                        features=features, new_fingerprint=fp, desc="tokenizing")
    return tokenized, cached


def build(data_cfg, tokenizer, report, num_proc: int, cache_dir: str | None = None):
    """The datasets path of dataset.build_dataset: fills `report` the same way; returns (input_ids,
    loss_mask, ids) lists like the in-process path."""
    tokenized, cached = tokenize(data_cfg, tokenizer, num_proc, cache_dir)
    report.tokenized_from_cache = cached
    input_ids: list[torch.Tensor] = []
    loss_mask: list[torch.Tensor] = []
    ids: list[str] = []
    for file, line, row_id, seqs, masks, truncated, reason, detail in _columns(tokenized):
        report.read += 1
        if reason:
            report.skip(f"{file}:{line}", formats.RowError(reason, detail))
            continue
        report.used += 1
        report.truncated += int(truncated)
        name = row_id or f"{os.path.normpath(file)}:{line}"  # as formats.normalize names rows: unique over files
        for k, (seq, mask) in enumerate(zip(seqs, masks)):
            input_ids.append(seq)
            loss_mask.append(mask)
            ids.append(name if len(seqs) == 1 else f"{name}#{k}")
        if data_cfg.max_samples is not None and len(input_ids) >= data_cfg.max_samples:
            del input_ids[data_cfg.max_samples:], loss_mask[data_cfg.max_samples:], ids[data_cfg.max_samples:]
            report.stopped_at_max_samples = True
            break
    return input_ids, loss_mask, ids


def _split(column, dtype) -> list[list[torch.Tensor]]:
    """An Arrow list<list<int>> column -> per row, its sequences as tensors (views of one buffer)."""
    import numpy as np
    import pyarrow.compute as pc

    inner = column.flatten()  # list<int> per sequence, all rows of the batch
    flat = torch.from_numpy(np.array(inner.flatten().to_numpy(zero_copy_only=False), dtype=dtype))  # own, writable
    seq_ends = np.cumsum(pc.list_value_length(inner).to_numpy(zero_copy_only=False))
    per_row = np.cumsum(pc.list_value_length(column).to_numpy(zero_copy_only=False))
    seqs = [flat[a:b] for a, b in zip(np.concatenate([[0], seq_ends[:-1]]), seq_ends)]
    return [seqs[a:b] for a, b in zip(np.concatenate([[0], per_row[:-1]]), per_row)]


def _columns(tokenized):
    """Rows of the tokenized dataset, read column-wise through Arrow (no per-token Python work)."""
    import numpy as np

    for table in tokenized.with_format("arrow").iter(batch_size=4096):
        ids = _split(table.column("input_ids").combine_chunks(), np.int32)
        masks = _split(table.column("loss_mask").combine_chunks(), np.uint8)
        yield from zip(table.column("file").to_pylist(), table.column("line").to_pylist(),
                       table.column("row_id").to_pylist(), ids, masks, table.column("truncated").to_pylist(),
                       table.column("skip_reason").to_pylist(), table.column("skip_detail").to_pylist())


def stream_rows(data_cfg, tokenizer, report) -> Iterator[dict]:
    """Tokenized rows, lazily, from `datasets` streaming: {"input_ids", "loss_mask", "id"} per sequence.
    `report` counts as rows go by (read = used + skipped at every point)."""
    import datasets

    from draftsmith.data import hf_sources

    options = _shape_options(data_cfg)
    for path in formats.expand_paths(list(data_cfg.path)):
        if hf_sources.is_dataset_source(path) and not hf_sources.is_saved_dataset(path):
            base, params = hf_sources.split_query(path)
            if hf_sources.is_hf(path):
                source = hf_sources.load(path).to_iterable_dataset()  # cached split, read lazily
            else:
                kind = "parquet" if base.endswith(".parquet") else "arrow"
                source = datasets.load_dataset(kind, data_files=base, split="train", streaming=True)
            name = hf_sources.label(path)
            rows = ({"file": name, "line": i, "row_id": f"{name}:{i}", "value": json.dumps(r), "reason": "",
                     "detail": ""} for i, r in enumerate(source))
        else:
            rows = _raw_generator([path], [])
        batch: list[dict] = []
        for raw in rows:
            batch.append(raw)
            if len(batch) == 64:
                yield from _emit(batch, tokenizer, options, report)
                batch = []
        yield from _emit(batch, tokenizer, options, report)


def _emit(batch: list[dict], tokenizer, options: dict, report) -> Iterator[dict]:
    if not batch:
        return
    cols = {k: [r[k] for r in batch] for k in batch[0]}
    out = _encode_batch(cols, tokenizer, options)
    for i, raw in enumerate(batch):
        report.read += 1
        if out["skip_reason"][i]:
            report.skip(f"{raw['file']}:{raw['line']}", formats.RowError(out["skip_reason"][i], out["skip_detail"][i]))
            continue
        report.used += 1
        report.truncated += int(out["truncated"][i])
        for seq, mask in zip(out["input_ids"][i], out["loss_mask"][i]):
            yield {"input_ids": torch.tensor(seq, dtype=torch.long), "loss_mask": torch.tensor(mask, dtype=torch.long),
                   "id": raw["row_id"] or f"{raw['file']}:{raw['line']}"}
