"""vLLM export of a Medusa drafter over a draft vocabulary (drafter.draft_vocab_size): truncated_vocab_size and
token_map as vLLM's Medusa loader reads them (export/vllm/medusa_vocab.py names the lines of vllm 0.9.2 / 0.20.0 /
0.27.0), per-head heads for 0.9.2, one shared head (original_lm_head) for frozen projections, the refusal where
vLLM's loader would assert, one planted fault per gate check, and vLLM's token_map logits mapping written out by
hand on the exported tensors against draftsmith's own proposer."""
from __future__ import annotations

import json
import types

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.core.sampling import SamplingParams
from draftsmith.export import EXPORTERS, export
from draftsmith.export.layout import ExportOptions, ExportValidationError
from draftsmith.export.validate import validate_export
from tests.export.tamper import tampered_copy

H, V, DV = 32, 259, 40  # conftest.save_tiny_target: hidden 32, byte vocabulary 259
CASES = {  # name: (drafter options, vLLM release)
    "per_head": ({"num_heads": 3, "num_layers": 2, "draft_vocab_size": DV}, "0.9.2"),
    "shared": ({"num_heads": 3, "num_layers": 1, "draft_vocab_size": DV, "freeze_lm_head": True}, "0.27.0"),
}


CHECKPOINTS = {name: ("medusa", options) for name, (options, _) in CASES.items()}


@pytest.fixture(scope="module")
def exported(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {name: export(ckpts[name][0], "vllm", root / name, ExportOptions(engine_version=CASES[name][1]),
                         loaded=ckpts[name][1]) for name in CASES}


def files(directory):
    config = json.loads((directory / "config.json").read_text())
    return config, load_file(str(directory / "model.safetensors"))


def problems_of(directory, loaded) -> str:
    with pytest.raises(ExportValidationError) as err:
        validate_export(directory, EXPORTERS.get("vllm")(), loaded, ExportOptions(), 2)
    return str(err.value)


def tampered(result, tmp_path, **edits):
    return tampered_copy(result.out_dir, tmp_path / "t", **edits)


# --------------------------------------------------------------------------- what is written, and the gate passes


def test_per_head_export_for_vllm_0_9_2(exported, ckpts):
    result, drafter = exported["per_head"], ckpts["per_head"][1].drafter
    config, tensors = files(result.out_dir)
    assert (config["vocab_size"], config["truncated_vocab_size"], config["original_lm_head"]) == (V, DV, False)
    assert tensors["token_map"].dtype == torch.int64 and tensors["token_map"].shape == (DV,)
    assert torch.equal(tensors["token_map"], drafter.draft_ids())
    assert (tensors["token_map"].diff() > 0).all()  # ascending and unique
    for i in range(3):
        assert tensors[f"lm_heads.{i}.weight"].shape == (DV, H)
        assert torch.equal(tensors[f"lm_heads.{i}.weight"], drafter.lm_heads[i].weight)
    assert not torch.equal(tensors["lm_heads.0.weight"], tensors["lm_heads.1.weight"])  # trained apart
    assert "d2t" not in tensors  # vLLM reads token_map; a d2t would be an unknown name it skips
    assert result.report["round_trip"] == "3 contexts x 3 tokens identical"
    assert json.loads((result.out_dir / "draftsmith.json").read_text())["engine_version"] == "0.9.2"


def test_frozen_projections_export_one_shared_head_for_vllm_0_27(exported, ckpts):
    result, drafter = exported["shared"], ckpts["shared"][1].drafter
    config, tensors = files(result.out_dir)
    assert (config["truncated_vocab_size"], config["original_lm_head"]) == (DV, True)
    assert {k for k in tensors if k.startswith("lm_heads.")} == {"lm_heads.0.weight"}  # vLLM loads only this one
    assert torch.equal(tensors["lm_heads.0.weight"], drafter.lm_heads[2].weight)
    assert torch.equal(tensors["token_map"], drafter.draft_ids())
    assert result.report["round_trip"] == "3 contexts x 3 tokens identical"


def test_vllm_0_27_refuses_per_head_draft_vocabulary_heads(ckpts, tmp_path):
    """0.20 / 0.27 build each lm_heads.{i} over vocab_size and assert a loaded head has that many rows."""
    with pytest.raises(ValueError, match=r"vocab_parallel_embedding\.py:480.*--engine-version 0\.9\.2") as err:
        export(ckpts["per_head"][0], "vllm", tmp_path / "out", ExportOptions(engine_version="0.27"),
               loaded=ckpts["per_head"][1])
    assert "\n" not in str(err.value) and "freeze_lm_head" in str(err.value)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- planted faults


def _foreign_id(t):
    """Row 5 mapped onto a target id outside the draft vocabulary (still unique and in range)."""
    token_map = t["token_map"].clone()
    token_map[5] = min(set(range(V)) - set(token_map.tolist()))
    t["token_map"] = token_map


def _shrink(t):
    """A config and tensors consistent with each other for a draft vocabulary one row smaller."""
    for name in list(t):
        if name.startswith("lm_heads.") or name == "token_map":
            t[name] = t[name][:-1].contiguous()


FAULTS = {
    "missing": ({"edit_tensors": lambda t: t.pop("token_map")},
                "model.safetensors: missing tensor(s) ['token_map']"),
    "wrong_id": ({"edit_tensors": _foreign_id},
                 "model.safetensors: token_map is not the drafter's draft vocabulary (first difference at draft row 5)"),
    "repeated": ({"edit_tensors": lambda t: t.__setitem__("token_map", torch.cat([t["token_map"][:1], t["token_map"][:-1]]))},
                 "model.safetensors: token_map repeats a target id"),
    "out_of_range": ({"edit_tensors": lambda t: t["token_map"].__setitem__(-1, V)},
                     f"model.safetensors: token_map holds 1 id(s) outside 0..{V - 1}"),
    "int32": ({"edit_tensors": lambda t: t.__setitem__("token_map", t["token_map"].int())},
              "model.safetensors: token_map has dtype torch.int32, expected torch.int64"),
    "short": ({"edit_tensors": lambda t: t.__setitem__("token_map", t["token_map"][:-1])},
              f"model.safetensors: token_map has shape [{DV - 1}], config.json implies [{DV}]"),
    "truncated_shrunk": ({"edit_config": lambda c: c.__setitem__("truncated_vocab_size", DV - 1), "edit_tensors": _shrink},
                         f"config.json: truncated_vocab_size is {DV - 1}, expected {DV}"),
    "truncated_is_full": ({"edit_config": lambda c: c.__setitem__("truncated_vocab_size", V)},  # the tensor check
                          f"model.safetensors: lm_heads.0.weight has shape [{DV}, {H}], config.json implies [{V}, {H}]"),
    "per_head_for_0_27": ({"edit_sidecar": lambda s: s.__setitem__("engine_version", "0.27.0")},
                          "config.json: truncated_vocab_size 40 < vocab_size with per-head lm_heads"),
    "shared_head_claimed": ({"edit_config": lambda c: c.__setitem__("original_lm_head", True),
                             "edit_tensors": lambda t: [t.pop(f"lm_heads.{i}.weight") for i in (1, 2)]},
                            "config.json: original_lm_head must be false"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_planted_fault_fails_the_gate_naming_file_and_key(exported, ckpts, tmp_path, fault):
    edits, message = FAULTS[fault]
    directory = tampered(exported["per_head"], tmp_path, **edits)
    assert message in problems_of(directory, ckpts["per_head"][1])


def test_the_untampered_copy_passes(exported, ckpts, tmp_path):
    """The planted-fault tests start from a copy that passes: their failures come from the plant."""
    directory = tampered(exported["per_head"], tmp_path)
    report = validate_export(directory, EXPORTERS.get("vllm")(), ckpts["per_head"][1], ExportOptions(), 3)
    assert report["round_trip"] == "3 contexts x 3 tokens identical"


# --------------------------------------------------------------------------- vLLM's logits mapping by hand


def vllm_medusa_top1(config: dict, tensors: dict, hidden: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """vLLM's Medusa proposal as read in vllm 0.9.2 / 0.27.0 model_executor/models/medusa.py, on the exported
    tensors: each head's residual blocks x <- x + SiLU(W x + b); its lm_head (lm_heads.0 for every head with
    original_lm_head) gives truncated_vocab_size logits; compute_logits writes them at token_map into a
    [n, vocab_size] tensor of -inf; v1/spec_decode/medusa.py takes the argmax. -> ([n, heads] ids, logits)."""
    token_map = tensors["token_map"]
    out = []
    for i in range(config["num_heads"]):
        x = hidden
        for j in range(config["num_hidden_layers"]):
            w, b = tensors[f"blocks.{i}.layers.{j}.weight"], tensors[f"blocks.{i}.layers.{j}.bias"]
            x = x + torch.nn.functional.silu(x @ w.T + b)
        head = tensors["lm_heads.0.weight" if config["original_lm_head"] else f"lm_heads.{i}.weight"]
        truncated = x @ head.T  # [n, T]
        full = -torch.inf * torch.ones(hidden.shape[0], config["vocab_size"])
        full[..., token_map] = truncated
        out.append(full)
    return torch.stack([logits.argmax(-1) for logits in out], dim=1), out


@pytest.mark.parametrize("name", list(CASES))
def test_hand_written_vllm_mapping_matches_draftsmith_proposer(exported, ckpts, name):
    config, tensors = files(exported[name].out_dir)
    drafter = ckpts[name][1].drafter
    proposer = drafter.make_proposer(None)
    hidden = 3.0 * torch.randn(64, H, generator=torch.Generator().manual_seed(11))  # [n, h] random target states
    vllm_ids, vllm_logits = vllm_medusa_top1(config, tensors, hidden)
    off = torch.ones(V, dtype=torch.bool)
    off[drafter.draft_ids()] = False
    ours = []
    for n in range(hidden.shape[0]):
        proposer.commit(torch.tensor([1]), 1, types.SimpleNamespace(hidden_states=[hidden[n].view(1, 1, H)]))
        ours.append(proposer.propose(torch.tensor([1]), 3, SamplingParams(), None).tokens)
    ours = torch.stack(ours)  # [n, 3] draftsmith's greedy proposals in target ids
    assert torch.equal(vllm_ids, ours)
    assert len(set(ours[:, 0].tolist())) > 3  # the states reach several different top-1 tokens
    for i, logits in enumerate(vllm_logits):  # -inf off the draft vocabulary, as draftsmith's on_target_vocab
        assert torch.isneginf(logits[:, off]).all() and torch.isfinite(logits[:, ~off]).all()
        torch.testing.assert_close(logits, drafter.to_target_logits(drafter.head_logits(hidden)[i]))
    wrong = dict(tensors, token_map=tensors["token_map"].roll(1))  # the same mapping with a shifted token_map
    assert not torch.equal(vllm_medusa_top1(config, wrong, hidden)[0], ours)
