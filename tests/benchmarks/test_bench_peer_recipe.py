"""benchmarks/bench_peer_recipe.py: speculators' per-step logits reach draftsmith's acceptance measure at the
right positions (an oracle peer scores 1.0, the same oracle one position late does not), and the 2-step
smoke mode trains both on the same batches (CI runs only this mode; the numbers come from full runs)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import STORIES, shared_path
from tests.helpers import load_repo_module

REPO = Path(__file__).resolve().parents[2]
HAS_SPECULATORS = importlib.util.find_spec("speculators") is not None


def bench():
    return load_repo_module("benchmarks/bench_peer_recipe.py")


class Replay(nn.Module):
    """An lm_head that returns prepared logits, one tensor per call (one call per TTT step)."""

    def __init__(self, outputs: list[torch.Tensor]):
        super().__init__()
        self.outputs = list(outputs)

    def forward(self, hidden):
        return self.outputs.pop(0)


def oracle_logits(batch: dict, peer_vocab: torch.Tensor, steps: int, late: int) -> list[torch.Tensor]:
    """Per TTT step t, [1, S, dv] logits that put all mass, at packed index k, on the target's argmax at packed
    label index k + t + late (speculators' alignment when late = 0), in the peer's own draft-id order."""
    lengths = batch["attention_mask"].sum(1).tolist()
    labels = torch.cat([batch["target_logits"][b, 1:n].argmax(-1) for b, n in enumerate(lengths)])  # [S] target ids
    index = torch.full((batch["target_logits"].shape[-1],), -1, dtype=torch.long)
    index[peer_vocab] = torch.arange(len(peer_vocab))
    S, out = len(labels), []
    for t in range(steps):
        logits = torch.zeros(1, S, len(peer_vocab))
        for k in range(S - t - late):
            d = int(index[labels[k + t + late]])
            if d >= 0:
                logits[0, k, d] = 30.0
        out.append(logits)
    return out


@pytest.mark.shared
@pytest.mark.skipif(not HAS_SPECULATORS, reason="speculators is not installed (scripts/install_speculators.sh)")
def test_an_oracle_peer_scores_one_through_draftsmiths_measure(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    module = bench()
    from draftsmith.data import collate, features
    from draftsmith.train.loop import Trainer

    recipe, overrides = module.smoke_recipe(tmp_path / "work", log=lambda *_: None)
    # positions whose target argmax lies outside the 256-token draft vocabulary leave the measure: the
    # oracle can then be right everywhere, through speculators' own vocabulary order
    cfg = module.recipe_config(recipe, overrides + ["drafter.mask_out_of_vocab=true"], tmp_path / "run", 2, 0, 1)
    trainer = Trainer(cfg, overwrite=True)
    try:
        settings = module.speculators_settings(module.verifier_folder(trainer.target, tmp_path / "verifier"), cfg,
                                               trainer.drafter, [])
        model = module.speculators_model(settings, trainer.drafter, 0)
        view = module.SpeculatorsView(model, trainer.drafter).eval()
        items = [trainer.heldout[i] for i in range(len(trainer.heldout))]
        batch = features.complete(trainer.target, collate(items, 0), trainer.required, trainer.layers)
        peer_vocab = torch.nonzero(model.t2d).flatten()
        accs = {}
        for late in (0, 1):
            model.lm_head = Replay(oracle_logits(batch, peer_vocab, 3, late))
            with torch.no_grad():
                accs[late] = view(batch).metrics
        assert [accs[0][f"acc_{t}"] for t in range(3)] == [1.0, 1.0, 1.0]
        assert all(accs[1][f"acc_{t}"] < 0.5 for t in range(3)), accs[1]
    finally:
        trainer.release()


@pytest.mark.shared
def test_smoke_mode_trains_both_on_the_same_batches(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    module = bench()
    out = tmp_path / "peer.json"
    peers = "draftsmith,speculators" if HAS_SPECULATORS else "draftsmith"
    assert module.main(["--smoke", "--workdir", str(tmp_path / "work"), "--out", str(out), "--peers", peers]) == 0
    report = json.loads(out.read_text())
    assert report["steps"] == 2 and report["eval_every"] == 1 and report["ttt_steps"] == 3
    assert report["machine_after"]["lscpu_flags"] or not Path("/usr/bin/lscpu").exists()
    ds = report["draftsmith"]["curve"]
    assert [p["step"] for p in ds] == [1, 2]
    assert all(0.0 <= p[f"eval_acc_{t}"] <= 1.0 for p in ds for t in range(3))
    if HAS_SPECULATORS:
        assert report["same_batches"] is True
        sp = report["speculators"]
        assert len(sp["batch_hashes"]) == 2 and sp["settings"]["num_layers"] == 1
        assert sp["settings"]["draft_vocab_size"] == report["draft_vocab_size"] == 256
        rows = report["side_by_side"]
        assert [r["step"] for r in rows] == [1, 2]
        assert [r["tokens_seen"] for r in rows] == [p["tokens_seen"] for p in sp["curve"]] == [p["tokens_seen"] for p in ds]
        assert all(0.0 <= r[f"speculators_acc_{t}"] <= 1.0 for r in rows for t in range(3))
        # speculators' own step-0 accuracy on the same held-out rows (its mask, one position earlier) agrees
        assert all(abs(p["speculators_own_acc_0"] - p["eval_acc_0"]) <= 0.05 for p in sp["curve"])


@pytest.mark.shared
def test_a_recipe_without_an_offline_cache_is_refused_in_one_line(tmp_path, capsys):
    shared_path(STORIES)
    code = bench().main([str(REPO / "recipes" / "debug" / "eagle3-stories260k.yaml"), "--workdir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "features.mode must be offline" in err[0]


@pytest.mark.shared
@pytest.mark.skipif(not HAS_SPECULATORS, reason="speculators is not installed (scripts/install_speculators.sh)")
def test_a_draftsmith_curve_from_other_rows_is_refused(tmp_path, monkeypatch, capsys):
    """--draftsmith-metrics: a run whose tokens_seen differ at an evaluation trained on other rows."""
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "tokens_seen": 10.0 * s, "eval_acc_0": 0.1}) + "\n" for s in (1, 2)))
    code = bench().main(["--smoke", "--workdir", str(tmp_path / "work"), "--peers", "speculators",
                         "--draftsmith-metrics", str(metrics)])
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench_peer_recipe:")]
    assert len(err) == 1 and "did not train on the same rows" in err[0]


def test_peer_labels_from_a_top_k_cache_are_draftsmiths_soft_labels():
    """A top-K cache (features.label_topk) gives the peer the distribution draftsmith trains on: with K = V the
    dense labels' softmax (up to the cache's float16 gaps), with K < V exactly topk_soft_labels' p, 0 on every
    draft id the K entries miss, at the label temperature; packed_rows takes such a batch (it crashed on the
    TopKLogits tuple before)."""
    from draftsmith.data.features import TopKLogits, top_logits
    from draftsmith.heads.vocab_loss import topk_soft_labels

    module = bench()
    torch.manual_seed(0)
    vocab, draft_ids = 64, torch.tensor([0, 3, 7, 9, 11, 40])
    logits = torch.randn(2, 5, vocab) * 3
    dense = module.peer_label_logits(logits, draft_ids).softmax(-1)
    full = module.peer_label_logits(TopKLogits(*top_logits(logits, vocab), vocab), draft_ids).softmax(-1)
    assert torch.allclose(full, dense, atol=2e-3)
    assert torch.allclose(module.peer_label_logits(logits, draft_ids, 2.0).softmax(-1),
                          (logits[..., draft_ids] / 2).softmax(-1))
    top3 = TopKLogits(*top_logits(logits, 3), vocab)
    for temperature in (1.0, 2.0):
        peer = module.peer_label_logits(top3, draft_ids, temperature).softmax(-1)
        p, _ = topk_soft_labels(top3, draft_ids, temperature)
        held = p.sum(-1) > 0
        assert held.any() and (~held).any()
        assert torch.allclose(peer[held], p[held], atol=1e-6)
        assert (peer[held][p[held] == 0] == 0).all()
        assert torch.allclose(peer[~held], torch.full_like(peer[~held], 1 / len(draft_ids)))  # the documented gap

    lengths = torch.tensor([5, 3])
    mask = (torch.arange(5)[None] < lengths[:, None]).long()
    batch = {"input_ids": torch.randint(0, vocab, (2, 5)), "attention_mask": mask, "loss_mask": mask.clone(),
             "aux_hidden_states": torch.randn(2, 5, 12), "target_logits": top3}
    packed = module.packed_rows(batch, draft_ids, with_labels=True)
    labels = packed["verifier_last_hidden_states"][0]  # [4 + 2, dv]: each row's positions 1..length-1
    expected = module.peer_label_logits(top3, draft_ids)
    assert torch.equal(labels, torch.cat([expected[0, 1:5], expected[1, 1:3]]))
