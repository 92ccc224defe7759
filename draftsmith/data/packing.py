"""Sequence packing: several documents (conversations, text chunks) per training row.

A packed row concatenates documents and carries two extra features (heads/base.py):
  position_ids   [b, s]  long, 0, 1, 2, ... restarting at every document (rope positions)
  document_ids   [b, s]  long, 0, 1, 2, ... per document within the row; -1 on padding
No position attends across documents: the target forward gets a block-diagonal causal mask
(`attention_bias`), the draft layer's TTT attention masks keys of other documents, and every
drafter drops labels that lie in a later document than the position predicting them
(`valid_labels`). Packing changes no loss: a packed document's loss equals its loss alone
(tests/data/test_packing.py).

    train = PackedDataset(train_set, pack_length=2048)   # lazy: items are concatenated on access
    batch = collate([train[0], train[1]], pad_id)        # + position_ids, document_ids
"""
from __future__ import annotations

import torch

from draftsmith.core.errors import UserError

PACKED_KEYS = ("position_ids", "document_ids")


class PackedDataset(torch.utils.data.Dataset):
    """Groups consecutive items of `dataset` into rows of at most pack_length tokens.

    First fit in dataset order (the BatchStream shuffles the packed rows); an item longer than
    pack_length keeps a row of its own (cutting is data.max_length's job). Items are read and
    concatenated on access, so a feature-cache dataset stays lazy.
    """

    def __init__(self, dataset, pack_length: int):
        if pack_length < 2:
            raise UserError(f"data.pack_length {pack_length}: a packed row needs at least 2 tokens; use None to turn packing off")
        self.dataset, self.pack_length = dataset, pack_length
        self.groups: list[list[int]] = []
        lengths = lengths_of(dataset)
        used = pack_length + 1
        for i, n in enumerate(lengths):
            if used + n > pack_length:
                self.groups.append([])
                used = 0
            self.groups[-1].append(i)
            used += n

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int) -> dict:
        return concat([self.dataset[j] for j in self.groups[i]])

    @property
    def num_tokens(self) -> int:
        return self.dataset.num_tokens


def lengths_of(dataset) -> list[int]:
    """Token count of every item, without loading features when the dataset can say it."""
    if hasattr(dataset, "input_ids"):
        return [len(x) for x in dataset.input_ids]
    if hasattr(dataset, "lengths"):
        return list(dataset.lengths())
    return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


def concat(items: list[dict]) -> dict:
    """Documents -> one packed item: every tensor whose first dim is the sequence is concatenated;
    position_ids / document_ids are added; "id" joins the documents' ids with '+'."""
    keys = [k for k, v in items[0].items() if torch.is_tensor(v)]
    out = {k: torch.cat([it[k] for it in items], dim=0) for k in keys}  # n x [s_i, ...] -> [sum s_i, ...]
    out["position_ids"] = torch.cat([torch.arange(len(it["input_ids"])) for it in items])  # [sum s_i]
    out["document_ids"] = torch.cat([torch.full((len(it["input_ids"]),), d, dtype=torch.long) for d, it in enumerate(items)])
    out["id"] = "+".join(str(it.get("id", "")) for it in items)
    return out


def document_ids_of(batch: dict) -> torch.Tensor | None:
    """[b, s] document ids of a packed batch (padding -1), or None for one document per row."""
    return batch.get("document_ids")


def positions(batch: dict, n: int | None = None) -> torch.Tensor:
    """[b, n] rope positions of the first n tokens: position_ids when packed, else 0..n-1."""
    ids = batch["input_ids"]
    b, s = ids.shape
    n = s if n is None else n
    if "position_ids" in batch:
        return batch["position_ids"][:, :n]
    return torch.arange(n, device=ids.device).expand(b, n)


def valid_labels(batch: dict, offset: int, n: int) -> torch.Tensor | float:
    """[b, n] 1.0 where the label of position j (the token at j + offset) lies in j's document.

    Documents are contiguous and their positions start at 0, so token k = j + offset is in j's
    document exactly when position_ids[k] >= offset. Slots past the row's end count as valid
    (callers' loss masks are zero there). Unpacked batches: 1.0 (a scalar, broadcast)."""
    if "position_ids" not in batch:
        return 1.0
    pos = batch["position_ids"]
    b, s = pos.shape
    ok = (pos[:, offset : offset + n] >= offset).float()  # [b, <= n]
    if ok.shape[1] < n:
        ok = torch.cat([ok, ok.new_ones(b, n - ok.shape[1])], dim=1)  # [b, n]
    return ok


def same_document_causal(document_ids: torch.Tensor, q_len: int | None = None) -> torch.Tensor:
    """[b, s] document ids -> [b, 1, n, s] bool: query j may see key i (i <= j, same document).
    q_len limits the queries to the first n positions (the keys stay the first n too)."""
    n = document_ids.shape[1] if q_len is None else q_len
    d = document_ids[:, :n]
    causal = torch.ones(n, n, dtype=torch.bool, device=d.device).tril()
    return (causal & (d[:, :, None] == d[:, None, :]))[:, None]  # [b, n, n] -> [b, 1, n, n]


def attention_bias(batch: dict, dtype: torch.dtype) -> torch.Tensor:
    """The 4D additive mask an HF model takes for a packed batch: [b, 1, s, s], 0 where query j
    may attend key i (causal, same document, key not padding), the dtype's minimum elsewhere.
    (A finite minimum keeps fully masked padding rows free of NaN.)"""
    allowed = same_document_causal(batch["document_ids"]) & (batch["document_ids"] >= 0)[:, None, None, :]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)  # [b, 1, s, s]


def model_inputs(batch: dict, dtype: torch.dtype) -> dict:
    """Keyword arguments for an HF causal LM forward over `batch`: attention_mask (2D, or the
    packed 4D bias) and position_ids when packed."""
    if "document_ids" not in batch:
        return {"attention_mask": batch["attention_mask"]}
    return {"attention_mask": attention_bias(batch, dtype), "position_ids": batch["position_ids"]}
