"""Issue 22 (trust, round 3), export: no write through a link in --out, NaN/inf weights fail the
gate, k is bounded by draftsmith and by the target, the TRT-LLM YAML quotes its path, temp dirs of
killed exports are cleaned and SIGTERM cleans up, a full disk is one line."""
from __future__ import annotations

import copy
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from draftsmith.cli import main as cli_main
from draftsmith.core.errors import UserError
from draftsmith.export import export
from draftsmith.export.api import replace_export_files
from draftsmith.export.layout import ExportOptions, ExportValidationError
from tests.export.conftest import make_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- 4: links inside --out


def test_overwrite_never_writes_through_a_linked_folder(tmp_path):
    """A previous Medusa-2 export's adapter/ replaced by a link to the user's own folder: refused, and
    nothing is written there (before the fix the new adapter file landed in the linked folder)."""
    out, elsewhere, new = tmp_path / "exported", tmp_path / "precious", tmp_path / "new"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "adapter_model.safetensors").write_bytes(b"the user's own weights")
    (out / "adapter").symlink_to(elsewhere, target_is_directory=True)
    (out / "draftsmith.json").write_text(json.dumps({"format": "vllm", "draftsmith_version": "0", "files": [
        "adapter/adapter_model.safetensors", "draftsmith.json"]}))
    (new / "adapter").mkdir(parents=True)
    (new / "adapter" / "adapter_model.safetensors").write_bytes(b"new export")
    (new / "draftsmith.json").write_text("{}")
    with pytest.raises(UserError, match=r"adapter is a symbolic link .*does not write through links"):
        replace_export_files(new, out)
    assert (elsewhere / "adapter_model.safetensors").read_bytes() == b"the user's own weights"
    assert json.loads((out / "draftsmith.json").read_text())["format"] == "vllm"  # nothing moved


def test_overwrite_replaces_a_linked_file_without_following_it(eagle3_loaded, tmp_path):
    out, victim = tmp_path / "exported", tmp_path / "victim.bin"
    export(None, "sglang", out, loaded=eagle3_loaded, validate=False)
    victim.write_bytes(b"keep me")
    (out / "model.safetensors").unlink()
    (out / "model.safetensors").symlink_to(victim)
    export(None, "sglang", out, loaded=eagle3_loaded, validate=False, overwrite=True)
    assert victim.read_bytes() == b"keep me" and not (out / "model.safetensors").is_symlink()


# ---------------------------------------------------------------- 7: NaN / inf weights


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_fail_the_gate_naming_the_tensor(eagle3_loaded, tmp_path, value):
    bad = copy.deepcopy(eagle3_loaded)
    with torch.no_grad():
        bad.drafter.fc.weight[0, 0] = value
    out = tmp_path / "exported"
    with pytest.raises(ExportValidationError, match=r"fc\.weight holds 1 NaN/inf value"):
        export(None, "vllm", out, loaded=bad)
    assert not out.exists()


# ---------------------------------------------------------------- 9: k bounded


def test_huge_num_speculative_tokens_is_refused_at_once(eagle3_ckpt, tmp_path, capsys):
    start = time.perf_counter()
    rc = cli_main(["export", str(eagle3_ckpt), "--to", "sglang", "--out", str(tmp_path / "x"),
                   "--num-speculative-tokens", "100000"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and "--num-speculative-tokens 100000" in line and "at most 64" in line
    assert time.perf_counter() - start < 60 and not (tmp_path / "x").exists()


def test_k_inherited_from_ttt_steps_is_bounded_naming_the_key(eagle3_loaded, tmp_path):
    bad = copy.deepcopy(eagle3_loaded)
    bad.drafter.cfg.ttt_steps = 10000  # a received config's drafter.ttt_steps, the default k of sglang/trtllm
    for fmt in ("sglang", "trtllm"):
        with pytest.raises(UserError, match=r"drafter\.ttt_steps .*10000: at most 64"):
            export(None, fmt, tmp_path / fmt, loaded=bad)


def test_k_must_fit_in_the_targets_positions(tmp_path):
    ckpt = make_checkpoint(tmp_path / "short", "eagle3", {"ttt_steps": 2}, max_positions=48)
    with pytest.raises(UserError, match=r"--num-speculative-tokens 40: the target has 48 positions, so at most 32"):
        export(ckpt, "vllm", tmp_path / "out", ExportOptions(num_speculative_tokens=40))
    export(ckpt, "vllm", tmp_path / "ok", ExportOptions(num_speculative_tokens=32))  # at the bound: validated


# ---------------------------------------------------------------- TRT-LLM YAML


def test_trtllm_yaml_path_with_hash_and_colon_parses_back(eagle3_loaded, tmp_path):
    out = tmp_path / "a #not a comment: b"
    export(None, "trtllm", out, loaded=eagle3_loaded)
    spec = yaml.safe_load((out / "extra_llm_api_options.yaml").read_text())["speculative_config"]
    assert spec["speculative_model"] == str(out)


# ---------------------------------------------------------------- leftovers


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_next_export_removes_temp_dirs_of_killed_exports_only(eagle3_loaded, tmp_path):
    dead = tmp_path / f".exported.tmp-{_dead_pid()}-ab12_c"
    alive = tmp_path / f".exported.tmp-{os.getpid()}-zz"  # a running export (this process)
    foreign = [tmp_path / ".exported.tmp-notapid", tmp_path / f".other.tmp-{_dead_pid()}-x", tmp_path / "mine"]
    for d in [dead, alive, *foreign]:
        d.mkdir()
        (d / "f").write_text("x")
    export(None, "sglang", tmp_path / "exported", loaded=eagle3_loaded, validate=False)
    assert not dead.exists() and alive.exists() and all(d.exists() for d in foreign)


SLOW_EXPORT = """
import sys, time
from pathlib import Path
import draftsmith.export.validate as v
from draftsmith.export import export
def slow(*a, **k):
    Path(sys.argv[3]).write_text("in validation")
    time.sleep(120)
v.validate_export = slow
export(sys.argv[1], "sglang", sys.argv[2])
"""


def test_sigterm_during_export_leaves_no_temp_dir(eagle3_ckpt, tmp_path):
    out, marker = tmp_path / "exported", tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, str(eagle3_ckpt), str(out), str(marker)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert marker.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "never validated"
        assert [p.name for p in tmp_path.glob(".exported.tmp-*")]  # the export is building its temp dir
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not list(tmp_path.glob(".exported.tmp-*")) and not out.exists()


def test_full_disk_during_export_is_one_line_naming_the_path(eagle3_ckpt, tmp_path, monkeypatch, capsys):
    import draftsmith.export.api as api

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(api, "save_file", full)
    out = tmp_path / "exported"
    rc = cli_main(["export", str(eagle3_ckpt), "--to", "vllm", "--out", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and str(out) in line and "no space left" in line
    assert not out.exists() and not list(tmp_path.glob(".exported.tmp-*"))


def _limited_file_size(limit: int):
    """preexec_fn: files past `limit` bytes fail with EFBIG (SIGXFSZ ignored), a real failing write."""
    import resource

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_write_that_runs_out_of_room_is_one_line(eagle3_ckpt, tmp_path):
    """A real failing write (the file size limit: safetensors raises its own SafetensorError, no OSError)."""
    out = tmp_path / "exported"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "draftsmith", "export", str(eagle3_ckpt), "--to", "vllm", "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=_limited_file_size(20000))
    line = _one_line(proc.stderr)
    assert proc.returncode == 2 and str(out) in line and "no space left" in line and "Traceback" not in proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".exported.tmp-*"))
