"""Block drafters (DFlash, DSpark) where the engines' own loaders serve them (issue 19, "Engine features the
exports leave unused"):

- vLLM DSpark: the serve command turns on enable_adaptive_verification (vLLM >= 0.28, what makes the trained
  confidence head set the verify length) unless --no-adaptive-verification; dspark_draft_topk when asked; the gate
  refuses a config or tensor names that make vLLM's qwen3_dspark.py drop the confidence head silently.
- SGLang 0.5.23: DFlashDraftModel / Qwen3DSparkModel layouts (z-lab's fields, target_layer_ids = id - 1,
  non-causal full_attention layers, no lm_head / embed_tokens: the target's are borrowed), round trip, serve
  command; refused for a reduced vocabulary or a trained lm_head.
- TensorRT-LLM: DFlash / DSpark refused in one line (pre-releases only).
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.export import export
from draftsmith.export.layout import EXPORTERS, ExportOptions, ExportValidationError
from draftsmith.export.validate import validate_export

CASES = {
    "dflash_full": ("dflash", {"block_size": 4, "num_layers": 2}),
    "dspark_full": ("dspark", {"block_size": 3, "num_layers": 1, "markov_rank": 8}),
    "dspark_dv": ("dspark", {"block_size": 3, "num_layers": 1, "markov_rank": 8, "draft_vocab_size": 100}),
    "dflash_own_head": ("dflash", {"block_size": 3, "num_layers": 1, "train_lm_head": True}),
}


CHECKPOINTS = CASES


def speculative_config(command: str) -> dict:
    return json.loads(command.rsplit("--speculative-config ", 1)[1].strip().strip("'"))


# --------------------------------------------------------------------------- vLLM DSpark adaptive verification


def test_vllm_dspark_serves_with_adaptive_verification(ckpts, tmp_path):
    path, loaded = ckpts["dspark_dv"]
    result = export(path, "vllm", tmp_path / "on", loaded=loaded)
    spec = speculative_config(result.serve_command)
    assert spec["method"] == "dspark" and spec["enable_adaptive_verification"] is True
    assert "dspark_draft_topk" not in spec  # the full Markov projection, as trained
    assert result.serve_command.startswith("# vLLM >= 0.28.0")
    side = json.loads((result.out_dir / "draftsmith.json").read_text())
    assert side["vllm_dspark_serving"] == {"enable_adaptive_verification": True, "needs_vllm": ">= 0.28.0"}
    config = json.loads((result.out_dir / "config.json").read_text())
    assert config["enable_confidence_head"] is True and config["confidence_head_with_markov"] is True
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    assert torch.equal(tensors["confidence_head.proj.weight"], loaded.drafter.confidence_head.proj.weight)

    off = export(path, "vllm", tmp_path / "off", ExportOptions(flags={"no_adaptive_verification": True}), loaded=loaded)
    assert "enable_adaptive_verification" not in speculative_config(off.serve_command)
    assert not off.serve_command.startswith("#")  # a fixed-K command that every vLLM with DSpark takes

    topk = export(path, "vllm", tmp_path / "topk", ExportOptions(flags={"dspark_draft_topk": 16}), loaded=loaded)
    assert speculative_config(topk.serve_command)["dspark_draft_topk"] == 16


def test_vllm_0_27_dspark_gets_the_fixed_k_command(ckpts, tmp_path):
    """vLLM 0.27's SpeculativeConfig forbids unknown keys: the adaptive-verification fields (>= 0.28) would make
    the printed command fail there, so --engine-version 0.27 prints the fixed-K one and refuses a draft top-k."""
    path, loaded = ckpts["dspark_dv"]
    old = export(path, "vllm", tmp_path / "old", ExportOptions(engine_version="0.27"), loaded=loaded)
    spec = speculative_config(old.serve_command)
    assert spec["method"] == "dspark" and "enable_adaptive_verification" not in spec
    assert not old.serve_command.startswith("#")
    with pytest.raises(ValueError, match="--dspark-draft-topk: vLLM 0.27.0"):
        export(path, "vllm", tmp_path / "topk", ExportOptions(engine_version="0.27", flags={"dspark_draft_topk": 4}), loaded=loaded)
    assert not (tmp_path / "topk").exists()


@pytest.mark.parametrize("k", [0, 101])
def test_vllm_dspark_draft_topk_outside_the_draft_vocabulary_is_refused(ckpts, tmp_path, k):
    path, loaded = ckpts["dspark_dv"]
    with pytest.raises(ValueError, match=rf"--dspark-draft-topk {k}: .*1 <= k <= the draft vocabulary \(100\)"):
        export(path, "vllm", tmp_path / "x", ExportOptions(flags={"dspark_draft_topk": k}), loaded=loaded)
    assert not (tmp_path / "x").exists()


def test_dspark_options_are_refused_for_other_exports(ckpts, tmp_path):
    path, loaded = ckpts["dflash_full"]
    with pytest.raises(ValueError, match="--dspark-draft-topk applies to --to vllm exports of dspark drafters"):
        export(path, "vllm", tmp_path / "a", ExportOptions(flags={"dspark_draft_topk": 4}), loaded=loaded)
    path, loaded = ckpts["dspark_full"]
    with pytest.raises(ValueError, match="--no-adaptive-verification applies to --to vllm exports of dspark.*sglang"):
        export(path, "sglang", tmp_path / "b", ExportOptions(flags={"no_adaptive_verification": True}), loaded=loaded)


def _tampered(result, tmp_path, config_edit=None, rename=None):
    """A copy of an export with config.json edited / one tensor renamed."""
    out = tmp_path / "tampered"
    shutil.copytree(result.out_dir, out)
    if config_edit:
        config = json.loads((out / "config.json").read_text())
        config.update(config_edit)
        (out / "config.json").write_text(json.dumps(config))
    if rename:
        tensors = load_file(str(out / "model.safetensors"))
        tensors[rename[1]] = tensors.pop(rename[0])
        save_file(tensors, str(out / "model.safetensors"))
    return out


def test_vllm_dspark_gate_refuses_what_drops_the_confidence_head(ckpts, tmp_path):
    """qwen3_dspark.py builds the head only with enable_confidence_head and skips it silently when no tensor is
    named confidence_head.*: both would leave adaptive verification without the trained head."""
    path, loaded = ckpts["dspark_dv"]
    result = export(path, "vllm", tmp_path / "ok", loaded=loaded)
    exporter, opts = EXPORTERS.get("vllm")(), ExportOptions()
    out = _tampered(result, tmp_path / "c", config_edit={"enable_confidence_head": False})
    with pytest.raises(ExportValidationError, match="enable_confidence_head is False, must be True"):
        validate_export(out, exporter, loaded, opts, 3)
    out = _tampered(result, tmp_path / "n", rename=("confidence_head.proj.weight", "confidence_head.weight"))
    with pytest.raises(ExportValidationError, match=r"missing tensor\(s\) \['confidence_head.proj.weight'\]"):
        validate_export(out, exporter, loaded, opts, 3)


# --------------------------------------------------------------------------- SGLang DFlash / DSpark


def test_sglang_dflash_layout(ckpts, tmp_path):
    path, loaded = ckpts["dflash_full"]
    d = loaded.drafter
    result = export(path, "sglang", tmp_path / "s", loaded=loaded)
    config = json.loads((result.out_dir / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["block_size"] == 4 and config["num_target_layers"] == 4 and config["num_hidden_layers"] == 2
    # SGLang captures [i + 1 for i in target_layer_ids]: the export writes draftsmith id - 1
    assert config["dflash_config"] == {"mask_token_id": d.mask_token_id, "target_layer_ids": [i - 1 for i in d.aux_layer_ids]}
    assert config["layer_types"] == ["full_attention"] * 2 and "is_causal" not in config  # non-causal in SGLang
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    assert {n for n in tensors if not n.startswith("layers.")} == {"fc.weight", "hidden_norm.weight", "norm.weight"}
    assert "3 contexts x 3 tokens identical" in result.report["round_trip"]
    assert result.serve_command.endswith(f"--speculative-algorithm DFLASH --speculative-draft-model-path "
                                         f"{result.out_dir} --speculative-num-draft-tokens 4")


def test_sglang_dspark_layout(ckpts, tmp_path):
    path, loaded = ckpts["dspark_full"]
    result = export(path, "sglang", tmp_path / "s", loaded=loaded)
    config = json.loads((result.out_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["sample_from_anchor"] is True
    assert config["markov_rank"] == 8 and config["markov_head_type"] == "vanilla"
    assert config["enable_confidence_head"] is True and config["confidence_head_with_markov"] is True
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    assert tensors["markov_head.markov_w2.weight"].shape == (259, 8)  # SGLang builds [vocab_size, r]
    assert tensors["confidence_head.proj.weight"].shape == (1, 32 + 8)
    assert "lm_head.weight" not in tensors and "embed_tokens.weight" not in tensors
    assert "identical" in result.report["round_trip"]
    assert "--speculative-algorithm DSPARK" in result.serve_command
    assert result.serve_command.endswith("--speculative-num-draft-tokens 4")  # gamma + 1, gamma = block_size 3
    with pytest.raises(ValueError, match="--num-speculative-tokens 2: SGLang's DSPARK drafts one whole block"):
        export(path, "sglang", tmp_path / "k", ExportOptions(num_speculative_tokens=2), loaded=loaded)


def test_sglang_gate_refuses_a_causal_block(ckpts, tmp_path):
    path, loaded = ckpts["dflash_full"]
    result = export(path, "sglang", tmp_path / "ok", loaded=loaded)
    out = _tampered(result, tmp_path / "c", config_edit={"is_causal": True})
    with pytest.raises(ExportValidationError, match="runs? the block causally"):
        validate_export(out, EXPORTERS.get("sglang")(), loaded, ExportOptions(), 3)


def test_sglang_refuses_a_drafter_whose_head_it_would_replace(ckpts, tmp_path):
    path, loaded = ckpts["dflash_own_head"]
    with pytest.raises(ValueError, match=r"lm_head differs from the target's \(drafter.train_lm_head=true\)"):
        export(path, "sglang", tmp_path / "h", loaded=loaded)
    assert "identical" in export(path, "vllm", tmp_path / "v", loaded=loaded).report["round_trip"]  # vLLM keeps it


@pytest.mark.parametrize("name,label", [("dflash_full", "DFlash"), ("dspark_full", "DSpark")])
def test_trtllm_block_drafters_are_refused_in_one_line(ckpts, tmp_path, name, label):
    path, loaded = ckpts[name]
    with pytest.raises(ValueError) as err:
        export(path, "trtllm", tmp_path / "t", loaded=loaded)
    message = str(err.value)
    assert "\n" not in message and f"TensorRT-LLM's {label} drafter" in message
    assert "1.3.0rc / 1.4.0rc pre-releases" in message and "--to sglang or --to vllm" in message


def test_cli_flags_reach_the_dspark_serve_command(ckpts, tmp_path, capsys):
    from draftsmith.cli import main

    path = str(ckpts["dspark_dv"][0])
    assert main(["export", path, "--to", "vllm", "--out", str(tmp_path / "a"), "--no-adaptive-verification",
                 "--dspark-draft-topk", "8"]) == 0
    out = capsys.readouterr().out
    assert '"dspark_draft_topk": 8' in out and "enable_adaptive_verification" not in out
    assert main(["export", path, "--to", "vllm", "--out", str(tmp_path / "b"), "--dspark-draft-topk", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dspark-draft-topk 0" in err
    assert not (tmp_path / "b").exists()


def test_speculators_config_keeps_the_confidence_head(ckpts, tmp_path):
    """speculators 0.9.0's DSparkSpeculatorConfig (models/dspark/config.py), the config vLLM's speculators path
    follows, reads the export with its confidence head on and sized [h + r -> 1]."""
    from test_speculators_load import speculators

    spec = speculators()
    path, loaded = ckpts["dspark_dv"]
    out = export(path, "vllm", tmp_path / "s", loaded=loaded).out_dir
    config = spec.SpeculatorModelConfig.from_pretrained(str(out))
    assert type(config).__name__ == "DSparkSpeculatorConfig"
    assert config.enable_confidence_head is True and config.confidence_head_with_markov is True
    assert config.markov_rank == loaded.drafter.cfg.markov_rank
