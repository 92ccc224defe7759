"""Medusa with a draft vocabulary (drafter.draft_vocab_size): heads project onto the most frequent target
tokens only; the loss against a hand-written reference (labels mapped to draft ids, out-of-vocabulary labels
dropped, soft labels restricted to the draft vocabulary), the proposer's tokens in target ids, vLLM 0.27 refusing
its per-head heads (tests/export/test_medusa_draft_vocab_export.py has the export), and a full-vocabulary drafter
unchanged."""
from __future__ import annotations

import functools

import pytest
import torch

from draftsmith.core.sampling import SamplingParams, logits_to_probs
from draftsmith.data import features
from draftsmith.heads.medusa import MedusaDrafter
from draftsmith.targets.load import TargetOutput
from draftsmith.testing import tiny_target
from tests.helpers import batch_for as shared_batch_for

DV = 24  # of the tiny target's vocabulary (more than DV ids occur, so some labels fall outside)

batch_for = functools.partial(shared_batch_for, s=11, required={"last_hidden_state", "target_logits"}, layers=[])


def make(seed=0, **options):
    target = tiny_target(num_layers=2, hidden=32, seed=seed)
    counts = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(seed + 7))  # distinct counts
    drafter = MedusaDrafter.from_target(MedusaDrafter.Config(draft_vocab_size=DV, **options), target, counts)
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # move away from the zero init so every term is exercised
        for p in drafter.blocks.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, drafter, counts


def reference_loss(drafter, batch, mode, hard_weight=0.5, offset=2):
    """Per row, head and position, with an explicit list of draft ids: a label (target argmax, or the data
    token for ce_data) outside the list is skipped; otherwise its index in the list is the CE label and the
    soft label is the softmax of the target's logits at the listed ids."""
    ids, logits = batch["input_ids"], batch["target_logits"].float()
    mask = batch["loss_mask"] * batch["attention_mask"]
    vocab = drafter.draft_ids().tolist()
    b, s = ids.shape
    total = 0.0
    for i in range(drafter.cfg.num_heads):
        block, head = drafter.blocks[i], drafter.lm_heads[i]
        for row in range(b):
            for j in range(s - offset - i):
                if not mask[row, j + offset + i]:
                    continue
                p_logits = logits[row, j + offset - 1 + i]
                label = int(ids[row, j + offset + i]) if mode == "ce_data" else int(p_logits.argmax())
                if label not in vocab:
                    continue
                x = batch["last_hidden_state"][row, j]
                for lin in block.layers:
                    x = x + torch.nn.functional.silu(lin.weight @ x + lin.bias)
                logq = torch.log_softmax(head.weight @ x, -1)  # [DV]
                p = torch.softmax(torch.stack([p_logits[t] for t in vocab]), -1)
                kl = float((p * (p.log() - logq)).sum())
                ce = -float(logq[vocab.index(label)])
                total += 0.8**i * {"kl": kl, "mix": (1 - hard_weight) * kl + hard_weight * ce}.get(mode, ce)
    return total


def test_heads_hold_the_target_rows_of_the_most_frequent_tokens():
    target, drafter, counts = make(num_heads=2)
    want = sorted(torch.argsort(counts, descending=True)[:DV].tolist())
    assert sorted(drafter.draft_ids().tolist()) == want
    for head in drafter.lm_heads:
        assert head.weight.shape == (DV, 32)
        torch.testing.assert_close(head.weight, target.lm_head.weight[drafter.draft_ids()].float())
    assert "d2t" in drafter.state_dict() and "d2t" not in drafter.state_dict_for_export()


@pytest.mark.parametrize("mode", ["ce", "kl", "mix", "ce_data"])
def test_loss_matches_hand_written_reference(mode):
    target, drafter, _ = make(num_heads=3, num_layers=2, loss=mode, hard_label_weight=0.3, greedy_path_only=False)
    batch = batch_for(target, drafter)
    vocab = set(drafter.draft_ids().tolist())
    labels = batch["target_logits"].argmax(-1).flatten().tolist()
    assert any(t not in vocab for t in labels) and any(t in vocab for t in labels)  # both cases are exercised
    with torch.no_grad():
        got = drafter.forward_loss(batch)
        want = reference_loss(drafter, batch, mode, hard_weight=0.3)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)


def test_proposer_returns_target_ids_and_zero_probability_off_the_draft_vocabulary():
    target, drafter, _ = make(num_heads=3)
    ids = torch.randint(3, target.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    out = target.forward(ids[:, :-1])
    proposer = drafter.make_proposer(target)
    proposer.begin(ids[0, :-1])
    proposer.commit(ids[0], ids.shape[1] - 1, TargetOutput(out.logits, out.hidden_states))
    full = features.complete(target, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, {"last_hidden_state"}, [])
    train_logits = drafter.head_logits(full["last_hidden_state"])  # [1, s, DV] per head
    j = ids.shape[1] - 2
    vocab = drafter.draft_ids()
    greedy = proposer.propose(ids[0], 3, SamplingParams(), None)
    assert greedy.tokens.tolist() == [int(vocab[train_logits[i][0, j].argmax()]) for i in range(3)]
    sampling = SamplingParams(temperature=0.7)
    draft = proposer.propose(ids[0], 2, sampling, torch.Generator().manual_seed(0))
    off = torch.ones(target.vocab_size, dtype=torch.bool)
    off[vocab] = False
    for i in range(2):
        assert draft.probs[i].shape == (target.vocab_size,)
        assert draft.probs[i][off].sum() == 0
        torch.testing.assert_close(draft.probs[i][vocab], logits_to_probs(train_logits[i][0, j], sampling))
        assert int(draft.tokens[i]) in vocab.tolist()


def test_full_vocabulary_drafter_has_no_d2t():
    target = tiny_target(num_layers=2, hidden=32)
    drafter = MedusaDrafter.from_target(MedusaDrafter.Config(num_heads=2), target)
    assert drafter.draft_ids() is None and "d2t" not in drafter.state_dict()
    assert drafter.lm_heads[0].weight.shape == (target.vocab_size, 32)


def test_draft_vocab_size_range_is_reported():
    assert any("draft_vocab_size" in p for p in MedusaDrafter.Config(draft_vocab_size=1).problems())


def test_checkpoint_keeps_the_draft_vocabulary_and_vllm_0_27_refuses_per_head_heads(tmp_path):
    from draftsmith import checkpoint
    from draftsmith.export import export
    from draftsmith.export.layout import ExportOptions
    from tests.export.conftest import make_checkpoint

    path = make_checkpoint(tmp_path, "medusa", {"num_heads": 2, "num_layers": 1, "draft_vocab_size": DV})
    loaded = checkpoint.load_drafter(path, device="cpu")
    assert loaded.drafter.lm_heads[0].weight.shape[0] == DV
    assert loaded.drafter.d2t.abs().sum() > 0  # the saved draft vocabulary, not a fresh zero buffer
    with pytest.raises(ValueError, match="draft_vocab_size.*vocab_parallel_embedding.py:480"):
        export(path, "vllm", tmp_path / "out", ExportOptions(engine_version="0.27.0"))  # its loader would assert
    assert not (tmp_path / "out" / "model.safetensors").exists()
