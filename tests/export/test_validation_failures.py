"""Each validation failure is detected with a message naming the problem, and a failed export
writes nothing into the output directory."""
from __future__ import annotations

import pytest
import torch

from draftsmith.export import EXPORTERS, export
from draftsmith.export.layout import ExportOptions, ExportValidationError
from draftsmith.export.validate import validate_export
from tests.export.tamper import tampered_copy


@pytest.fixture(scope="module")
def good(eagle3_ckpt, eagle3_loaded, tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    return {fmt: export(eagle3_ckpt, fmt, root / fmt, loaded=eagle3_loaded).out_dir for fmt in ("sglang", "vllm")}


def tampered(src, tmp_path, edit_tensors=None, edit_config=None):
    return tampered_copy(src, tmp_path / "t", edit_tensors, edit_config)


def problems_of(directory, fmt, loaded):
    with pytest.raises(ExportValidationError) as err:
        validate_export(directory, EXPORTERS.get(fmt)(), loaded, ExportOptions(), 3)
    return str(err.value)


def test_missing_tensor(good, eagle3_loaded, tmp_path):
    d = tampered(good["sglang"], tmp_path, edit_tensors=lambda t: t.pop("midlayer.hidden_norm.weight"))
    assert "missing tensor(s) ['midlayer.hidden_norm.weight']" in problems_of(d, "sglang", eagle3_loaded)


def test_unexpected_tensor(good, eagle3_loaded, tmp_path):
    d = tampered(good["sglang"], tmp_path, edit_tensors=lambda t: t.update({"embed_tokens.weight": torch.zeros(259, 32)}))
    assert "unexpected tensor(s) ['embed_tokens.weight']" in problems_of(d, "sglang", eagle3_loaded)


def test_wrong_shape(good, eagle3_loaded, tmp_path):
    def cut(t):
        t["fc.weight"] = t["fc.weight"][:, :64].contiguous()  # two aux layers instead of three
    msg = problems_of(tampered(good["sglang"], tmp_path, edit_tensors=cut), "sglang", eagle3_loaded)
    assert "fc.weight has shape [32, 64], config.json implies [32, 96]" in msg


def test_inconsistent_d2t(good, eagle3_loaded, tmp_path):
    def shift(t):
        t["d2t"] = t["d2t"].clone()
        t["d2t"][5] += 1
    msg = problems_of(tampered(good["sglang"], tmp_path, edit_tensors=shift), "sglang", eagle3_loaded)
    assert "d2t/t2d disagree" in msg and "differs from the mapping the drafter was trained with" in msg


def test_missing_rope_scaling(good, eagle3_loaded, tmp_path):
    def drop(c):
        c["transformer_layer_config"].pop("rope_scaling")
        c["transformer_layer_config"].pop("rope_parameters")
    msg = problems_of(tampered(good["vllm"], tmp_path, edit_config=drop), "vllm", eagle3_loaded)
    assert "rope_scaling is missing but the target uses" in msg


def test_default_position_limit(good, eagle3_loaded, tmp_path):
    msg = problems_of(tampered(good["sglang"], tmp_path, edit_config=lambda c: c.update(max_position_embeddings=2048)),
                      "sglang", eagle3_loaded)
    assert "max_position_embeddings is 2048, the target's is 4096" in msg


def test_vllm_norm_before_residual_and_embedding(good, eagle3_loaded, tmp_path):
    def bad(t):
        t["embed_tokens.weight"] = torch.zeros_like(t["embed_tokens.weight"])
    d = tampered(good["vllm"], tmp_path, edit_tensors=bad, edit_config=lambda c: c.update(norm_before_residual=not c["norm_before_residual"]))
    msg = problems_of(d, "vllm", eagle3_loaded)
    assert "config.json: norm_before_residual is" in msg and "embed_tokens.weight differs" in msg


def test_round_trip_catches_changed_weights(good, eagle3_loaded, tmp_path):
    def scramble(t):
        t["lm_head.weight"] = torch.flip(t["lm_head.weight"], dims=[0]).contiguous()
    d = tampered(good["sglang"], tmp_path, edit_tensors=scramble)
    assert "round trip" in problems_of(d, "sglang", eagle3_loaded)


def test_failed_export_writes_nothing(eagle3_ckpt, eagle3_loaded, tmp_path, monkeypatch):
    from draftsmith.export import validate

    monkeypatch.setattr(validate, "check_rope", lambda llama, tc: ["config.json: injected failure"])
    out = tmp_path / "out"
    with pytest.raises(ExportValidationError, match="injected failure"):
        export(eagle3_ckpt, "sglang", out, loaded=eagle3_loaded)
    assert not out.exists() and list(tmp_path.iterdir()) == []
