"""Large-vocabulary training (issue 20 item 4): every kind with a draft vocabulary (EAGLE-3, DFlash,
DSpark, P-EAGLE) restricts its soft labels to the draft vocabulary BEFORE any float32 copy, so a
training step never holds a [b, s, V] (or [b, Q, V]) float32 tensor of the target's vocabulary
(at V = 262,144: 1 MiB per token). Checked by recording every tensor the loss creates
(TorchDispatchMode), on bf16 target logits as a bf16 target produces them."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from draftsmith.data import features
from draftsmith.heads import DRAFTERS, vocab_loss
from draftsmith.testing import tiny_target

V = 259


class FullVocabFloat32(TorchDispatchMode):
    """Records every op output that is float32 with a last dimension of the target's vocabulary size."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.seen = vocab, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() >= 2 and t.shape[-1] == self.vocab:
                self.seen.append((str(func), tuple(t.shape)))
        return out


def test_gathered_soft_labels_equal_the_full_copy():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 10, V, generator=g) * 4).to(torch.bfloat16)  # [b, s, V]
    draft_ids = torch.randperm(V, generator=g)[:40].sort().values
    positions = torch.randint(0, 10, (2, 17), generator=g)  # [b, Q], repeats allowed
    p, top = vocab_loss.gathered_soft_labels(logits, positions, draft_ids, chunk=3)
    full = logits.float().gather(1, positions[..., None].expand(-1, -1, V))  # the straightforward [b, Q, V] copy
    torch.testing.assert_close(p, torch.softmax(full[..., draft_ids], -1))
    assert torch.equal(top, full.argmax(-1))


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "dspark", "peagle"])
def test_no_full_vocabulary_float32_copy_in_a_training_step(kind):
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    cls = DRAFTERS.get(kind)
    counts = torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(1))
    drafter = cls.from_target(cls.Config(draft_vocab_size=64), target, counts)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, V, (2, 24), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    batch = features.complete(target, batch, set(drafter.required_features), drafter.feature_layers())
    batch["target_logits"] = batch["target_logits"].to(torch.bfloat16)  # as a bf16 target returns them
    torch.manual_seed(3)
    with FullVocabFloat32(V) as mode:
        out = drafter.forward_loss(batch)
        out.loss.backward()
    assert torch.isfinite(out.loss)
    assert mode.seen == [], f"{kind}: float32 tensors over the full {V}-token vocabulary: {mode.seen[:3]}"
