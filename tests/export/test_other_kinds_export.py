"""Medusa and MLP speculator (vLLM) and distilled draft LM (hf) exports: config keys and tensor names
as vLLM's own loaders read them (vllm/transformers_utils/configs/{medusa,mlp_speculator}.py,
vllm/model_executor/models/{medusa,mlp_speculator}.py), the validation gate's round trip, Medusa-2's
adapter, the draft LM's context limit, and one detected failure per kind."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import make_checkpoint
from safetensors.torch import load_file, save_file
from torch import nn

from draftsmith.export import EXPORTERS, export
from draftsmith.export.layout import ExportOptions, ExportValidationError
from draftsmith.export.validate import validate_export
from tests.export.tamper import tampered_copy

H, V = 32, 259  # conftest.save_tiny_target: hidden 32, byte vocabulary 259, 1024 positions

CASES = {
    "medusa": ("medusa", {"num_heads": 3, "num_layers": 2}),
    "medusa2": ("medusa", {"num_heads": 2, "num_layers": 1, "lora": True, "lora_r": 4}),
    "mlp": ("mlp_speculator", {"n_predict": 3, "inner_dim": 48}),
    "mlp_tied": ("mlp_speculator", {"n_predict": 3, "tie_weights": True, "scale_input": True}),
    "draft_lm": ("draft_lm", {"init": "shrink", "shrink_layers": 2}),
    "draft_lm_short": ("draft_lm", {"init": "config", "model_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256}}),
}
# The vLLM release each case is exported for (export/engine_versions.py): vLLM 0.33 serves neither Medusa nor
# the MLP speculator; 0.27 serves Medusa; only 0.9.2 (V0) still serves the MLP speculator.
VERSION = {"medusa": "0.27.0", "medusa2": "0.27.0", "mlp": "0.9.2", "mlp_tied": "0.9.2"}


def opts(case: str, **kwargs) -> ExportOptions:
    return ExportOptions(engine_version=VERSION.get(case), **kwargs)


CHECKPOINTS = CASES


@pytest.fixture(scope="module")
def exported(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    fmt = {"draft_lm": "hf"}
    return {name: export(ckpts[name][0], fmt.get(name, "vllm"), root / name, opts(name), loaded=ckpts[name][1])
            for name in ("medusa", "medusa2", "mlp", "mlp_tied", "draft_lm")}


def files(result):
    config = json.loads((result.out_dir / "config.json").read_text())
    side = json.loads((result.out_dir / "draftsmith.json").read_text())
    return config, side, load_file(str(result.out_dir / "model.safetensors"))


# --------------------------------------------------------------------------- Medusa


def test_medusa_config_tensors_and_round_trip(exported, ckpts):
    config, side, tensors = files(exported["medusa"])
    drafter = ckpts["medusa"][1].drafter
    assert config["architectures"] == ["MedusaModel"] and config["model_type"] == "medusa"
    assert (config["num_heads"], config["num_hidden_layers"], config["hidden_size"]) == (3, 2, H)
    assert config["vocab_size"] == V and config["truncated_vocab_size"] == V  # no token_map tensor exported
    assert config["medusa_fc_bias"] is True and config["original_lm_head"] is False
    assert "num_lookahead_tokens" not in config  # vLLM's MedusaConfig would map it onto num_heads
    want = {f"blocks.{i}.layers.{j}.{p}" for i in range(3) for j in range(2) for p in ("weight", "bias")}
    assert set(tensors) == want | {f"lm_heads.{i}.weight" for i in range(3)}
    assert tensors["blocks.1.layers.1.weight"].shape == (H, H) and tensors["lm_heads.2.weight"].shape == (V, H)
    for name, value in drafter.state_dict_for_export().items():
        assert torch.equal(tensors[name], value)
    assert tensors["blocks.0.layers.0.bias"].abs().sum() > 0  # the trained (perturbed) biases are carried
    assert exported["medusa"].report["round_trip"] == "3 contexts x 3 tokens identical"
    assert side["num_speculative_tokens"] == 3 and '"method": "medusa"' in exported["medusa"].serve_command


def test_medusa_next_token_head_is_refused(tmp_path):
    """vLLM's Medusa head i proposes the token i+2 after the sampled position's state; a drafter whose
    head 0 predicts the target's own next token (drafter.next_token_head) would be served shifted."""
    path = make_checkpoint(tmp_path, "medusa", {"num_heads": 3, "num_layers": 1, "next_token_head": True})
    with pytest.raises(ValueError, match="next_token_head"):
        export(path, "vllm", tmp_path / "out", opts("medusa"))
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_medusa2_exports_heads_and_peft_adapter(exported, ckpts):
    from peft import PeftModel

    from draftsmith.heads.medusa import shared_weight_copy

    result, loaded = exported["medusa2"], ckpts["medusa2"][1]
    config, side, tensors = files(result)
    assert set(tensors) == {"blocks.0.layers.0.weight", "blocks.0.layers.0.bias", "blocks.1.layers.0.weight",
                            "blocks.1.layers.0.bias", "lm_heads.0.weight", "lm_heads.1.weight"}
    assert side["adapter"] == "adapter" and side["serve_requires_merged_adapter"] is True
    adapted = PeftModel.from_pretrained(shared_weight_copy(loaded.target.model), str(result.out_dir / "adapter")).eval()
    ids = torch.tensor([[5, 9, 40, 77, 3, 120]])
    with torch.no_grad():
        got, want = adapted(input_ids=ids).logits, loaded.drafter.adapted[0](input_ids=ids).logits
        frozen = loaded.target.model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-6) and not torch.allclose(got, frozen, atol=1e-4)  # a real adapter
    cmd = result.serve_command
    assert "merge_and_unload" in cmd and str(result.out_dir / "adapter") in cmd
    assert cmd.splitlines()[-1].startswith(f"vllm serve {result.out_dir.parent / (result.out_dir.name + '-verifier-merged')}")
    assert result.report["round_trip"] == "3 contexts x 2 tokens identical"


def test_medusa2_wrong_adapter_is_detected(exported, ckpts, tmp_path):
    d = copy_export(exported["medusa2"], tmp_path)
    weights = load_file(str(d / "adapter" / "adapter_model.safetensors"))
    weights = {k: (v + 0.5 if "lora_B" in k else v) for k, v in weights.items()}
    save_file(weights, str(d / "adapter" / "adapter_model.safetensors"))
    assert "not the adapter these heads were trained with" in problems_of(d, "vllm", ckpts["medusa2"][1])
    shutil.rmtree(d / "adapter")
    assert "no peft adapter" in problems_of(d, "vllm", ckpts["medusa2"][1])


# --------------------------------------------------------------------------- MLP speculator


def vllm_mlp_parameter_names(n: int, vocab: int, emb_dim: int, inner: int, tied: bool) -> dict[str, tuple]:
    """The parameter names vLLM's MLPSpeculator registers: a tied model puts ONE module n times into
    each ModuleList (proj: the first plus one shared), and named_parameters() lists a shared one once."""
    def stage_lists(make):
        if tied:
            shared = make()
            return nn.ModuleList([shared] * n)
        return nn.ModuleList([make() for _ in range(n)])

    class LN(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.empty(inner)), nn.Parameter(torch.empty(inner))

    m = nn.Module()
    m.emb = stage_lists(lambda: nn.Embedding(vocab, inner))
    first, shared = nn.Linear(emb_dim, inner, bias=False), nn.Linear(inner, inner, bias=False)
    m.proj = nn.ModuleList([first] + ([shared] * (n - 1) if tied else
                                      [nn.Linear(inner, inner, bias=False) for _ in range(n - 1)]))
    m.head = stage_lists(lambda: nn.Linear(inner, vocab, bias=False))
    m.ln = stage_lists(LN)
    return {name: tuple(p.shape) for name, p in m.named_parameters()}


@pytest.mark.parametrize("case", ["mlp", "mlp_tied"])
def test_mlp_speculator_config_tensors_and_round_trip(exported, ckpts, case):
    config, side, tensors = files(exported[case])
    c = ckpts[case][1].drafter.cfg
    inner = 48 if case == "mlp" else H
    assert config["architectures"] == ["MLPSpeculatorPreTrainedModel"] and config["model_type"] == "mlp_speculator"
    assert (config["vocab_size"], config["emb_dim"], config["inner_dim"], config["n_predict"]) == (V, H, inner, 3)
    assert config["tie_weights"] is c.tie_weights and config["scale_input"] is c.scale_input
    assert len(config["top_k_tokens_per_head"]) == 3 and config["n_candidates"] >= 1  # vLLM asserts len == n_predict
    assert config["num_lookahead_tokens"] == 3
    names = vllm_mlp_parameter_names(3, V, H, inner, c.tie_weights)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == names
    if c.tie_weights:
        assert set(tensors) == {"emb.0.weight", "proj.0.weight", "proj.1.weight", "head.0.weight", "ln.0.weight",
                                "ln.0.bias"}
    assert exported[case].report["round_trip"] == "3 contexts x 3 tokens identical"
    assert side["num_speculative_tokens"] == 3 and '"method": "mlp_speculator"' in exported[case].serve_command


@pytest.mark.parametrize("case,most", [("medusa", 3), ("mlp", 3)])
def test_more_tokens_than_heads_is_refused(ckpts, tmp_path, case, most):
    path, loaded = ckpts[case]
    with pytest.raises(ValueError, match=f"--num-speculative-tokens 4 exceeds .* = {most}"):
        export(path, "vllm", tmp_path / "k", opts(case, num_speculative_tokens=4), loaded=loaded)
    assert not (tmp_path / "k").exists()
    fewer = export(path, "vllm", tmp_path / "k2", opts(case, num_speculative_tokens=2), loaded=loaded)
    assert fewer.report["round_trip"] == "3 contexts x 2 tokens identical"


# --------------------------------------------------------------------------- draft LM (hf)


def test_draft_lm_loads_with_auto_classes_and_matches(exported, ckpts):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result, loaded = exported["draft_lm"], ckpts["draft_lm"][1]
    model = AutoModelForCausalLM.from_pretrained(str(result.out_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(result.out_dir))
    assert tokenizer.get_vocab() == loaded.target.tokenizer.get_vocab()
    ids = torch.tensor([tokenizer("once upon a time")["input_ids"]])
    assert ids.tolist() == [loaded.target.tokenizer("once upon a time")["input_ids"]]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded.drafter.merged_model()(input_ids=ids).logits)
    assert model.config.num_hidden_layers == 2
    assert model.config.max_position_embeddings == 1024  # init: shrink carries the target's limit
    assert result.report["round_trip"] == "3 contexts x 5 tokens identical"
    assert '"method": "draft_model"' in result.serve_command and "--max-model-len" not in result.serve_command


def test_draft_lm_shorter_context_refused_unless_limited(ckpts, tmp_path):
    path, loaded = ckpts["draft_lm_short"]
    with pytest.raises(ExportValidationError) as err:
        export(path, "hf", tmp_path / "a", loaded=loaded)
    msg = str(err.value)
    assert "max_position_embeddings is 256, the target's is 1024" in msg and "--max-model-len 256" in msg
    assert not (tmp_path / "a").exists()
    result = export(path, "hf", tmp_path / "b", ExportOptions(flags={"max_model_len": 256}), loaded=loaded)
    assert " --max-model-len 256 " in result.serve_command
    assert json.loads((result.out_dir / "draftsmith.json").read_text())["max_model_len"] == 256
    with pytest.raises(ExportValidationError, match="below max_model_len 512"):
        export(path, "hf", tmp_path / "c", ExportOptions(flags={"max_model_len": 512}), loaded=loaded)
    with pytest.raises(ValueError, match="--max-model-len applies to --to hf"):
        export(ckpts["medusa"][0], "vllm", tmp_path / "d", ExportOptions(flags={"max_model_len": 256}), loaded=ckpts["medusa"][1])


# --------------------------------------------------------------------------- one failure per kind


def copy_export(result, tmp_path):
    dst = tmp_path / "t"
    shutil.copytree(result.out_dir, dst)
    return dst


def tampered(result, tmp_path, edit_tensors=None, edit_config=None):
    return tampered_copy(result.out_dir, tmp_path / "t", edit_tensors, edit_config)


def problems_of(directory, fmt, loaded):
    with pytest.raises(ExportValidationError) as err:
        validate_export(directory, EXPORTERS.get(fmt)(), loaded, ExportOptions(), 2)
    return str(err.value)


def test_medusa_missing_head_and_bias_flag(exported, ckpts, tmp_path):
    d = tampered(exported["medusa"], tmp_path, edit_tensors=lambda t: t.pop("lm_heads.1.weight"))
    assert "missing tensor(s) ['lm_heads.1.weight']" in problems_of(d, "vllm", ckpts["medusa"][1])
    shutil.rmtree(d)

    def no_bias(c):
        c["medusa_fc_bias"] = False
    d = tampered(exported["medusa"], tmp_path, edit_config=no_bias)
    msg = problems_of(d, "vllm", ckpts["medusa"][1])
    assert "unexpected tensor(s)" in msg and "blocks.0.layers.0.bias" in msg


def test_medusa_swapped_heads_fail_round_trip(exported, ckpts, tmp_path):
    def swap(t):
        t["lm_heads.0.weight"], t["lm_heads.1.weight"] = t["lm_heads.1.weight"], t["lm_heads.0.weight"]
    d = tampered(exported["medusa"], tmp_path, edit_tensors=swap)
    assert "round trip" in problems_of(d, "vllm", ckpts["medusa"][1])


def test_mlp_wrong_shape_and_flag(exported, ckpts, tmp_path):
    def cut(t):
        t["emb.0.weight"] = t["emb.0.weight"][:, :40].contiguous()
    d = tampered(exported["mlp"], tmp_path, edit_tensors=cut)
    assert "emb.0.weight has shape [259, 40], config.json implies [259, 48]" in problems_of(d, "vllm", ckpts["mlp"][1])
    shutil.rmtree(d)
    d = tampered(exported["mlp_tied"], tmp_path, edit_config=lambda c: c.update(scale_input=False))
    assert "scale_input is False, expected True" in problems_of(d, "vllm", ckpts["mlp_tied"][1])


def test_draft_lm_missing_tensor_and_foreign_tokenizer(exported, ckpts, tmp_path):
    name = "model.layers.1.mlp.down_proj.weight"
    d = tampered(exported["draft_lm"], tmp_path, edit_tensors=lambda t: t.pop(name))
    assert f"missing tensor(s) ['{name}']" in problems_of(d, "hf", ckpts["draft_lm"][1])
    shutil.rmtree(d)
    d = copy_export(exported["draft_lm"], tmp_path)
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    assert "tokenizer's vocabulary differs from the target's" in problems_of(d, "hf", ckpts["draft_lm"][1])
