"""Issue 43 items 2-4: vLLM's per-request hidden-states files as a feature source (features.source: vllm)
and as an output (`prepare --features --format vllm`). Training from a vLLM-format folder reaches the
losses of draftsmith's own cache built from the same rows; the files are read by vLLM's own loader and
speculators' reader; the key names are checked against vLLM's source; mismatched layers, hidden size,
target, truncated files and zstd bombs are each refused in one line."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draftsmith import config
from draftsmith.cli import main as cli_main
from draftsmith.core.errors import UserError
from draftsmith.data import dataset as ds
from draftsmith.data import vllm_hidden_states as vhs
from draftsmith.testing import tiny_target
from draftsmith.train.loop import train

VLLM_CODE = Path(os.environ.get("DRAFTSMITH_VLLM_CONFIG_CODE", Path.home() / ".cache/draftsmith/vllm-config-code"))
VLLM_VERSION = "0.33.0"
CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
STACKING = "vllm/v1/spec_decode/extract_hidden_states.py"


@pytest.fixture
def prepared(tiny_run, tmp_path):
    """A recipe, draftsmith's cache and a vLLM-format folder of the same rows (fp32)."""
    cfg = tiny_run("run", "features.mode=offline", f"features.cache_dir={tmp_path / 'cache'}", "features.dtype=float32",
                   f"features.dir={tmp_path / 'vllm'}", "train.max_steps=3")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(config.to_yaml(cfg))
    assert cli_main(["prepare", str(recipe), "--features"]) == 0
    assert cli_main(["prepare", str(recipe), "--features", "--format", "vllm"]) == 0
    return recipe, tmp_path / "vllm"


def _one_line(exc_info, *needles):
    text = str(exc_info.value)
    assert "\n" not in text and len(text) < 2000, text
    for needle in needles:
        assert needle in text, text


def test_training_from_vllm_files_matches_draftsmith_cache(prepared, tmp_path):
    recipe, folder = prepared
    files = sorted(p.name for p in folder.glob("hs_*.safetensors"))
    assert len(files) == 24 and (folder / vhs.SIDECAR).exists()
    own = train(config.load(recipe, [f"train.output_dir={tmp_path / 'own'}"])).losses
    from_vllm = train(config.load(recipe, ["features.source=vllm", f"train.output_dir={tmp_path / 'via-vllm'}"])).losses
    assert len(own) == len(from_vllm) == 3
    assert from_vllm == pytest.approx(own, rel=1e-4, abs=1e-5)


def test_zstd_files_read_as_the_plain_ones(prepared, tmp_path):
    zstandard = pytest.importorskip("zstandard")
    recipe, folder = prepared
    for path in folder.glob("hs_*.safetensors"):  # the OnlineHiddenStatesConnector's variant: one zstd frame
        path.with_name(path.name + ".zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(path.read_bytes()))
        path.unlink()
    losses = train(config.load(recipe, ["features.source=vllm", f"train.output_dir={tmp_path / 'zst'}"])).losses
    own = train(config.load(recipe, [f"train.output_dir={tmp_path / 'own'}"])).losses
    assert losses == pytest.approx(own, rel=1e-4, abs=1e-5)


def _open(recipe, folder):
    from draftsmith.heads import DRAFTERS
    from draftsmith.targets import load as target_mod

    cfg = config.load(recipe)
    target = target_mod.from_config(cfg.target)
    train_rows, heldout, _ = ds.build_dataset(ds.training_data_config(cfg), target.tokenizer)
    cls = DRAFTERS.get(cfg.drafter.kind)
    layers = cls.feature_layers_for(cfg.drafter.options, target)
    return lambda: vhs.open_rows(str(folder), target, layers, cls.required_features, [train_rows, heldout],
                                 log=lambda *_: None)


def _rewrite(path: Path, change):
    data = vhs.read_file(path)
    save_file({k: v.contiguous() for k, v in change({k: v.clone() for k, v in data.items()}).items()}, str(path))


def test_received_vllm_files_are_refused_in_one_line(prepared):
    recipe, folder = prepared
    open_rows = _open(recipe, folder)
    assert [len(r) for r in open_rows()] == [20, 4]
    first = folder / "hs_0.safetensors"
    good = first.read_bytes()
    cases = [
        (lambda: _rewrite(first, lambda d: {**d, "hidden_states": d["hidden_states"][:, :2]}), "holds 2 layers"),
        (lambda: _rewrite(first, lambda d: {**d, "hidden_states": d["hidden_states"][:, :, :16]}),
         "of hidden size 16"),
        (lambda: _rewrite(first, lambda d: {"tokens": d["token_ids"], "hidden_states": d["hidden_states"]}),
         "not 'hidden_states' and 'token_ids'"),
        (lambda: first.write_bytes(good[:len(good) // 2]), "truncated"),
        (lambda: first.write_bytes(b""), "only 0 bytes"),
        (lambda: (first.unlink(), os.mkfifo(first)), "FIFO"),
        # the layers in another order: the spot check against the target sees it
        (lambda: _rewrite(first, lambda d: {**d, "hidden_states": d["hidden_states"].flip(1).contiguous()}),
         "differ from target"),
    ]
    for damage, needle in cases:
        damage()
        with pytest.raises(UserError) as exc:
            open_rows()
        _one_line(exc, "hs_0.safetensors", needle)
        first.unlink()
        first.write_bytes(good)
    assert [len(r) for r in open_rows()] == [20, 4]


def test_another_target_is_refused_by_fingerprint_and_by_content(prepared, tmp_path):
    recipe, folder = prepared
    other = tiny_target(num_layers=4, hidden=32, seed=7)
    other_dir = tmp_path / "other"
    other.model.save_pretrained(other_dir)
    other.tokenizer.save_pretrained(other_dir)
    open_rows = _open(_recipe_for(recipe, other_dir), folder)
    with pytest.raises(UserError) as exc:
        open_rows()
    _one_line(exc, vhs.SIDECAR, "captured from target", "fingerprint")
    (folder / vhs.SIDECAR).unlink()  # vLLM writes no sidecar: the spot check compares the states themselves
    with pytest.raises(UserError) as exc:
        open_rows()
    _one_line(exc, "differ from target", "eagle_aux_hidden_state_layer_ids")


def _recipe_for(recipe: Path, target_dir: Path) -> Path:
    out = recipe.with_name("other.yaml")
    out.write_text(config.to_yaml(config.load(recipe, [f"target.path={target_dir}"])))
    return out


def test_zstd_bombs_and_bad_frames_are_refused(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    bomb = tmp_path / "hs_0.safetensors.zst"
    bomb.write_bytes(zstandard.ZstdCompressor().compress(b"\0" * (8 << 20)))  # 8 MiB of zeros in a few hundred bytes
    with pytest.raises(UserError) as exc:
        vhs.read_file(bomb)
    _one_line(exc, "hs_0.safetensors.zst", "zstd bomb")
    unsized = tmp_path / "hs_1.safetensors.zst"
    unsized.write_bytes(zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100))
    with pytest.raises(UserError) as exc:
        vhs.read_file(unsized)
    _one_line(exc, "hs_1.safetensors.zst", "no decompressed size")
    garbage = tmp_path / "hs_2.safetensors.zst"
    garbage.write_bytes(b"not zstd at all")
    with pytest.raises(UserError) as exc:
        vhs.read_file(garbage)
    _one_line(exc, "hs_2.safetensors.zst")


def test_refusals_reach_the_command_line_in_one_line(prepared, capsys):
    from tests.conftest import refused_in_one_line

    recipe, folder = prepared
    (folder / "hs_3.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"{}")
    refused_in_one_line(capsys, ["train", str(recipe), "features.source=vllm", "train.output_dir=" + str(folder.parent / "x")],
                        "hs_3.safetensors")
    assert cli_main(["train", str(recipe), "features.source=vllm", "features.dir=null"]) == 2  # a recipe problem
    assert "features.source: vllm" in capsys.readouterr().err  # (the recipe's problem block, one line per problem)


# --------------------------------------------------------------------------- vLLM's and speculators' own code


def _vllm_source(relpath: str) -> str:
    path = VLLM_CODE / VLLM_VERSION / relpath
    if not path.exists():
        pytest.skip(f"vLLM {VLLM_VERSION} source not fetched (bash scripts/fetch_vllm_config_code.sh {VLLM_VERSION})")
    return path.read_text()


def test_key_names_and_layer_order_match_vllms_source():
    connector = ast.parse(_vllm_source(CONNECTOR))
    keys = {k.value for node in ast.walk(connector) if isinstance(node, ast.Dict) for k in node.keys
            if isinstance(k, ast.Constant) and k.value in (vhs.HIDDEN, vhs.TOKENS)}
    assert keys == {vhs.HIDDEN, vhs.TOKENS}  # the dict handed to save_file in _submit_async_write
    assert "f\"{new_req.req_id}.safetensors\"" in _vllm_source(CONNECTOR)  # one file per request
    stacking = _vllm_source(STACKING)
    assert "torch.stack(target_hidden_states, dim=1)" in stacking  # [tokens, layers, hidden], in layer-id order
    assert "eagle_aux_hidden_state_layer_ids" in stacking


def test_vllms_own_loader_reads_draftsmiths_files(prepared):
    """vLLM's load_hidden_states (the function its connector documents for clients), taken from its source."""
    from safetensors.torch import load_file

    recipe, folder = prepared
    tree = ast.parse(_vllm_source(CONNECTOR))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "load_hidden_states")
    scope = {"fcntl": __import__("fcntl"), "load_file": load_file, "torch": torch}
    exec(compile(ast.Module(body=[func], type_ignores=[]), CONNECTOR, "exec"), scope)  # noqa: S102 (vLLM's own code)
    path = folder / "hs_5.safetensors"
    Path(str(path) + ".lock").write_text("")  # the connector's companion lock file (the reader waits on it)
    data = scope["load_hidden_states"](str(path))
    assert data["hidden_states"].shape[1:] == (4, 32) and data["token_ids"].dtype == torch.int64
    assert data["hidden_states"].shape[0] == data["token_ids"].shape[0]


def test_speculators_reads_draftsmiths_files(prepared):
    transfer = pytest.importorskip("hs_connectors.transfer")
    offline = pytest.importorskip("speculators.data_generation.offline")
    recipe, folder = prepared
    data = transfer.FileTransfer(folder).get_cached(5)
    assert data is not None
    offline.check_hidden_states(data, data["token_ids"].tolist())  # speculators' own validation
    ours = vhs.read_file(folder / "hs_5.safetensors")
    assert torch.equal(data["hidden_states"], ours["hidden_states"])
