"""benchmarks/bench_real_target.py on the embedded pycode-tiny target (CI never needs Gemma): every row
is draftsmith's own eval, the transformers prompt-lookup baseline times the same prompt ids, the
speedup against it is the per-prompt ratio of the two measured token rates, and the summary and the
per-kind results files are written."""
from __future__ import annotations

import json

import pytest

from tests.helpers import load_repo_module


def load_bench():
    return load_repo_module("benchmarks/bench_real_target.py")


def test_split_checkpoint_reads_a_trailing_k():
    bench = load_bench()
    assert bench.split_checkpoint("runs/x/final:5", 4) == ("runs/x/final", 5)
    assert bench.split_checkpoint("runs/x/final", 4) == ("runs/x/final", 4)
    assert bench.split_checkpoint("C:/runs/x", 3) == ("C:/runs/x", 3)  # a colon that is no k


def test_bench_real_target_on_the_toy_target(tmp_path, capsys):
    bench = load_bench()
    rc = bench.main(["--target", "builtin:pycode-tiny", "--workloads", "pycode", "--num-prompts", "2",
                     "--max-new-tokens", "12", "--dtype", "float32", "--out-dir", str(tmp_path), "--tag", "t"])
    assert rc == 0
    summary = json.loads((tmp_path / "summary-float32-t.json").read_text())
    (row,) = summary["rows"]
    assert row["kind"] == "ngram" and row["workload"] == "pycode" and row["num_prompts"] == 2
    assert 1.0 <= row["tau"] <= 5.0 and len(row["per_position_acceptance"]) == 4
    assert row["lossless"] == "2/2 identical" and row["lossless_passed"] is True
    eval_results = json.loads((tmp_path / "ngram-float32-k4-t.json").read_text())
    reqs = eval_results["workloads"]["pycode"]["requests"]
    hf = summary["hf_per_prompt"]["pycode"]
    ratios = sorted(r["spec_tokens_per_s"] / hf[r["id"]]["pld_tokens_per_s"] for r in reqs)
    assert row["speedup_vs_hf_prompt_lookup"]["median"] == pytest.approx(sum(ratios) / 2)  # median of two
    (pld,) = summary["transformers"]
    assert pld["lossless"] == "2/2 identical to plain generate"  # float32 prompt lookup is exact
    assert "| ngram | 4 | pycode | 2 |" in capsys.readouterr().out


def test_ngram_first_rows_run_the_checkpoint_behind_the_lookup(tmp_path):
    """--ngram-first: a checkpoint row runs as `eval --ngram-first` with --ngram-min, labelled NAME+ngram-first,
    and its summary rows carry the split of rounds between the lookup and the drafter."""
    from tests.export.conftest import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "ck", "eagle3", {"ttt_steps": 2})
    bench = load_bench()
    rc = bench.main([f"{ckpt}:2", "--no-ngram", "--no-hf", "--ngram-first", "--ngram-min", "2", "--workloads", "pycode",
                     "--num-prompts", "2", "--max-new-tokens", "12", "--dtype", "float32", "--k", "3",
                     "--out-dir", str(tmp_path / "out"), "--tag", "t"])
    assert rc == 0
    (row,) = json.loads((tmp_path / "out" / "summary-float32-t.json").read_text())["rows"]
    assert row["kind"] == "ck+ngram-first-dk2" and row["lossless_passed"] is True
    assert sum(row["ngram_first_rounds"].values()) > 0
    results = json.loads((tmp_path / "out" / "ck+ngram-first-dk2-float32-k3-t.json").read_text())  # the loop's k: --k
    assert results["drafter"]["ngram_first"]["min_ngram"] == 2 and results["drafter"]["ngram_first"]["drafter_k"] == 2
    assert row["drafter_k"] == 2
    # a drafter deeper than the lookup's --k: refused (UserError: the script exits 2), before anything runs
    from draftsmith.core.errors import UserError
    with pytest.raises(UserError, match="drafts at most --k"):
        bench.main([f"{ckpt}:5", "--no-ngram", "--no-hf", "--ngram-first", "--k", "3", "--out-dir", str(tmp_path / "deep")])
    assert not (tmp_path / "deep").exists()
