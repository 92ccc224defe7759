"""A draft LM of a hybrid target exports to `--to hf` (issue 42): config.json is what transformers 5 writes, plus
the engine-read keys it keeps only as derived attributes (Nemotron-H's num_hidden_layers, Kimi-Linear's
max_position_embeddings); Falcon-H1's and Granite-4's time_step_limit [0, inf] stays transformers' own
{"__float__": "Infinity"}. transformers reads the file back to the trained draft's config and builds the same model;
the gate refuses a config.json that reads back differently."""
from __future__ import annotations

import json
import math

import pytest
import torch

from draftsmith import config as config_mod
from draftsmith.checkpoint import LoadedDrafter
from draftsmith.export import EXPORTERS, can_export, export
from draftsmith.export.hf import decode_tagged_floats, spell_out_derived_keys
from draftsmith.export.layout import ExportOptions, ExportValidationError
from draftsmith.export.validate import validate_export
from draftsmith.heads import DRAFTERS
from draftsmith.testing import arch_target, matrix
from tests.export.tamper import tampered_copy

# tiny arch -> (key transformers 5 leaves out of config.json that the hf export spells out, or None;
#               whether the config carries time_step_limit [0, inf])
HYBRIDS = {"nemotron-h": ("num_hidden_layers", True), "kimi-linear": ("max_position_embeddings", False),
           "falcon-h1": (None, True), "granite-4-hybrid": (None, True)}


def _loaded(arch: str) -> LoadedDrafter:
    target = arch_target(arch)
    options = matrix.tiny_options("draft_lm", target.config)
    recipe = config_mod.from_dict({"target": {"path": f"{arch} (built in code)"},
                                   "drafter": {"kind": "draft_lm", **options}})
    torch.manual_seed(0)
    drafter = DRAFTERS.get("draft_lm").from_target(recipe.drafter.options, target).eval()
    return LoadedDrafter(drafter=drafter, target=target, config=recipe,
                         meta={"kind": "draft_lm", "step": 1, "target": target.identity()})


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid-draft-lm")
    out = {}
    for arch in HYBRIDS:
        loaded = _loaded(arch)
        out[arch] = (loaded, export(None, "hf", root / arch, loaded=loaded).out_dir)  # the validation gate runs
    return out


@pytest.mark.parametrize("arch", list(HYBRIDS))
def test_hybrid_draft_lm_is_exportable(arch):
    loaded = _loaded(arch)
    assert can_export("draft_lm", "hf", None, loaded.target.config) == []


@pytest.mark.parametrize("arch", list(HYBRIDS))
def test_config_reads_back_as_the_trained_model(exports, arch):
    from transformers import AutoConfig, AutoModelForCausalLM

    loaded, out = exports[arch]
    spelled, infinite = HYBRIDS[arch]
    raw = json.loads((out / "config.json").read_text())  # strict JSON: no bare Infinity constant
    trained = loaded.drafter.merged_model()
    if spelled:
        assert raw[spelled] == getattr(trained.config, spelled)
    if infinite:
        assert raw["time_step_limit"][1] == {"__float__": "Infinity"}  # as transformers' save_pretrained writes it
    read = AutoConfig.from_pretrained(str(out))
    if infinite:
        assert list(read.time_step_limit) == [0.0, math.inf]
    assert read.num_hidden_layers == trained.config.num_hidden_layers
    assert read.max_position_embeddings == loaded.target.config.max_position_embeddings
    model = AutoModelForCausalLM.from_pretrained(str(out))
    want = trained.state_dict()
    got = model.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in want)


def test_gate_refuses_a_config_that_reads_back_another_model(exports, tmp_path):
    loaded, out = exports["falcon-h1"]

    def finite_limit(config):  # a writer that turned inf into a large number: another dt clamp in the engine
        config["time_step_limit"] = [0.0, 1e9]

    damaged = tampered_copy(out, tmp_path / "t", edit_config=finite_limit)
    with pytest.raises(ExportValidationError) as err:
        validate_export(damaged, EXPORTERS.get("hf")(), loaded, ExportOptions(), 2)
    assert "transformers reads back time_step_limit=[0.0, 1000000000.0], the trained draft has [0.0, inf]" in str(
        err.value)


def test_derived_keys_are_written_only_when_missing(exports, tmp_path):
    loaded, out = exports["nemotron-h"]
    path = out / "config.json"
    before = path.read_bytes()
    assert spell_out_derived_keys(path, ["num_hidden_layers", "max_position_embeddings"]) == []
    assert path.read_bytes() == before  # a file with every key is left byte for byte (attention-only targets)
    raw = json.loads(before)
    del raw["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert spell_out_derived_keys(tmp_path / "config.json", ["num_hidden_layers"]) == ["num_hidden_layers"]
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 2


def test_tagged_floats_decode_like_transformers():
    from transformers import PretrainedConfig

    value = {"a": [0.0, {"__float__": "Infinity"}], "b": {"__float__": "-Infinity"}, "c": {"__float__": "x"}}
    ours = decode_tagged_floats(value)
    assert ours == PretrainedConfig._decode_special_floats(value)
    assert ours["a"][1] == math.inf and ours["b"] == -math.inf and ours["c"] == {"__float__": "x"}
