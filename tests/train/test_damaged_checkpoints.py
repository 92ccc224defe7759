"""Issue 22 (trust, round 3), checkpoints and targets: damaged drafter.json / safetensors and
mismatched shapes are one line naming the file, d2t is checked at load, the target fingerprint
covers every value, init_from refuses weights trained on other aux layers, a full disk while
training is one line, and a target whose cached multi-token forward fails is refused up front."""
from __future__ import annotations

import errno
import hashlib
import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith import checkpoint as ckpt_io
from draftsmith.cli import main as cli_main
from draftsmith.core.errors import UserError
from draftsmith.targets import load as target_mod
from draftsmith.testing import byte_tokenizer, tiny_target
from tests.export.conftest import make_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt-trust"), "eagle3", {"ttt_steps": 2, "draft_vocab_size": 100})


@pytest.fixture
def ckpt(pristine, tmp_path):
    """A private copy of the checkpoint dir (its target stays where config.yaml names it)."""
    copy = tmp_path / "final"
    shutil.copytree(pristine, copy)
    return copy


def _export_err(ckpt, tmp_path, capsys) -> str:
    """`draftsmith export` on a damaged checkpoint: exit 2 and the one line it printed."""
    capsys.readouterr()
    rc = cli_main(["export", str(ckpt), "--to", "vllm", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------- drafter.json


@pytest.mark.parametrize("content, needle", [
    ("[1, 2, 3]", "holds a JSON list"),
    ("{\"kind\": \"eagle3\", \"step\": 1", "not valid JSON"),
    ("\xff\xfe garbage", "not UTF-8"),
    ("{\"kind\": \"eagle3\"}", "no target fingerprint"),
    ("{\"kind\": \"martian\", \"target\": {\"fingerprint\": \"x\"}}", "'martian' is not a drafter kind"),
])
def test_damaged_drafter_json_is_one_line_naming_it(ckpt, tmp_path, capsys, content, needle):
    (ckpt / "drafter.json").write_bytes(content.encode("latin-1"))
    line = _export_err(ckpt, tmp_path, capsys)
    assert str(ckpt / "drafter.json") in line and needle in line


def test_drafter_json_naming_another_kind_than_config_yaml_is_refused(ckpt, tmp_path, capsys):
    meta = json.loads((ckpt / "drafter.json").read_text())
    (ckpt / "drafter.json").write_text(json.dumps({**meta, "kind": "medusa"}))
    line = _export_err(ckpt, tmp_path, capsys)
    assert "names kind 'medusa'" in line and "drafter.kind 'eagle3'" in line


# ---------------------------------------------------------------- safetensors


def _header(path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def test_truncated_garbage_and_huge_shape_weights_are_one_line(ckpt, tmp_path, capsys):
    weights = ckpt / "drafter.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])  # truncated
    assert "drafter.safetensors" in _export_err(ckpt, tmp_path, capsys)
    weights.write_bytes(b"\x00garbage" * 100)
    assert "drafter.safetensors" in _export_err(ckpt, tmp_path, capsys)
    weights.write_bytes(good)
    header, data = _header(weights)
    header["fc.weight"]["shape"] = [10**6, 10**6, 10**3]  # 10^15 values claimed, a few KB present
    _write(weights, header, data)
    line = _export_err(ckpt, tmp_path, capsys)
    assert "drafter.safetensors" in line and "fc.weight" in line and "needs" in line


@pytest.mark.parametrize("name", ["fc.weight", "lm_head.weight"])
def test_shape_mismatch_in_fc_or_heads_is_one_line(ckpt, tmp_path, capsys, name):
    state = load_file(str(ckpt / "drafter.safetensors"))
    state[name] = torch.zeros(state[name].shape[0] + 3, state[name].shape[1])
    save_file(state, str(ckpt / "drafter.safetensors"))
    line = _export_err(ckpt, tmp_path, capsys)
    assert "shape mismatch in " + name in line and "drafter.safetensors" in line


# ---------------------------------------------------------------- d2t


@pytest.mark.parametrize("change, needle", [
    (lambda d2t: d2t.__setitem__(-1, 10**6), "maps past the target vocabulary"),
    (lambda d2t: d2t.__setitem__(5, -3), "is negative"),
])
def test_d2t_is_checked_at_load(ckpt, tmp_path, capsys, change, needle):
    state = load_file(str(ckpt / "drafter.safetensors"))
    change(state["d2t"])
    save_file(state, str(ckpt / "drafter.safetensors"))
    line = _export_err(ckpt, tmp_path, capsys)
    assert needle in line and "draft vocabulary map is invalid" in line


# ---------------------------------------------------------------- fingerprint


def test_fingerprint_covers_every_value():
    target = tiny_target(num_layers=2, hidden=32)
    before, old_form = target.fingerprint, target.legacy_fingerprints[0]
    copy = tiny_target(num_layers=2, hidden=32)
    with torch.no_grad():
        for p in copy.model.parameters():
            flat = p.view(-1)
            flat[4096:] = -flat[4096:]  # everything past the first 4,096 values of each tensor
    assert copy.legacy_fingerprints[0] == old_form  # what the old fingerprint could not see
    assert copy.fingerprint != before and not copy.matches(before)
    assert target.matches(old_form)  # a checkpoint written by an older draftsmith still loads
    h = hashlib.sha256()  # the formula of draftsmith before issue 22, verbatim
    config = target.config.to_dict()
    config.pop("_name_or_path", None)
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, p in target.model.state_dict().items():
        h.update(f"{name}:{tuple(p.shape)}".encode())
        h.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    assert h.hexdigest()[:16] == old_form


def test_sharded_load_fingerprint_equals_the_full_one(tmp_path):
    from draftsmith.train import sharded_load

    target = tiny_target(num_layers=2, hidden=32)
    target.model.save_pretrained(tmp_path)
    weights = sharded_load._Weights(sharded_load.weight_files(tmp_path))
    assert sharded_load.fingerprint(target.model, weights, target.config) == target.fingerprint


# ---------------------------------------------------------------- init_from on other aux layers


def test_init_from_an_export_trained_on_other_aux_layers_is_refused(tmp_path):
    from draftsmith import config as config_mod
    from draftsmith.export import export
    from draftsmith.heads import DRAFTERS
    from draftsmith.train import checkpoint

    ckpt = make_checkpoint(tmp_path / "src", "eagle3", {"ttt_steps": 2, "aux_layer_ids": [1, 2, 3]})
    loaded = ckpt_io.load_drafter(ckpt, device="cpu")
    out = export(None, "vllm", tmp_path / "v", loaded=loaded, validate=False).out_dir
    recipe = config_mod.from_dict({"target": {"path": loaded.config.target.path},
                                   "drafter": {"kind": "eagle3", "ttt_steps": 2, "aux_layer_ids": [0, 2, 3]}})
    other = DRAFTERS.get("eagle3").from_target(recipe.drafter.options, loaded.target, None)
    for source in (out, ckpt):  # an export, and a checkpoint
        with pytest.raises(ValueError, match=r"trained on target layers \[1, 2, 3\].*reads \[0, 2, 3\]"):
            checkpoint.load_init_weights(source, other, loaded.target)


# ---------------------------------------------------------------- full disk while training


def test_full_disk_while_writing_a_checkpoint_is_one_line_naming_it(tmp_path, monkeypatch):
    target = tiny_target(num_layers=2, hidden=32)
    from draftsmith import config as config_mod
    from draftsmith.heads import DRAFTERS

    recipe = config_mod.from_dict({"target": {"path": "builtin:pycode-tiny"}, "drafter": {"kind": "eagle3"}})
    drafter = DRAFTERS.get("eagle3").from_target(recipe.drafter.options, target, None)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_io, "save_file", full)
    with pytest.raises(UserError, match="no space left on the device") as info:
        ckpt_io.save(tmp_path / "run" / "final", drafter, target, recipe, step=3)
    assert str(tmp_path / "run" / "final") in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "run" / "final").exists() and list((tmp_path / "run").iterdir()) == []


# ---------------------------------------------------------------- cached multi-token forward


def _deepseek_few_kv_heads():
    from draftsmith.targets.archs import TINY

    config = TINY["deepseek-v3"][1]()
    config.num_key_value_heads = 2  # fewer KV heads than attention heads: transformers' cached path breaks
    return config


def test_train_refuses_a_target_whose_cached_forward_fails():
    from transformers import AutoModelForCausalLM

    from draftsmith.heads import check_for_training

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_deepseek_few_kv_heads(), dtype=torch.float32)
    bad = target_mod.Target(model, byte_tokenizer(), name="deepseek-few-kv")
    with pytest.raises(ValueError, match=r"cannot train .*cached one-token forward fails in transformers"):
        check_for_training(bad, "eagle3")
    check_for_training(tiny_target(num_layers=2, hidden=32), "eagle3")  # a Llama passes


def test_inspect_reports_a_failing_cached_forward(tmp_path, capsys):
    _deepseek_few_kv_heads().save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    assert cli_main(["inspect", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "cached multi-token forward (the loop's verification): failed" in captured.out
    assert "unsupported:" in captured.err and "fails in transformers" in captured.err
    assert cli_main(["inspect", "builtin:pycode-tiny"]) == 0
    assert "verification): ok" in capsys.readouterr().out


def test_a_cache_that_disagrees_is_refused(monkeypatch):
    """A cache that silently mishandles multi-token input (simulated: the block forward's logits are
    perturbed) is found by the comparison, not only by exceptions."""
    from draftsmith.targets import cache_check

    real = cache_check._logits

    def wrong(model, config, ids, one_at_a_time):
        out = real(model, config, ids, one_at_a_time)
        return out if one_at_a_time else out + 0.5 * out.abs().max()

    monkeypatch.setattr(cache_check, "_logits", wrong)
    status, reason = cache_check.check(tiny_target(num_layers=2, hidden=32).config)
    assert status == "failed" and "disagrees with 3 one-token forwards" in reason


SAVE_SMALL = """
import sys
from pathlib import Path
from draftsmith import checkpoint, config
from draftsmith.heads import DRAFTERS
from draftsmith.testing import tiny_target
target = tiny_target(num_layers=2, hidden=32)
recipe = config.from_dict({"target": {"path": "builtin:pycode-tiny"}, "drafter": {"kind": "eagle3"}})
drafter = DRAFTERS.get("eagle3").from_target(recipe.drafter.options, target, None)
try:
    checkpoint.save(Path(sys.argv[1]), drafter, target, recipe, step=3)
except ValueError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def test_a_checkpoint_write_that_runs_out_of_room_is_one_line(tmp_path):
    """A real failing write while training saves a checkpoint (the file size limit, EFBIG)."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    final = tmp_path / "run" / "final"
    repo = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", SAVE_SMALL, str(final)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": repo, "PYTHONDONTWRITEBYTECODE": "1"}, preexec_fn=limit)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and str(final) in lines[0] and "no space left" in lines[0]
    assert not final.exists() and list((tmp_path / "run").iterdir()) == []


def test_the_cache_check_leaves_the_global_rng_alone():
    """train seeds, then checks the target: the check must not move the drafter's initialisation."""
    from draftsmith.targets import cache_check

    config = tiny_target(num_layers=2, hidden=32).config  # tiny_target seeds itself: build it first
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    assert cache_check.check(config)[0] == "ok"
    assert torch.equal(torch.rand(4), expected)
