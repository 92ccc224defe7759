"""DFlash / DSpark for llama.cpp without llama.cpp: the directory its converter reads (config fields,
aux-id convention, tensors), the configurations refused in one line, k = one whole block, and the rule
`eval --engine` applies to DSpark's confidence cut."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from draftsmith.commands.eval_engine import apply_engine_rules
from draftsmith.core.errors import UserError
from draftsmith.export.llamacpp import block as llamacpp_block
from draftsmith.export.llamacpp import layouts as llamacpp
from draftsmith.heads import DRAFTERS
from draftsmith.testing import arch_target, tiny_target

TINY = {"dflash": {"block_size": 4, "num_layers": 2, "num_anchors": 4},
        "dspark": {"block_size": 3, "num_layers": 1, "num_anchors": 4, "markov_rank": 8},
        "dflash2": {"block_size": 4, "num_layers": 2, "num_anchors": 4, "conv_group_size": 8, "selector_rank": 8,
                    "selector_top_k": 4}}


def block_loaded(kind, target=None, **options):
    target = target or tiny_target()
    cls = DRAFTERS.get(kind)
    counts = torch.arange(target.vocab_size).flip(0)
    drafter = cls.from_target(cls.Config(**{**TINY[kind], **options}), target, counts)
    return SimpleNamespace(drafter=drafter, target=target)


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dflash2"])
def test_block_drafters_on_a_llama_target_are_served(kind):
    loaded = block_loaded(kind)
    assert llamacpp.refusal(loaded) is None
    # DFlash 2 is llama.cpp's draft-dflash: speculative.cpp walks the selector when the GGUF has selector_top_k
    assert llamacpp.layout_of(kind).spec_type == ("draft-dflash" if kind == "dflash2" else f"draft-{kind}")
    assert llamacpp.layout_of(kind).draft_file == f"draft-{kind}.gguf"


def test_dflash2_directory_is_zlab_dflash2_layout_with_conv_and_selector(tmp_path):
    loaded = block_loaded("dflash2", aux_layer_ids=[0, 1, 3])
    cfg = llamacpp_block.block_config(loaded)
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": 0, "block_size": 4, "target_layer_ids": [-1, 0, 2],
                                    "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8,
                                    "selector_top_k": 4}
    tensors = llamacpp_block.block_tensors(loaded)
    # the names gguf-py's tensor_mapping.py maps (with the converter's "model." prefix) to blk.{i}.attn_conv_* etc.
    assert {"layers.1.attention_conv.base_kernel", "layers.1.attention_conv.kernel_projection.weight",
            "layers.0.mlp_conv.base_kernel", "layers.0.mlp_conv.kernel_projection.weight",
            "candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
            "candidate_selector.hidden_projection.weight"} <= set(tensors)
    assert tensors["layers.0.attention_conv.base_kernel"].shape == (2, 2, 32)  # [in/out, K, h] = ggml {h, K, 2}
    assert tensors["layers.0.mlp_conv.kernel_projection.weight"].shape == (2 * 2 * 4, 32)  # [2 K G, h]
    assert "embed_tokens.weight" not in tensors and "d2t" not in tensors


def test_dflash_directory_is_zlab_layout_with_output_of_layer_ids(tmp_path):
    loaded = block_loaded("dflash", aux_layer_ids=[0, 1, 3])
    cfg = llamacpp_block.block_config(loaded)
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    # z-lab counts layer outputs: llama.cpp writes target_layers = id + 1, the input of layer id + 1
    assert cfg["dflash_config"]["target_layer_ids"] == [-1, 0, 2]
    assert cfg["dflash_config"]["mask_token_id"] == loaded.drafter.mask_token_id == 0
    assert cfg["dflash_config"]["block_size"] == cfg["block_size"] == 4
    assert cfg["num_hidden_layers"] == 2 and cfg["tie_word_embeddings"] is False
    assert cfg["rope_theta"] == loaded.target.config.rope_parameters["rope_theta"]
    tensors = llamacpp_block.block_tensors(loaded)
    assert "embed_tokens.weight" not in tensors and "d2t" not in tensors and "t2d" not in tensors
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight",
            "layers.1.self_attn.q_norm.weight"} <= set(tensors)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert torch.equal(tensors["fc.weight"], loaded.drafter.fc.weight.detach())


def test_dspark_directory_is_speculators_layout_with_input_of_layer_ids(tmp_path):
    loaded = block_loaded("dspark", aux_layer_ids=[1, 2, 3], draft_vocab_size=100)
    cfg = llamacpp_block.block_config(loaded)
    assert cfg["architectures"] == ["DSparkSpeculator"] and cfg["sample_from_anchor"] is True
    assert cfg["aux_hidden_state_layer_ids"] == [1, 2, 3]  # the converter subtracts 1, then adds it back
    assert cfg["draft_vocab_size"] == 100 and cfg["markov_rank"] == 8
    assert cfg["transformer_layer_config"]["model_type"] == "qwen3"
    assert "architectures" not in cfg["transformer_layer_config"]  # merged into the top level by the converter
    tensors = llamacpp_block.block_tensors(loaded)
    assert tensors["d2t"].dtype == torch.long and tensors["d2t"].shape == (100,)
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "confidence_head.proj.bias"} <= set(tensors)
    out = llamacpp_block.write_block_dir(loaded, tmp_path / "hf")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("kind, options, needle", [
    ("dflash", {"draft_vocab_size": 100}, "has no d2t"),
    ("dspark", {"train_lm_head": True}, "drops a full-vocabulary lm_head"),
    ("dflash2", {"draft_vocab_size": 100}, "selector_successor [rank, n_vocab]"),
    ("dflash2", {"selector_top_k": 6}, "selector_top_k 6 needs a hidden size >= top_k * (top_k + 1) = 42"),
])
def test_block_configurations_llamacpp_reads_differently_are_refused(kind, options, needle):
    why = llamacpp.refusal(block_loaded(kind, **options))
    assert why is not None and needle in why and "\n" not in why


def test_dspark_with_a_reduced_vocabulary_and_a_trained_head_is_served():
    assert llamacpp.refusal(block_loaded("dspark", train_lm_head=True, draft_vocab_size=100)) is None


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_block_drafters_on_targets_llamacpp_cannot_feed_are_refused(kind):
    why = llamacpp.refusal(block_loaded(kind, target=arch_target("gemma3-text")))
    assert f"no {llamacpp.layout_of(kind).title} feature capture" in why
    why = llamacpp.refusal(block_loaded(kind, target=arch_target("llama3")))
    assert "rope_type 'llama3'" in why and "\n" not in why


@pytest.mark.parametrize("kind, whole", [("dflash", 3), ("dspark", 3), ("dflash2", 3)])
def test_k_must_be_one_whole_block(kind, whole):
    drafter = block_loaded(kind).drafter
    assert llamacpp.default_k(drafter) == whole
    llamacpp.check_k(drafter, whole)
    for k in (whole - 1, whole + 1):
        with pytest.raises(UserError, match=f"pass {whole}"):
            llamacpp.check_k(drafter, k)


def test_dspark_serve_command_sends_the_whole_block():
    tools = SimpleNamespace(server="llama-server")
    assert "--spec-draft-p-min 0" in llamacpp.serve_command(tools, "t.gguf", "d.gguf", "draft-dspark", 5)
    assert "p-min" not in llamacpp.serve_command(tools, "t.gguf", "d.gguf", "draft-dflash", 5)


def test_engine_parity_runs_dspark_at_llamacpps_rule(capsys):
    dspark = block_loaded("dspark", confidence_threshold=0.3).drafter
    assert apply_engine_rules(dspark) == {"confidence_threshold": {"trained": 0.3, "compared": 0.0}}
    assert dspark.cfg.confidence_threshold == 0.0 and "confidence_threshold=0.0" in capsys.readouterr().out
    assert apply_engine_rules(block_loaded("dflash").drafter) == {}


def test_export_cli_refuses_a_partial_block_in_one_line_before_writing(tmp_path, capsys):
    from draftsmith.cli import main
    from tests.export.conftest import make_checkpoint

    ckpt = make_checkpoint(tmp_path, "dflash", {"block_size": 6, "num_layers": 1, "num_anchors": 4})
    capsys.readouterr()  # the tiny target's save_pretrained progress
    code = main(["export", str(ckpt), "--to", "llama.cpp", "--out", str(tmp_path / "gguf"),
                 "--num-speculative-tokens", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pass 5" in err[0] and "blocks of 6" in err[0], err
    assert not (tmp_path / "gguf").exists()
