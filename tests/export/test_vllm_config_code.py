"""vLLM's OWN config code runs on every speculators-format export (eagle3, dflash, dspark, peagle): vLLM's
`vllm/transformers_utils/configs/speculators/base.py` SpeculatorsConfig (with algos.py) imports on CPU without
vLLM's compiled kernels. For each vLLM version fetched by `bash scripts/fetch_vllm_config_code.sh [VERSION ...]`
(pure-Python files out of the wheel, into ~/.cache/draftsmith/vllm-config-code/VERSION or
$DRAFTSMITH_VLLM_CONFIG_CODE/VERSION), a subprocess runs SpeculatorsConfig.from_pretrained(export) and
extract_vllm_speculative_config(config.json), and the test checks what vLLM's model code then reads: the
architecture it picks, aux / target layer ids, DFlash causality, DSpark's confidence head, P-EAGLE's method. The
printed --speculative-config keys are checked against the fields of that version's SpeculativeConfig (parsed
from vllm/config/speculative.py, never imported: it needs vLLM's full dependency set).

The wheels are 244-336 MB each, so CI does not fetch them: the test skips without the code, and fails instead
under DRAFTSMITH_REQUIRE_VLLM_CONFIG_CODE=1.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_checkpoint

from draftsmith import checkpoint
from draftsmith.export import export

ROOT = Path(os.environ.get("DRAFTSMITH_VLLM_CONFIG_CODE", Path.home() / ".cache/draftsmith/vllm-config-code"))
BASE = "vllm/transformers_utils/configs/speculators/base.py"
VERSIONS = sorted((p.name for p in ROOT.glob("*") if (p / BASE).exists()), key=lambda v: tuple(map(int, v.split("."))))
# speculators model types each version's algos.py registers (read from the 0.20.0 / 0.27.0 / 0.33.0 wheels)
KINDS_SINCE = {"eagle3": (0, 20), "dflash": (0, 20), "dspark": (0, 27), "peagle": (0, 27)}
CASES = {
    "eagle3": {"ttt_steps": 3, "draft_vocab_size": 100},
    "dflash": {"block_size": 4, "num_layers": 1},
    "dspark": {"block_size": 3, "num_layers": 1, "markov_rank": 8, "draft_vocab_size": 100},
    "peagle": {"num_depths": 3},
}
READ = ("architectures", "model_type", "eagle_aux_hidden_state_layer_ids", "target_layer_ids", "dflash_config",
        "norm_before_residual", "fc_norm", "norm_output", "draft_vocab_size", "enable_confidence_head",
        "confidence_head_with_markov", "markov_rank", "markov_head_type", "block_size", "sample_from_anchor",
        "dspark_bonus_anchor", "pard_token", "mask_token_id", "target_hidden_size")
RUNNER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
out = {}
for path in sys.argv[3:]:
    try:
        config = SpeculatorsConfig.from_pretrained(path)
        raw = json.load(open(path + "/config.json"))
        out[path] = {"hf": {k: getattr(config, k) for k in json.loads(sys.argv[2]) if hasattr(config, k)},
                     "spec": SpeculatorsConfig.extract_vllm_speculative_config(raw)}
    except Exception as exc:  # recorded: a version that cannot read the export is itself the finding
        out[path] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out, default=str))
"""


def require_code():
    if VERSIONS:
        return
    reason = (f"no vLLM config code under {ROOT}; run `bash scripts/fetch_vllm_config_code.sh` (downloads a "
              "~336 MB wheel, keeps 4-11 MB of Python files)")
    if os.environ.get("DRAFTSMITH_REQUIRE_VLLM_CONFIG_CODE") == "1":
        pytest.fail(reason + " (DRAFTSMITH_REQUIRE_VLLM_CONFIG_CODE=1 requires it)")
    pytest.skip(reason)


def speculative_config_fields(version: str) -> set[str]:
    """The field names of SpeculativeConfig in that version's vllm/config/speculative.py (its pydantic config
    forbids any other key in --speculative-config)."""
    tree = ast.parse((ROOT / version / "vllm/config/speculative.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    require_code()
    out = {}
    for kind, options in CASES.items():
        path = make_checkpoint(tmp_path_factory.mktemp(kind), kind, options)
        loaded = checkpoint.load_drafter(path, device="cpu")
        out[kind] = (export(path, "vllm", tmp_path_factory.mktemp("x") / kind, loaded=loaded), loaded.drafter)
    return out


def run_vllm(version: str, exports: dict) -> dict:
    paths = [str(result.out_dir) for result, _ in exports.values()]
    done = subprocess.run([sys.executable, "-c", RUNNER, str(ROOT / version), json.dumps(READ), *paths],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert done.returncode == 0, done.stderr[-2000:]
    by_path = json.loads(done.stdout.strip().splitlines()[-1])
    return {kind: by_path[str(result.out_dir)] for kind, (result, _) in exports.items()}


@pytest.mark.parametrize("version", VERSIONS or ["(none fetched)"])
def test_vllm_config_code_reads_every_export(exports, version):
    read = run_vllm(version, exports)
    v = tuple(map(int, version.split(".")))
    for kind, (result, drafter) in exports.items():
        got = read[kind]
        if v < KINDS_SINCE[kind]:
            assert "Expected one of" in got.get("error", ""), f"vLLM {version} now reads {kind}: {got}"
            continue
        assert "error" not in got, f"vLLM {version} cannot read the {kind} export: {got['error']}"
        hf, spec = got["hf"], got["spec"]
        k = json.loads((result.out_dir / "draftsmith.json").read_text())["num_speculative_tokens"]
        assert spec["num_speculative_tokens"] == k
        aux = list(drafter.aux_layer_ids)
        assert hf["eagle_aux_hidden_state_layer_ids"] == aux  # vLLM's ids = draftsmith's (input of layer i)
        CHECKS[kind](hf, spec, drafter, aux, v)


def check_eagle3(hf, spec, d, aux, v):
    assert spec["method"] == "eagle3" and hf["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert hf["norm_before_residual"] is False  # vLLM defaults a missing one to true
    assert hf["draft_vocab_size"] == 100


def check_dflash(hf, spec, d, aux, v):
    assert spec["method"] == "dflash" and hf["architectures"] == ["DFlashDraftModel"]
    # the runner captures eagle_aux_hidden_state_layer_ids (= aux, checked above) when set; target_layer_ids is
    # z-lab's layer-output id (>= 0.27, #40727) and only its length is read in 0.20 (qwen3_dflash.py)
    assert hf["dflash_config"]["target_layer_ids"] == ([i - 1 for i in aux] if v >= (0, 27) else aux)
    assert hf["dflash_config"]["mask_token_id"] == d.mask_token_id
    assert hf["dflash_config"].get("causal", False) is False  # 0.20 has no field (always non-causal)


def check_dspark(hf, spec, d, aux, v):
    assert spec["method"] == "dspark" and hf["architectures"] == ["Qwen3DSparkModel"]
    assert hf["target_layer_ids"] == [i - 1 for i in aux]
    # qwen3_dspark.py builds the confidence head only from these: adaptive verification needs it
    assert hf["enable_confidence_head"] is True and hf["confidence_head_with_markov"] is True
    assert hf["markov_rank"] == 8 and hf["block_size"] == 3 and hf["sample_from_anchor"] is True
    if v >= (0, 33):
        assert hf["dspark_bonus_anchor"] is False


def check_peagle(hf, spec, d, aux, v):
    assert spec == {"method": "eagle3", "parallel_drafting": True, "num_speculative_tokens": 3}
    assert hf["architectures"] == ["PeagleLlamaForCausalLM"] and hf["pard_token"] == d.mask_token_id


CHECKS = {"eagle3": check_eagle3, "dflash": check_dflash, "dspark": check_dspark, "peagle": check_peagle}


@pytest.mark.parametrize("version", VERSIONS or ["(none fetched)"])
def test_serve_commands_use_speculative_config_fields_of_the_version(exports, version):
    """Every key of each printed --speculative-config is a SpeculativeConfig field; the DSpark command's
    adaptive-verification field exists from 0.28 on, as its '# vLLM >= 0.28.0' line says."""
    fields = speculative_config_fields(version)
    v = tuple(map(int, version.split(".")))
    for kind, (result, _) in exports.items():
        if v < KINDS_SINCE[kind]:
            continue
        keys = set(json.loads(result.serve_command.rsplit("--speculative-config ", 1)[1].strip("'")))
        if kind == "dspark" and v < (0, 28):
            assert "enable_adaptive_verification" not in fields and "enable_adaptive_verification" in keys
            keys.discard("enable_adaptive_verification")
        assert keys <= fields, f"vLLM {version}'s SpeculativeConfig has no {sorted(keys - fields)} ({kind})"
