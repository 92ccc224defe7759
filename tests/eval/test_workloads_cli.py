"""Workload registry (read from ../shared/data), prompt encoding, metrics, and `draftsmith eval` end to end."""
from __future__ import annotations

import json

import pytest

from draftsmith.cli import main as cli_main
from draftsmith.eval import metrics, workloads
from draftsmith.eval.loop import Generation, RoundStats
from draftsmith.testing import TINY_CHAT_TEMPLATE, byte_tokenizer

try:
    from tests.conftest import REPO, STORIES, shared_path
except ImportError:  # pytest run from inside tests/
    from conftest import REPO, STORIES, shared_path

COUNTS = {"spec_bench/mt_bench": 80, "spec_bench/translation": 80, "spec_bench/summarization": 80, "spec_bench/qa": 80,
          "spec_bench/math_reasoning": 80, "spec_bench/rag": 80, "mt_bench": 80, "humaneval": 164, "gsm8k": 1319,
          "alpaca": 999}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_registry_loads_every_workload(name):
    data = shared_path("data")
    items = workloads.load(name, data)
    assert len(items) == COUNTS[name]
    assert len({i["id"] for i in items}) == len(items) and all(isinstance(i["prompt"], str) and i["prompt"] for i in items)


def test_spec_bench_group_and_first_turn():
    data = shared_path("data")
    assert workloads.expand(["spec_bench", "mt_bench"]) == [f"spec_bench/{t}" for t in workloads.SPEC_BENCH_TASKS] + ["mt_bench"]
    first = json.loads((data / "mt_bench" / "question.jsonl").read_text().splitlines()[0])
    mt = workloads.load("mt_bench", data, num_prompts=8)
    assert mt[0]["prompt"] == first["turns"][0]
    assert len({i["category"] for i in mt}) == 8  # round-robin over categories
    with pytest.raises(KeyError, match="did you mean 'gsm8k'"):
        workloads.expand(["gsm8"])
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        workloads.load("gsm8k", data / "nowhere")


def test_user_jsonl(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n{"messages": [{"role": "user", "content": "yo"}]}\n{"turns": ["t1", "t2"]}\n')
    items = workloads.load(f"jsonl:{path}")
    assert [(i["id"], i["prompt"]) for i in items] == [("a", "hi"), ("row-1", "yo"), ("row-2", "t1")]
    path.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="row 1"):
        workloads.load(f"jsonl:{path}")


def test_encode_chat_vs_raw_and_truncation():
    chat_tok, base_tok = byte_tokenizer(TINY_CHAT_TEMPLATE), byte_tokenizer()
    item = {"id": "x", "prompt": "hello"}
    ids, _ = workloads.encode(item, chat_tok)
    assert chat_tok.decode(ids) == "<s>user: hello</s><s>assistant: "
    ids, truncated = workloads.encode(item, base_tok)
    assert base_tok.decode(ids) == "hello" and not truncated
    ids, truncated = workloads.encode(item, base_tok, max_tokens=3)
    assert base_tok.decode(ids) == "llo" and truncated


def test_per_position_and_tau():
    rounds = [RoundStats(3, 3, 4, 0, 0, 0), RoundStats(3, 1, 2, 0, 0, 0), RoundStats(3, 0, 1, 0, 0, 0)]
    spec = Generation([1], list(range(8)), "length", 0.1, 1.0, rounds, k=3)
    base = Generation([1], list(range(8)), "length", 0.1, 2.0, [RoundStats(0, 0, 1, 0, 0, 0)] * 7)
    r = metrics.request_metrics(spec, base, 3)
    assert r["accepted_by_position"] == [2, 1, 1] and r["reached_position"] == [3, 2, 1]
    assert r["acceptance_length"] == pytest.approx(7 / 3) and r["speedup"] == pytest.approx(2.0)
    agg = metrics.aggregate([r], 3)
    assert agg["per_position_acceptance"] == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert agg["acceptance_rate"] == pytest.approx(4 / 9)


def test_cli_end_to_end_writes_results(tmp_path, capsys):
    stories = shared_path(STORIES)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Once upon a time"}\n{"id": "b", "prompt": "Lily saw a big"}\n')
    out = tmp_path / "r.json"
    rc = cli_main(["eval", "--draft-model", str(stories), "--target", str(stories), "--workloads", f"jsonl:{prompts}",
                   "--k", "3", "--max-new-tokens", "24", "--warmup", "0", "--check-lossless", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert (res["schema"], res["schema_version"], res["definitions"]) == ("draftsmith.eval-results", 1, "draftsmith-v1")
    w = res["workloads"][f"jsonl:{prompts}"]
    assert w["num_requests"] == 2 and [r["id"] for r in w["requests"]] == ["a", "b"]
    assert w["aggregate"]["acceptance_rate"] == 1.0  # the draft model is the target itself
    assert all(r["lossless"] for r in w["requests"]) and res["lossless"]["passed"] is True
    assert res["target"]["fingerprint"] == res["drafter"]["fingerprint"]
    assert "speedup" in capsys.readouterr().out


def test_lossless_mismatch_fails_the_run(tmp_path, monkeypatch):
    """A lossy rule (accept every draft) must be caught with the prompt id and first differing position."""
    from draftsmith.core.sampling import Verdict
    from draftsmith.eval import loop

    stories = shared_path(STORIES)
    monkeypatch.setattr(loop, "verify", lambda d, q, logits, params, gen: Verdict(d.shape[0], int(logits[-1].argmax())))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "only", "prompt": "Once upon a time"}\n')
    out = tmp_path / "r.json"
    rc = cli_main(["eval", "--proposer", "ngram", "--target", str(stories), "--workloads", f"jsonl:{prompts}",
                   "--k", "4", "--max-new-tokens", "40", "--warmup", "0", "--check-lossless", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 1 and res["lossless"]["passed"] is False
    (m,) = res["lossless"]["mismatches"]
    assert m["id"] == "only" and isinstance(m["position"], int) and m["spec_token"] != m["target_token"]


def test_cli_evaluates_a_training_checkpoint(tmp_path):
    """`draftsmith eval runs/NAME/final`: rebuilt by draftsmith.checkpoint.load_drafter, stochastic + lossless check."""
    from draftsmith import checkpoint
    from draftsmith import config as config_mod
    from draftsmith.heads import DRAFTERS
    from draftsmith.targets import load as target_mod

    shared_path(STORIES)
    cfg = config_mod.load(str(REPO / "recipes" / "debug" / "eagle3-stories260k.yaml"))
    cfg.target.path = str(shared_path(STORIES))
    target = target_mod.from_config(cfg.target)
    drafter = DRAFTERS.get("eagle3").from_target(cfg.drafter.options, target, None)
    checkpoint.save(tmp_path / "run" / "final", drafter, target, cfg, step=0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Once upon a time"}\n')
    out = tmp_path / "r.json"
    rc = cli_main(["eval", str(tmp_path / "run" / "final"), "--workloads", f"jsonl:{prompts}", "--k", "3",
                   "--max-new-tokens", "16", "--warmup", "0", "--temperature", "1.0", "--check-lossless",
                   "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["lossless"]["passed"] is True
    assert res["drafter"]["kind"] == "eagle3" and res["drafter"]["name"] == "run"
    assert res["config"]["verification"] == "stochastic" and res["config"]["recipe"]["drafter"]["kind"] == "eagle3"
    assert res["drafter"]["num_params"] == sum(t.numel() for t in drafter.state_dict_for_export().values())
