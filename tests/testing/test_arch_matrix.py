"""The architecture matrix (draftsmith/testing/matrix.py): every tiny architecture x every drafter kind
extracts the right features, trains 2 finite steps, decodes greedily exactly like the target
alone, and exports to every format that takes it, the export carrying the target's rope (and, for
a draft LM, soft-capping and windows); or a named refusal at config time. Random weights:
correctness only. docs/targets.md must show the statuses this test computes
(regenerate it with `python scripts/gen_targets_doc.py`)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftsmith.export import EXPORTERS, refusals
from draftsmith.export import formats_for as export_formats_for
from draftsmith.heads import DRAFTERS
from draftsmith.targets import archs
from draftsmith.testing import matrix

DOC = Path(__file__).resolve().parents[2] / "docs" / "targets.md"


def doc_row(arch: str) -> dict[str, str]:
    """The status of each kind for `arch` as docs/targets.md shows it."""
    lines = DOC.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| architecture"))
    kinds = [c.strip() for c in header.strip("|").split("|")][2:]
    row = next(line for line in lines if line.startswith(f"| `{arch}`"))
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    return dict(zip(kinds, (c.split()[0] for c in cells)))


@pytest.mark.parametrize("arch", list(archs.TINY))
def test_matrix_row(arch, tmp_path):
    cells = matrix.run_arch(arch, tmp_path)
    failed = [f"{c.kind}: {c.reasons}" for c in cells if c.status == "failed"]
    assert not failed, failed
    for c in cells:
        if c.status == "refused":  # a refusal names the feature; it happens before any training
            assert c.reasons and not c.checks
            continue
        assert set(c.checks) >= {"train", "features", "lossless"}
        assert re.fullmatch(r"identical over [1-9]\d* rounds \(\d+ with a rejection\)", c.checks["lossless"])
        refused = {k.split()[1] for k, v in c.checks.items() if k.startswith("export ") and v.startswith("refused")}
        not_run = {k.split()[1] for k, v in c.checks.items() if k.startswith("export ") and v == matrix.NOT_RUN}
        assert not_run <= {f for f in EXPORTERS.names() if not EXPORTERS.get(f).checked_in_process}
        assert set(c.exports) | refused | not_run == set(export_formats_for(c.kind))
        for fmt, directory in c.exports.items():
            config = json.loads((directory / "config.json").read_text())
            side = json.loads((directory / "draftsmith.json").read_text())
            assert side["target_architecture"]["model_type"] == archs.text_config(
                archs.TINY[arch][1]()).model_type
            if c.kind == "draft_lm":  # the target's own architecture: soft-caps and windows carried as they are
                assert not archs.carried_field_problems(config, archs.TINY[arch][1]())
            elif DRAFTERS.get(c.kind).uses_draft_rope:  # the draft layer's rope: the target's schedule, never a fallback
                llama = config.get("transformer_layer_config", config)
                rope = llama.get("rope_parameters") or llama.get("rope_scaling") or {}  # TRT-LLM: rope_scaling only
                assert rope.get("rope_type", "default") == archs.draft_rope(archs.TINY[arch][1]()).get("rope_type"), (fmt, rope)
    # rollback is exercised: random drafters get rejected (a cell whose draft loops with the target may not)
    ok = [c for c in cells if c.status == "ok"]  # a row refused at config time (no model class) has none
    assert not ok or sum(not c.checks.get("lossless", "").endswith("(0 with a rejection)") for c in ok) >= 3
    assert doc_row(arch) == {c.kind: c.status for c in cells}, "docs/targets.md is stale: run scripts/gen_targets_doc.py"


def test_named_refusals_happen_at_config_time():
    two_layer = archs.TINY["llama3"][1]()
    two_layer.num_hidden_layers = 2
    reasons = refusals(two_layer, "eagle3", "sglang")
    assert len(reasons) == 1 and re.search(r"sglang: aux layer ids.*include 0", reasons[0])
    assert refusals(two_layer, "eagle3", "vllm") == []
    assert set(export_formats_for("eagle1")) == {"vllm", "sglang"} and "vllm" in export_formats_for("medusa")
    assert "unknown" in refusals(two_layer, "no_such_kind")[0]


def test_draft_rope_flattens_per_layer_type_and_drops_partial_rotary():
    gemma3 = archs.draft_rope(archs.TINY["gemma3-text"][1]())
    assert gemma3 == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}  # the full-attention layers'
    glm4 = archs.draft_rope(archs.TINY["glm4"][1]())
    assert "partial_rotary_factor" not in glm4 and glm4["rope_type"] == "default"
    gpt_oss = archs.draft_rope(archs.TINY["gpt-oss"][1]())
    assert gpt_oss["rope_type"] == "yarn" and gpt_oss["factor"] == 8.0  # never the llama3 schedule
