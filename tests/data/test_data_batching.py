"""collate, BatchStream (shuffle, sharding across ranks, exact resume), token_counts and the
reduced draft vocabulary (SGLang/vLLM convention target_id = draft_id + d2t[draft_id])."""
from __future__ import annotations

import pytest
import torch

from draftsmith.data import BatchStream, TokenDataset, collate, draft_vocab, token_counts


def _dataset(n=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids, masks, names = [], [], []
    for i in range(n):
        s = 3 + i % 5
        ids.append(torch.randint(3, 50, (s,), generator=g, dtype=torch.int32))
        masks.append(torch.tensor([0] + [1] * (s - 1), dtype=torch.uint8))
        names.append(f"row{i}")
    return TokenDataset(ids, masks, names)


def test_collate_right_pads_all_sequence_tensors():
    items = [{"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1]), "id": "a",
              "aux_hidden_states": torch.ones(3, 4)},
             {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([0]), "id": "b",
              "aux_hidden_states": torch.full((1, 4), 2.0)}]
    batch = collate(items, pad_id=9)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 0, 0]]
    assert batch["aux_hidden_states"].shape == (2, 3, 4)
    assert batch["aux_hidden_states"][1, 1:].abs().sum() == 0 and batch["aux_hidden_states"][1, 0, 0] == 2
    assert "id" not in batch


def _first_ids(stream, n):
    return [next(stream)["input_ids"].clone() for _ in range(n)]


def test_resume_gives_identical_batches_across_epochs():
    ds = _dataset()
    a = BatchStream(ds, batch_size=3, seed=7)
    _first_ids(a, 5)  # into the second epoch (4 batches per epoch)
    state = a.state_dict()
    assert state == {"epoch": 1, "position": 3}
    expected = _first_ids(a, 9)
    b = BatchStream(ds, batch_size=3, seed=7)
    b.load_state_dict(state)
    got = _first_ids(b, 9)
    assert all(torch.equal(x, y) for x, y in zip(expected, got))
    assert b.epoch == a.epoch


def test_epochs_are_shuffled_differently_and_deterministically():
    ds = _dataset()
    s = BatchStream(ds, batch_size=4, seed=1)
    assert s.epoch_indices(0) != s.epoch_indices(1)
    assert s.epoch_indices(0) == BatchStream(ds, batch_size=4, seed=1).epoch_indices(0)
    assert sorted(s.epoch_indices(0)) == list(range(len(ds)))


@pytest.mark.parametrize("n", [10, 11])
def test_two_ranks_cover_every_sample_once_per_epoch(n):
    ds = _dataset(n)
    ranks = [BatchStream(ds, batch_size=2, seed=3, rank=r, world_size=2) for r in range(2)]
    assert ranks[0].steps_per_epoch == ranks[1].steps_per_epoch
    for epoch in range(2):
        seen = []
        for stream in ranks:
            idx = stream.epoch_indices(epoch)
            assert len(idx) == (n + 1) // 2  # equal shares
            seen += idx
        assert set(seen) == set(range(n))
        assert len(seen) - n == n % 2  # only the wrap-around repeats
    # the batches themselves carry those samples
    rows = {tuple(ds[i]["input_ids"].tolist()): i for i in range(n)}
    got = []
    for stream in ranks:
        for _ in range(stream.steps_per_epoch):
            batch = next(stream)
            for b in range(batch["input_ids"].shape[0]):
                got.append(rows[tuple(batch["input_ids"][b][batch["attention_mask"][b].bool()].tolist())])
    assert set(got) == set(range(n)) and all(s.epoch == 0 for s in ranks)


def test_token_counts_count_loss_tokens_only():
    ds = TokenDataset([torch.tensor([1, 4, 4, 5])], [torch.tensor([0, 1, 1, 0])], ["a"])
    counts = token_counts(ds, 8)
    assert counts.tolist() == [0, 0, 0, 0, 2, 0, 0, 0]
    with pytest.raises(ValueError, match="vocab_size"):
        token_counts(ds, 4)


def test_draft_vocab_convention():
    counts = torch.tensor([0, 5, 0, 9, 5, 1, 0, 0])
    d2t, t2d = draft_vocab.build(counts, 4)
    kept = torch.arange(4) + d2t  # target_id = draft_id + d2t[draft_id]
    assert kept.tolist() == [1, 3, 4, 5]  # top-4 by count (ties 1 and 4 both kept), sorted
    assert torch.nonzero(t2d).flatten().tolist() == [1, 3, 4, 5] and t2d.dtype == torch.bool
    draft_vocab.check(d2t, t2d)
    # ties broken by the lower id; unseen ids fill by id order
    d2t, _ = draft_vocab.build(torch.tensor([0, 3, 0, 3, 3]), 2)
    assert (torch.arange(2) + d2t).tolist() == [1, 3]
    d2t, _ = draft_vocab.build(torch.tensor([0, 0, 7, 0, 0]), 3)
    assert (torch.arange(3) + d2t).tolist() == [0, 1, 2]
    d2t, t2d = draft_vocab.build(counts, None)
    assert d2t.abs().sum() == 0 and t2d.all()


def test_draft_vocab_check_rejects_mismatch():
    d2t, t2d = draft_vocab.build(torch.tensor([4, 0, 3, 2, 1]), 3)
    t2d_bad = t2d.clone()
    t2d_bad[1] = True
    with pytest.raises(ValueError, match="nonzero\\(t2d\\) == d2t \\+ arange"):
        draft_vocab.check(d2t, t2d_bad)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocab.build(torch.zeros(5), 6)
