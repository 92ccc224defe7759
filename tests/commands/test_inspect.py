"""`draftsmith inspect TARGET`: the report of a saved target (shape, rope, features, EOS, aux layers,
cache bytes, kinds and formats), exit 1 with reasons for an unsupported target, and `train`
refusing an unsupported target before it reads any data."""
from __future__ import annotations

import json

import pytest

from draftsmith import config, testing
from draftsmith.cli import main as cli_main
from draftsmith.heads import DRAFTERS
from draftsmith.targets import archs
from draftsmith.train.loop import Trainer


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
    target = testing.arch_target("gemma2")
    out = tmp_path_factory.mktemp("gemma2")
    target.model.save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    return out


def test_inspect_reports_a_gemma2_target(gemma2_dir, capsys):
    assert cli_main(["inspect", str(gemma2_dir), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["num_layers"], rep["hidden_size"], rep["vocab_size"]) == (4, 32, 259)
    assert rep["chat_template"] is True and rep["eos_ids"] == [2]
    assert rep["default_aux_layers"] == [1, 2, 3]
    assert "logit soft-cap 0.5" in rep["features"] and any(f.startswith("embedding scale") for f in rep["features"])
    # EAGLE-3 caches 3 aux layers and the last hidden state (its target_logits are replayed from it):
    # 4 * 32 values, 2 bytes each in bf16, + 5 bytes of ids and mask
    assert rep["feature_bytes_per_token"]["eagle3"] == {"float32": 517, "bfloat16": 261, "float16": 261}
    assert set(rep["feature_bytes_per_token"]) == set(DRAFTERS.names())
    # llama.cpp serves EAGLE-3, but its gemma2 graph stores no layer inputs: named, with the reason
    formats = rep["kinds"]["eagle3"]["formats"]
    assert rep["kinds"]["eagle3"]["refusals"] == [] and set(formats) == {"llama.cpp", "sglang", "trtllm", "vllm"}
    assert {f: r for f, r in formats.items() if r} == {"llama.cpp": [formats["llama.cpp"][0]]}
    assert "model_type 'gemma2' has no EAGLE-3 feature capture in llama.cpp" in formats["llama.cpp"][0]
    assert rep["kinds"]["draft_lm"]["formats"] == {"hf": [], "llama.cpp": []}
    assert cli_main(["inspect", str(gemma2_dir)]) == 0
    text = capsys.readouterr().out
    assert "chat template: yes; EOS ids [2]" in text and "eagle3: ok; export: sglang, trtllm, vllm" in text


def test_inspect_exits_1_with_reasons(tmp_path, capsys):
    two = archs.TINY["llama3"][1]()
    two.num_hidden_layers = 2
    target_dir = tmp_path / "two-layer"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(two).save_pretrained(target_dir)
    testing.arch_target("llama3").tokenizer.save_pretrained(target_dir)
    assert cli_main(["inspect", str(target_dir)]) == 0  # usable, with sglang/trtllm refused and named
    assert "refused: sglang (sglang: aux layer ids name layer outputs" in capsys.readouterr().out
    t5 = tmp_path / "encoder-decoder"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert cli_main(["inspect", str(t5)]) == 1
    err = capsys.readouterr().err
    assert "no causal-LM or image-text-to-text class for model_type 't5'" in err


def test_train_refuses_an_unsupported_target_before_reading_data(tmp_path):
    target = testing.arch_target("llama3")
    target.config.rope_parameters = {"rope_type": "mystery", "rope_theta": 10000.0}
    cfg = config.from_dict({"target": {"path": "unused", "device": "cpu"},
                            "data": {"path": [str(tmp_path / "does-not-exist.jsonl")]},
                            "drafter": {"kind": "eagle3"}, "train": {"output_dir": str(tmp_path / "run")},
                            "logging": {"progress_bar": False, "report_to": []}})
    with pytest.raises(ValueError, match="rope_type 'mystery'.*draftsmith inspect"):
        Trainer(cfg, target)


def test_inspect_cache_bytes_equal_what_prepare_predicts_for_every_kind(gemma2_dir, capsys):
    """inspect's bytes per token are the feature cache's own prediction (data/feature_cache.predict_bytes,
    which `draftsmith prepare --features --dry-run` prints) for every kind, aux-reading ones included:
    dflash, dspark and peagle read 3 aux layers too (inspect used to count them as 1 hidden state)."""
    from draftsmith.data import feature_cache
    from draftsmith.targets.archs import default_aux_layer_ids

    assert cli_main(["inspect", str(gemma2_dir), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    layers = default_aux_layer_ids(rep["num_layers"])
    for kind in DRAFTERS.names():
        cls = DRAFTERS.get(kind)
        features = feature_cache.cache_features(cls.required_features)
        n_aux = len(layers) if "aux_hidden_states" in features else 0
        for dtype in ("float32", "bfloat16"):
            want = feature_cache.predict_bytes(1, 0, features, n_aux, rep["hidden_size"], dtype)["per_token"]
            assert rep["feature_bytes_per_token"][kind][dtype] == want, (kind, dtype)
    assert rep["feature_bytes_per_token"]["dflash"]["bfloat16"] == 4 * 32 * 2 + 5  # 3 aux layers + last hidden
