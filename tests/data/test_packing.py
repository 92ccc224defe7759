"""Sequence packing: a packed document's loss equals its loss alone, for every drafter kind, and
does not change when a neighbouring document changes (no cross-document attention or labels)."""
from __future__ import annotations

import pytest
import torch

from draftsmith.data import TokenDataset, collate, features, packing
from draftsmith.heads import DRAFTERS
from draftsmith.testing import tiny_target

KINDS = {
    "eagle3": {"ttt_steps": 3, "draft_vocab_size": 200},
    "eagle1": {"noise_range": 0.0},
    "medusa": {"num_heads": 3, "loss": "kl", "greedy_path_only": False},  # random tokens: no greedy path
    "mlp_speculator": {"n_predict": 3},
    "draft_lm": {},
    # block drafters: more anchors than positions, so the packed row and the document alone train the same blocks
    "dflash": {"block_size": 4, "num_layers": 2, "num_anchors": 64, "draft_vocab_size": 200},
    "dspark": {"block_size": 4, "num_layers": 2, "num_anchors": 64, "draft_vocab_size": 200, "markov_rank": 8},
}


@pytest.fixture(scope="module")
def target():
    return tiny_target(num_layers=4, hidden=32, seed=3)


def doc(seed: int, n: int, loss: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 259, (n,), generator=g)
    mask = (torch.rand(n, generator=g) > 0.2).long() if loss else torch.zeros(n, dtype=torch.long)
    return {"input_ids": ids, "loss_mask": mask, "id": f"d{seed}"}


def drafter_for(kind, target):
    cls = DRAFTERS.get(kind)
    torch.manual_seed(0)
    counts = torch.randint(0, 50, (target.vocab_size,))
    d = cls.from_target(cls.Config(**KINDS[kind]), target, counts)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # away from init so every part of the drafter matters
        for p in d.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return d.eval()


def loss_of(drafter, target, items, packed: bool):
    batch = collate([packing.concat(items)] if packed else items, pad_id=0)
    batch = features.complete(target, batch, set(drafter.required_features), drafter.feature_layers())
    with torch.no_grad():
        out = drafter(batch)
    return float(out.loss), out.num_tokens


@pytest.mark.parametrize("kind", list(KINDS))
def test_packed_document_loss_equals_its_loss_alone(kind, target):
    drafter = drafter_for(kind, target)
    a = doc(1, 11)
    alone, n_alone = loss_of(drafter, target, [a], packed=False)
    assert n_alone > 0 and alone > 0
    neighbours = [doc(2, 7, loss=False), doc(3, 9, loss=False)]
    first, n_first = loss_of(drafter, target, [a, *neighbours], packed=True)  # A at row start, others after it
    middle, n_middle = loss_of(drafter, target, [neighbours[0], a, neighbours[1]], packed=True)
    changed, _ = loss_of(drafter, target, [doc(4, 5, loss=False), a, doc(5, 12, loss=False)], packed=True)
    assert n_first == n_middle == n_alone
    for got in (first, middle, changed):
        assert got == pytest.approx(alone, rel=1e-5, abs=1e-6)


def test_unmasked_packing_would_leak(target):
    """The test above can fail: without document ids, a neighbour changes A's loss."""
    drafter = drafter_for("eagle3", target)
    a = doc(1, 11)

    def unmasked(left):
        row = packing.concat([left, a])
        row = {k: v for k, v in row.items() if k not in packing.PACKED_KEYS}
        row["loss_mask"] = torch.cat([torch.zeros(len(left["input_ids"]), dtype=torch.long), a["loss_mask"]])
        batch = features.complete(target, collate([row], 0), set(drafter.required_features), drafter.feature_layers())
        with torch.no_grad():
            return float(drafter(batch).loss)

    assert unmasked(doc(2, 7, loss=False)) != pytest.approx(unmasked(doc(4, 5, loss=False)), rel=1e-4)


def test_packed_dataset_groups_and_collates():
    items = [doc(i, n) for i, n in enumerate([5, 6, 4, 9, 3])]
    ds = TokenDataset([it["input_ids"] for it in items], [it["loss_mask"] for it in items], [it["id"] for it in items])
    packed = packing.PackedDataset(ds, pack_length=12)
    assert packed.groups == [[0, 1], [2], [3, 4]]  # first fit in order: 5+6, 4 (+9 > 12), 9+3
    row = packed[0]
    assert row["position_ids"].tolist() == list(range(5)) + list(range(6))
    assert row["document_ids"].tolist() == [0] * 5 + [1] * 6
    batch = collate([packed[0], packed[1]], pad_id=0)
    assert batch["document_ids"][1].tolist() == [0] * 4 + [-1] * 7  # padding is no document
    assert batch["attention_mask"][1].sum() == 4
    with pytest.raises(ValueError, match="data.pack_length"):
        packing.PackedDataset(ds, pack_length=1)


def test_train_loop_runs_packed(tiny_run):
    from draftsmith.train.loop import Trainer

    cfg = tiny_run("packed", "data.pack_length=128", "train.max_steps=2", "train.batch_size=2")
    trainer = Trainer(cfg)
    assert isinstance(trainer.train_set, packing.PackedDataset) and len(trainer.train_set) < 20
    result = trainer.run()
    assert len(result.losses) == 2 and all(x == x for x in result.losses)  # finite (not NaN)
