"""The real Gemma-3-270M GGUF target (installed by scripts/install_gemma3_270m.sh, about 240 MB; never
needed by CI): inspect it, and decode one prompt with the n-gram proposer in bf16 under
--check-lossless, whose verdict must be PASSED or PASSED up to named numerical near-ties.
Skips with the install command when the model is absent; DRAFTSMITH_REQUIRE_GEMMA=1 fails instead."""
from __future__ import annotations

import json
import os

import pytest

from draftsmith.cli import main as cli_main
from draftsmith.targets import installed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma_path():
    try:
        return installed.resolve("gemma3-270m")
    except FileNotFoundError as exc:
        if os.environ.get("DRAFTSMITH_REQUIRE_GEMMA") == "1":
            pytest.fail(f"{exc} (DRAFTSMITH_REQUIRE_GEMMA=1 requires it)")
        pytest.skip(str(exc))


def test_gemma3_270m_inspects_and_decodes_losslessly_up_to_numerics(gemma_path, tmp_path, capsys):
    assert cli_main(["inspect", "installed:gemma3-270m", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["model_type"], rep["num_layers"], rep["hidden_size"], rep["vocab_size"]) == ("gemma3_text", 18, 640, 262144)
    assert rep["architectures"] == ["Gemma3ForCausalLM"] and rep["eos_ids"] == [1]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "count", "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"}) + "\n")
    out = tmp_path / "r.json"
    rc = cli_main(["eval", "--proposer", "ngram", "--target", "installed:gemma3-270m", "--dtype", "bfloat16",
                   "--k", "4", "--check-lossless", "--workloads", f"jsonl:{prompts}", "--num-prompts", "1",
                   "--max-new-tokens", "24", "--warmup", "0", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["lossless"]["passed"] is True, res["lossless"]
    assert res["target"]["format"] == "gguf" and res["target"]["gguf_file"] == str(gemma_path.resolve())
    agg = res["workloads"][f"jsonl:{prompts}"]["aggregate"]
    assert agg["acceptance_length"]["pooled"] > 1.5  # counting continues the prompt's pattern
