"""Issue 22 (trust, round 3), eval / profile / report: every out-of-range flag is one line naming it
(k, k-max, trees, batch size, workloads, temperature, dtype, device), k = 0 reports no "speedup",
--dtype is honoured and recorded, and --out never writes into a checkpoint."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.cli import main as cli_main
from tests.conftest import refused_in_one_line
from tests.export.conftest import make_checkpoint

NGRAM = ["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", "--workloads", "pycode"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("eval-trust"), "eagle3", {"ttt_steps": 2}, max_positions=48)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "hello"}\n')
    return path


def _eval(ckpt, prompts, out, *extra):
    return ["eval", str(ckpt), "--workloads", f"jsonl:{prompts}", "--k", "2", "--max-new-tokens", "4",
            "--warmup", "0", "--device", "cpu", "--out", str(out), *extra]


@pytest.mark.parametrize("flags, needles", [
    (["--k", "100000"], ["--k 100000", "at most 64"]),
    (["--k", "-1"], ["--k -1", ">= 1"]),
    (["--k", "0"], ["--k 0", "measures nothing"]),
    (["--batch-size", "0"], ["--batch-size 0", ">= 1"]),
    (["--temperature", "nan"], ["--temperature nan", "finite"]),
    (["--temperature", "inf"], ["--temperature inf", "finite"]),
    (["--top-p", "nan"], ["--top-p nan"]),
    (["--dtype", "int8"], ["--dtype 'int8'", "float32, bfloat16, float16"]),
    (["--tree", "static", "--tree-depth", "5000"], ["--tree-depth 5000", "at most 64"]),
    (["--tree", "static", "--verify-budget", "1000000"], ["--verify-budget 1000000", "1..1024"]),
    (["--tree", "dynamic", "--tree-topk", "100000"], ["--tree-topk 100000", "1..64"]),
    (["--device", "not-a-device"], ["'not-a-device'", "not a torch device"]),
])
def test_out_of_range_eval_flags_are_one_line(capsys, flags, needles):
    refused_in_one_line(capsys, NGRAM + flags, *needles)


def test_empty_workload_list_is_refused(capsys):
    refused_in_one_line(capsys, ["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", "--workloads", ","],
             "--workloads ','", "names no workload")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_one_line(capsys):
    refused_in_one_line(capsys, NGRAM + ["--device", "cuda"], "'cuda'", "CUDA is not available")


def test_k_and_tree_are_bounded_by_the_targets_positions(ckpt, prompts, tmp_path, capsys):
    refused_in_one_line(capsys, _eval(ckpt, prompts, tmp_path / "r.json") + ["--k", "40"], "--k 40", "48 positions", "at most 32")
    refused_in_one_line(capsys, _eval(ckpt, prompts, tmp_path / "r.json") + ["--tree", "dynamic", "--verify-budget", "40"],
             "--verify-budget 40", "48 positions")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv, needles", [
    (["profile", "nowhere", "--k-max", "-1"], ["--k-max -1", ">= 1"]),
    (["profile", "nowhere", "--k-max", "100000000"], ["--k-max 100000000", "at most 64"]),
    (["report", "nowhere.json", "--k-max", "-1"], ["--k-max -1", ">= 0"]),
    (["report", "nowhere.json", "--k-max", "100000000"], ["--k-max 100000000", "at most 64"]),
    (["leaderboard", "nowhere.json", "--k-max", "100000000"], ["--k-max 100000000", "at most 64"]),
])
def test_k_max_is_bounded_before_anything_runs(capsys, argv, needles):
    refused_in_one_line(capsys, argv, *needles)


def test_eval_dtype_is_honoured_and_recorded(ckpt, prompts, tmp_path):
    out = tmp_path / "r.json"
    assert cli_main(_eval(ckpt, prompts, out, "--dtype", "bfloat16")) == 0
    assert json.loads(out.read_text())["config"]["dtype"] == "bfloat16"
    assert cli_main(_eval(ckpt, prompts, out)) == 0  # default: the checkpoint's target.dtype
    assert json.loads(out.read_text())["config"]["dtype"] == "float32"


def test_eval_out_inside_a_checkpoint_is_refused(ckpt, prompts, capsys):
    before = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
    for out in (ckpt / "config.yaml", ckpt / "results.json", ckpt / "sub" / "r.json"):
        refused_in_one_line(capsys, _eval(ckpt, prompts, out), f"--out {out}", "inside the checkpoint")
    assert {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()} == before
