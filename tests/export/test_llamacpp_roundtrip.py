"""train -> export --to llama.cpp -> llama-server, on the embedded target builtin:pycode-tiny: the quickstart
EAGLE-3 recipe for a few steps, its GGUF files written by llama.cpp's converter and loaded by llama-server,
then `draftsmith eval --engine llama.cpp` on a few prompts: llama.cpp's output with the draft equals its
output without, its target-only output equals draftsmith's, and its tau equals draftsmith's (the two loops
verify the same drafts greedily, so they count the same rounds).

Needs llama.cpp built by `bash scripts/install_llama_cpp.sh`; skips without it, unless
DRAFTSMITH_REQUIRE_LLAMA_CPP=1 (set by .ci/run after the install script succeeded)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tools):
    from draftsmith import config
    from draftsmith.train.loop import train

    out = tmp_path_factory.mktemp("llamacpp-run")
    cfg = config.load(REPO / "recipes" / "quickstart.yaml",
                      ["train.max_steps=30", "train.batch_size=4", "train.eval_every=0", f"train.output_dir={out}/run",
                       "data.max_samples=64", "data.eval_samples=2", "logging.progress_bar=false",
                       "train.precision=fp32", "target.device=cpu", "drafter.ttt_steps=3"])
    return train(cfg).final_checkpoint


def test_train_export_serve_round_trip(trained, tools, tmp_path, capsys):
    from draftsmith.cli import main

    out = tmp_path / "gguf"
    assert main(["export", str(trained), "--to", "llama.cpp", "--out", str(out), "--num-speculative-tokens", "3"]) == 0
    side = json.loads((out / "draftsmith.json").read_text())
    assert side["check"]["loaded"] and side["check"]["draft_n"] > 0  # llama-server loaded both and drafted
    assert (out / "draft-eagle3.gguf").is_file() and (out / side["target"]).is_file()
    assert side["target"] == "target-pycode-tiny-f32.gguf" and side["spec_type"] == "draft-eagle3"

    from gguf import GGUFReader

    fields = GGUFReader(str(out / "draft-eagle3.gguf")).fields
    assert fields["general.architecture"].contents() == "eagle3"
    layers = [v.contents() for k, v in fields.items() if k.startswith("eagle3.") and "layers" in k]
    assert layers and list(layers[0]) == side["aux_layer_ids"]

    result = tmp_path / "parity.json"
    capsys.readouterr()
    code = main(["eval", str(trained), "--engine", "llama.cpp", "--engine-export", str(out), "--workloads", "pycode",
                 "--k", "3", "--num-prompts", "3", "--max-new-tokens", "24", "--out", str(result), "--check-lossless"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    e = json.loads(result.read_text())["workloads"]["pycode"]["engine"]
    assert e["output_equals_target_only"] == e["num_requests"] == 3
    assert e["target_only_equals_draftsmith"] == 3 and e["prompt_lengths_match"]
    assert e["draft_n"] > 0 and e["rounds"] > 0
    assert e["acceptance_length"] == pytest.approx(e["draftsmith_acceptance_length"], rel=0.05), printed
    assert "llama.cpp tau" in printed and e["verdict"] == "agree"


def test_the_server_is_stopped_after_an_error(tools, trained, tmp_path):
    """A failing request inside the block still stops llama-server (its port is free again)."""
    from draftsmith.export.llamacpp.tools import LlamaCppError, LlamaServer, convert
    from draftsmith.targets.load import resolve_path

    gguf = convert(tools, Path(resolve_path("builtin:pycode-tiny")), tmp_path / "t.gguf")
    with pytest.raises(LlamaCppError, match="invalid tokens"):
        with LlamaServer(tools, gguf, max_requests=2) as srv:
            port, proc = srv.port, srv.proc
            srv.complete([10**6], 4)  # an id outside the vocabulary: the server answers 400
    assert proc.poll() is not None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
