"""Issue 22 (trust, round 3), eval and profile files: results are written atomically (a full disk
leaves the previous file whole), `profile` refuses bad counts naming the flag with exit 2, and NaN
or Infinity in a checkpoint's speedup_profile.json never reaches an export's draftsmith.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from draftsmith import cli
from draftsmith.eval import results

ROOT = Path(__file__).resolve().parents[2]


def test_a_full_disk_leaves_the_previous_results_file_whole(tmp_path):
    path = tmp_path / "results.json"
    previous = {"schema": "draftsmith.eval-results", "run": "previous"}
    results.write(previous, path)
    # A child whose files may not grow past 4 kB (RLIMIT_FSIZE: the disk is "full" mid-write).
    script = textwrap.dedent(f"""
        import resource, signal
        from draftsmith.eval import results
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            results.write({{"schema": "draftsmith.eval-results", "run": "new", "pad": "x" * 100000}}, {str(path)!r})
        except OSError as exc:
            print("OSError", exc.errno)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert "OSError 27" in proc.stdout, proc.stderr[-2000:]
    assert json.loads(path.read_text()) == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary file left


@pytest.mark.parametrize("flags, message", [
    (["--repeats", "-5"], "--repeats -5: must be >= 1"),
    (["--k-max", "0"], "--k-max 0: must be >= 1"),
    (["--num-prompts", "-1"], "--num-prompts -1: must be >= 1"),
    (["--batches", "1,x"], "--batches '1,x': give comma-separated integers"),
    (["--contexts", "0"], "--contexts '0': values must be >= 1"),
])
def test_profile_refuses_bad_counts_naming_the_flag_with_exit_2(tmp_path, capsys, flags, message):
    assert cli.main(["profile", str(tmp_path / "ckpt"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"draftsmith profile: error: {message}"), err


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_in_a_speedup_profile_never_reaches_the_export(tiny_run, tmp_path, constant):
    from draftsmith.export.api import export
    from draftsmith.train.loop import train

    final = train(tiny_run("prof", "train.max_steps=1")).final_checkpoint
    profile = {"schema": "draftsmith.speedup-profile", "recommended_num_speculative_tokens": 2,
               "speculation_pays_at_batch_1": True, "recommendation": {"w": {"speculation_stops_paying_at_batch": 8}}}
    text = json.dumps(profile)[:-1] + f', "validation_error": {{"mean_abs_relative": {constant}}}}}'
    (final / "speedup_profile.json").write_text(text)
    out = tmp_path / "exported"
    with pytest.raises(ValueError, match=rf"speedup_profile.json: holds {constant}, which is not JSON; rerun"):
        export(final, "vllm", out)
    assert not out.exists()
    (final / "speedup_profile.json").write_text(json.dumps(profile))  # a clean one is copied and summarised
    export(final, "vllm", out)
    sidecar = json.loads((out / "draftsmith.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert sidecar["speedup_profile"]["recommended_num_speculative_tokens"] == 2
