"""benchmarks/bench_peers_block.py: the block chains it walks are the drafts the real loop makes, its
per-position acceptance counts what the walk counts, speculators' chain does not see the padding it
adds, and the smoke mode runs end to end (the numbers in docs/benchmarks.md come from full runs)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads.dflash import DFlashDrafter
from draftsmith.heads.dspark import DSparkDrafter
from draftsmith.testing import tiny_target
from tests.conftest import STORIES, shared_path
from tests.heads.test_block_loop_consistency import Recording, as_batch
from tests.helpers import load_repo_module

REPO = Path(__file__).resolve().parents[2]


def bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    for name in ("bench_peers", "bench_peers_block"):  # fresh: bench_peers reads DRAFTSMITH_SHARED at import
        sys.modules.pop(name, None)
    return load_repo_module("benchmarks/bench_peers_block.py")


def test_position_acceptance_by_hand():
    """prompt of 2 tokens, 7 new tokens, k = 2: rounds at c = 3 (anchor 2), then where the walk goes."""
    seq = [1, 5, 10, 11, 12, 13, 14, 15, 16]
    right = [[seq[j + 2 + a] if j + 2 + a < len(seq) else 0 for j in range(len(seq))] for a in range(2)]
    right[1][1] = -1  # round 1 (c = 3, j = 1): position 0 right, position 1 wrong -> commit 2, c = 5
    right[0][3] = -1  # round 2 (c = 5, j = 3): position 0 wrong -> commit 1, c = 6
    # round 3 (c = 6, j = 4): k_round = min(2, 7 - 4 - 1) = 2, both right -> commit 3: 7 committed, done
    acc = bench().position_acceptance([right], [(torch.tensor(seq[:2]), seq[2:])], k=2)
    assert acc == [2 / 3, 1 / 2]


@pytest.mark.parametrize("cls", [DFlashDrafter, DSparkDrafter], ids=["dflash", "dspark"])
def test_block_chain_is_what_the_loop_drafts(cls):
    """Each loop round at context length c drafts, up to and including its first miss, exactly the chain's
    entries at position c - 2: so walking the chain is walking the loop."""
    module = bench()
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    prompt = torch.randint(3, target.vocab_size, (7,), generator=torch.Generator().manual_seed(11))
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=40))
    seq = torch.cat([prompt, torch.tensor(base.tokens)])[None]
    torch.manual_seed(1)
    options = {"confidence_threshold": 0.0} if cls is DSparkDrafter else {}
    d = cls.from_target(cls.Config(block_size=4, num_layers=2, num_anchors=64, aux_layer_ids=[1, 2, 3], **options), target)
    fit = as_batch(target, d, seq)
    opt = torch.optim.Adam(d.trainable_parameters(), lr=1e-2)
    for _ in range(40):  # fit the continuation a little, so that rounds accept some drafts
        opt.zero_grad()
        d.forward_loss(fit).loss.backward()
        opt.step()
    d.eval()
    k = 3
    prop = Recording(d.make_proposer(target))
    gen = generate(target, prop, prompt, LoopConfig(k=k, max_new_tokens=40, eos_ids=[]))
    chain = module.draftsmith_block_chain(d, target, torch.cat([prompt, torch.tensor(gen.tokens)])[None], k)
    assert any(r.accepted for r in gen.rounds) and any(r.accepted < r.proposed for r in gen.rounds)
    proposing = [r for r in gen.rounds if r.proposed]  # the loop's last round may verify nothing
    for (length, drafted), r in zip(prop.rounds, proposing, strict=True):
        upto = min(r.accepted + 1, len(drafted))
        assert drafted[:upto] == [chain[a][length - 2] for a in range(upto)], length


@pytest.mark.shared
def test_speculators_chain_ignores_its_padding_and_later_tokens(monkeypatch):
    """The peer's blocks see only positions before their anchor: appending tokens leaves every draft the
    walk can reach unchanged (the B padding positions the chain adds are never read; DSpark's Markov
    head reads a padding token only for drafts past the sequence's end, which no round walks)."""
    pytest.importorskip("speculators")
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    module = bench()
    from draftsmith.targets import load as target_mod

    target = target_mod.load(str(module.bp.STORIES), dtype="float32", device="cpu")

    class Cfg:
        num_layers, block_size, markov_rank = 2, 5, 8

    seq = torch.randint(3, target.vocab_size, (1, 30), generator=torch.Generator().manual_seed(0))
    for kind in ("dflash", "dspark"):
        torch.manual_seed(0)
        model = module.speculators_model(kind, Cfg, 0).eval()
        short = module.speculators_block_chain(model, target, seq[:, :20], 3, kind)
        full = module.speculators_block_chain(model, target, seq, 3, kind)
        for a in range(3):  # entries that predict a token of the short sequence (j + 2 + a < 20): the walked ones
            n = 20 - 2 - a
            assert short[a][:n] == full[a][:n], (kind, a)


@pytest.mark.shared
def test_smoke_mode_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    module = bench()
    out = tmp_path / "block.json"
    peers = "draftsmith,speculators" if importlib.util.find_spec("speculators") else "draftsmith"
    assert module.main(["--smoke", "--workdir", str(tmp_path / "work"), "--out", str(out), "--peers", peers]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["kind"] for r in runs] == ["dflash", "dspark"]
    for run in runs:
        assert run["draftsmith_lossless"] and run["draftsmith_tau"] == pytest.approx(run["draftsmith_loop_tau"], abs=0.03)
        assert len(run["draftsmith_per_position"]) == module.K
        if "speculators" in peers:
            assert 1.0 <= run["speculators_tau"] <= 6.0
            assert run["speculators_trainable_params"] == run["draftsmith_trainable_params"]
