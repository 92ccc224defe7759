"""benchmarks/bench_peers.py: its round walk counts rounds exactly as the speculative loop does, and
its 2-step smoke mode runs end to end (CI runs only this mode; the numbers come from full runs)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import STORIES, shared_path
from tests.helpers import load_repo_module

REPO = Path(__file__).resolve().parents[2]


def bench():
    return load_repo_module("benchmarks/bench_peers.py")


def test_walk_rounds_by_hand():
    """prompt of 2 tokens, 6 new tokens, k = 3: the prefill commits seq[2]; rounds start at c = 3."""
    seq = [1, 5, 10, 11, 12, 13, 14, 15]
    right = {j + 2 + t: seq[j + 2 + t] for j in range(6) for t in range(3) if j + 2 + t < len(seq)}
    # step t at drafter position j predicts seq[j + 2 + t]; make step 1 wrong from position 1 (c = 3)
    preds = [[right.get(j + 2 + t, 0) if not (t == 1 and j == 1) else -1 for j in range(6)] for t in range(3)]
    committed, rounds = bench().walk_rounds(preds, seq, prompt_len=2, new_tokens=6, k=3)
    # round 1 at c=3 (j=1): step 0 right, step 1 wrong -> accept 1, commit 2 (c=5)
    # round 2 at c=5 (j=3): k_round = min(3, 6 - 3 - 1) = 2, both right -> commit 3 (c=8, 6 tokens done)
    assert (committed, rounds) == (5, 2)


@pytest.mark.shared
def test_smoke_mode_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    module = bench()
    out = tmp_path / "peers.json"
    peers = "draftsmith,speculators" if importlib.util.find_spec("speculators") else "draftsmith"
    assert module.main(["--smoke", "--workdir", str(tmp_path / "work"), "--out", str(out), "--peers", peers]) == 0
    report = json.loads(out.read_text())
    run = report["runs"][0]
    assert run["steps"] == 2 and run["draftsmith_lossless"]
    assert run["draftsmith_tau"] == pytest.approx(run["draftsmith_loop_tau"], abs=0.03)
    assert 1.0 <= run["draftsmith_tau"] <= 4.0
    if "speculators" in peers:
        assert 1.0 <= run["speculators_tau"] <= 4.0


@pytest.mark.shared
def test_float32_feature_cache_trains_the_same_drafter_as_online_features(tmp_path, monkeypatch):
    """--features-cache: the offline path the cache-dtype rows use; at float32 it must reproduce the
    online run exactly (same rows, order and features), so a dtype's change in tau is the dtype's."""
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    module, work = bench(), tmp_path / "work"
    from safetensors.torch import load_file

    runs, weights = {}, {}
    for name, extra in (("online", []), ("cache", ["--features-cache", "float32"])):
        out = tmp_path / f"{name}.json"
        assert module.main(["--smoke", "--peers", "draftsmith", "--workdir", str(work), "--out", str(out), *extra]) == 0
        runs[name] = json.loads(out.read_text())
        weights[name] = load_file(str(work / "ds-2-0" / "final" / "drafter.safetensors"))
    assert weights["online"].keys() == weights["cache"].keys()
    for key, value in weights["online"].items():  # the 2 training steps moved the weights identically
        assert torch.equal(value, weights["cache"][key]), key
    assert (work / "features-float32" / "manifest.json").exists()
    assert runs["cache"]["protocol"]["features_cache"] == "float32"
    online, cached = runs["online"]["runs"][0], runs["cache"]["runs"][0]
    assert cached["draftsmith_tau"] == online["draftsmith_tau"]
    assert cached["draftsmith_loop_tau"] == online["draftsmith_loop_tau"]


@pytest.mark.shared
def test_export_protocol_holds_the_batches_draftsmith_trains_on_and_score_chains_walks_them(tmp_path, monkeypatch):
    """--export-protocol: an outside trainer (benchmarks/peer_modelopt.py) gets draftsmith's own batches,
    in order; --score-chains: chains that always propose the continuation commit k + 1 a round."""
    monkeypatch.setenv("DRAFTSMITH_SHARED", str(shared_path(STORIES).parents[1]))
    module, work, out = bench(), tmp_path / "work", tmp_path / "protocol"
    assert module.main(["--smoke", "--workdir", str(work), "--export-protocol", str(out)]) == 0
    exported = json.loads((out / "train-seed0.json").read_text())
    stream = module.draftsmith_trainer(work / "stories-8-1234.jsonl", tmp_path / "fresh", 2, 0, []).stream
    assert len(exported["batches"]) == 2
    for rows in exported["batches"]:
        batch = next(stream)
        assert len(rows) == batch["input_ids"].shape[0]
        for b, row in enumerate(rows):
            n = int(batch["attention_mask"][b].sum())
            assert row["input_ids"] == batch["input_ids"][b, :n].tolist()
            assert row["loss_mask"] == batch["loss_mask"][b, :n].tolist()
    prompts = json.loads((out / "eval.json").read_text())["prompts"]
    k = 3
    chains = []
    for p in prompts:
        seq = p["prompt"] + p["continuation"]
        chains.append([[seq[j + 2 + t] if j + 2 + t < len(seq) else -1 for j in range(len(seq))] for t in range(k)])
    run = {"peer": "oracle", "seed": 0, "steps": 0, "k": k, "eval": prompts, "chains": chains}
    (tmp_path / "oracle.json").write_text(json.dumps(run))
    report_path = tmp_path / "scored.json"
    assert module.main(["--smoke", "--workdir", str(work), "--score-chains", str(tmp_path / "oracle.json"),
                        "--out", str(report_path)]) == 0
    tau = json.loads(report_path.read_text())["runs"][0]["tau"]
    assert 3.5 < tau <= k + 1  # every round accepts all k drafts (only the last rounds are cut short)
    run["eval"][0]["continuation"][0] += 1  # a different eval set is refused
    (tmp_path / "oracle.json").write_text(json.dumps(run))
    assert module.main(["--smoke", "--workdir", str(work), "--score-chains", str(tmp_path / "oracle.json")]) == 1
