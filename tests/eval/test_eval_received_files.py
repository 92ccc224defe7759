"""Issue 34 (trust, round 4), eval / profile / checkpoints: --out is never a device node, FIFO or
socket, batch sizes are bounded, --near-tie-steps and --top-p mean what they say, and received
checkpoint files (drafter.json, config.yaml, speedup_profile.json) are regular files of bounded size."""
from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from draftsmith import checkpoint
from draftsmith.core.errors import UserError
from tests.conftest import refused_in_one_line
from tests.export.conftest import make_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("eval-trust4"), "eagle3", {"ttt_steps": 2}, max_positions=48)


def _eval(ckpt, out, *extra):
    return ["eval", str(ckpt), "--workloads", "pycode", "--num-prompts", "1", "--k", "2", "--max-new-tokens", "4",
            "--warmup", "0", "--device", "cpu", "--out", str(out), *extra]


def _device_node(path):
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null, never /dev/null itself


def test_eval_out_that_is_a_device_node_is_refused_and_kept(ckpt, tmp_path, capsys):
    _device_node(tmp_path / "x")
    refused_in_one_line(capsys, _eval(ckpt, tmp_path / "x"), f"--out {tmp_path / 'x'}", "character device")
    assert stat.S_ISCHR(os.lstat(tmp_path / "x").st_mode)


def test_eval_out_that_is_a_fifo_is_refused(ckpt, tmp_path, capsys):
    os.mkfifo(tmp_path / "f")
    refused_in_one_line(capsys, _eval(ckpt, tmp_path / "f"), "--out", "FIFO")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "f").st_mode)


def test_profile_out_that_is_a_device_node_is_refused(ckpt, tmp_path, capsys):
    _device_node(tmp_path / "p")
    refused_in_one_line(capsys, ["profile", str(ckpt), "--workloads", "pycode", "--out", str(tmp_path / "p")],
              "--out", "character device")
    assert stat.S_ISCHR(os.lstat(tmp_path / "p").st_mode)


@pytest.mark.parametrize("argv, needles", [
    (["profile", "nowhere", "--batches", "1,1000000000"], ["--batches 1000000000", "1..1024"]),
    (["profile", "nowhere", "--validate-batches", "5000"], ["--validate-batches 5000", "1..1024"]),
    (["profile", "nowhere", "--overhead-batch", "99999"], ["--overhead-batch 99999", "1..1024"]),
    (["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", "--batch-size", "100000"],
     ["--batch-size 100000", "1..1024"]),
    (["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", "--near-tie-steps", "nan"],
     ["--near-tie-steps nan", "finite"]),
    (["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", "--near-tie-steps", "inf"],
     ["--near-tie-steps inf", "finite"]),
])
def test_sizes_and_flags_are_bounded_before_anything_loads(capsys, argv, needles):
    refused_in_one_line(capsys, argv, *needles)


def _copy(ckpt, tmp_path):
    import shutil

    dst = tmp_path / "ck"
    shutil.copytree(ckpt, dst, symlinks=True)
    return dst


def test_checkpoint_files_linked_to_dev_zero_or_fifos_are_one_line(ckpt, tmp_path, capsys):
    ck = _copy(ckpt, tmp_path)
    (ck / "drafter.json").unlink()
    (ck / "drafter.json").symlink_to("/dev/zero")
    refused_in_one_line(capsys, _eval(ck, tmp_path / "r.json"), "drafter.json", "character device")
    ck2 = _copy(ckpt, tmp_path / "b")
    (ck2 / "config.yaml").unlink()
    os.mkfifo(ck2 / "config.yaml")
    refused_in_one_line(capsys, _eval(ck2, tmp_path / "r.json"), "config.yaml", "FIFO")


@pytest.mark.parametrize("profile, needle", [
    ({"schema": "draftsmith.speedup-profile", "recommendation": [1]}, "`recommendation` must map"),
    ({"schema": "draftsmith.speedup-profile", "recommendation": {"w": 5}}, "`recommendation` must map"),
    ({"schema": "other"}, "is not draftsmith.speedup-profile"),
])
def test_a_damaged_speedup_profile_is_one_line_at_load(ckpt, tmp_path, profile, needle):
    ck = _copy(ckpt, tmp_path)
    (ck / "speedup_profile.json").write_text(json.dumps(profile))
    with pytest.raises(UserError, match=needle):
        checkpoint.load_drafter(ck, device="cpu")
    (ck / "speedup_profile.json").write_text(json.dumps(profile), encoding="utf-16")
    with pytest.raises(UserError, match="speedup_profile.json: not UTF-8"):
        checkpoint.load_drafter(ck, device="cpu")
    assert checkpoint.load_drafter(ck, device="cpu", check_profile=False).drafter is not None  # profile rewrites it


def test_export_refuses_a_profile_whose_recommendation_is_not_a_mapping(ckpt, tmp_path):
    from draftsmith.export import export

    ck = _copy(ckpt, tmp_path)
    (ck / "speedup_profile.json").write_text(json.dumps({"schema": "draftsmith.speedup-profile",
                                                         "recommendation": {"w": 5}}))
    with pytest.raises(UserError, match="speedup_profile.json: `recommendation` must map"):
        export(ck, "vllm", tmp_path / "out")


def test_a_tiny_top_p_keeps_the_top_token():
    from draftsmith.core.sampling import SamplingParams, logits_to_probs, sample

    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    for top_p in (1e-300, 5e-324, 1e-12):
        probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
        assert torch.equal(sample(probs), logits.argmax(-1))


def test_a_jsonl_workload_row_that_is_not_an_object_is_one_line(ckpt, tmp_path, capsys):
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "hi"}\n[1, 2]\n')
    argv = ["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", "--workloads", f"jsonl:{rows}",
            "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path / "r.json")]
    refused_in_one_line(capsys, argv, f"jsonl:{rows}", "row 2 is a JSON list")


@pytest.mark.parametrize("extra, needles", [
    (["--engine-export", "exp"], ["--engine-export set up the engine run", "add --engine llama.cpp"]),
    (["--target-gguf", "t.gguf"], ["--target-gguf set up the engine run"]),
    (["--engine-export", "exp", "--engine-threads", "2"], ["--engine-export and --engine-threads", "drop them"]),
])
def test_engine_flags_without_engine_are_refused_not_ignored(capsys, extra, needles):
    refused_in_one_line(capsys, ["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", *extra], *needles)
