"""`draftsmith doctor` knows the hybrid and vision-language targets (issue 42): where the engine release serves the
drafter kind but not for the target's model class (the engine tables of export/<engine>/targets.py, asked with the
target model_type the export records), the verdict is one mismatch line naming the engine, the release, the target's
model_type and the engine file the fact was read from; where it serves it, doctor is silent about the target."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from draftsmith import config as config_mod
from draftsmith.checkpoint import LoadedDrafter
from draftsmith.export import export
from draftsmith.export.layout import ExportOptions
from draftsmith.heads import DRAFTERS
from draftsmith.testing import arch_target
from tests.commands.doctor_exports import build_exports
from tests.commands.test_doctor import run, served


def _arch_export(arch: str, kind: str, fmt: str, out: Path, version: str | None) -> Path:
    """A `kind` export of the tiny `arch` target at engine release `version` (weights unchecked: doctor reads the
    sidecar and the command only)."""
    target = arch_target(arch)
    cls = DRAFTERS.get(kind)
    recipe = config_mod.from_dict({"target": {"path": f"{arch} (built in code)"},
                                   "drafter": {"kind": kind, **cls.tiny_options}})
    torch.manual_seed(0)
    drafter = cls.from_target(recipe.drafter.options, target).eval()
    loaded = LoadedDrafter(drafter=drafter, target=target, config=recipe,
                           meta={"kind": kind, "step": 1, "target": target.identity()})
    return export(None, fmt, out, ExportOptions(engine_version=version), validate=False, loaded=loaded).out_dir


@pytest.fixture(scope="module")
def qwen3_next_vllm(tmp_path_factory) -> Path:
    """EAGLE-3 for a Qwen3-Next target, exported for vLLM 0.33.0 (0.20 serves EAGLE-3, but not for qwen3_next)."""
    return _arch_export("qwen3-next", "eagle3", "vllm", tmp_path_factory.mktemp("doctor-targets") / "e3", "0.33.0")


@pytest.fixture(scope="module")
def llama_exports(tmp_path_factory):
    return build_exports(tmp_path_factory.mktemp("doctor-llama"), [("eagle3", "sglang"), ("eagle3", "trtllm"),
                                                                    ("eagle3", "vllm")])


def as_target(export_dir: Path, tmp_path: Path, model_type: str, text_model_type: str | None = None) -> Path:
    """A copy of an export whose sidecar records a target of `model_type` (and, when given, a text model of
    `text_model_type` under target_architecture): what an older draftsmith, which had no target table, wrote."""
    dst = tmp_path / f"as-{model_type}"
    shutil.copytree(export_dir, dst)
    for name in ("draftsmith.json", "extra_llm_api_options.yaml"):  # the files that name the export's directory
        if (dst / name).exists():
            (dst / name).write_text((dst / name).read_text().replace(str(export_dir), str(dst)))
    side = json.loads((dst / "draftsmith.json").read_text())
    side["verifier"]["model_type"] = model_type
    if text_model_type is not None:
        side["target_architecture"]["model_type"] = text_model_type
    (dst / "draftsmith.json").write_text(json.dumps(side))
    return dst


def target_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("mismatch target architecture")]


def test_vllm_release_without_the_targets_eagle3_capture(qwen3_next_vllm, capsys):
    code, lines = run(capsys, qwen3_next_vllm, "--engine-version", "0.20.0", "--", served(qwen3_next_vllm))
    assert code == 1, lines
    line, = target_lines(lines)
    for part in ("vLLM 0.20.0", "qwen3_next", "Qwen3NextForCausalLM", "model_executor/models/qwen3_next.py",
                 "SupportsEagle3", "fix: serve with vLLM 0.33.0"):
        assert part in line, (part, line)
    assert not any(line.startswith("mismatch engine release") for line in lines)  # 0.20 serves EAGLE-3 at all


@pytest.mark.parametrize("release", ["0.27.0", "0.33.0"])
def test_vllm_release_that_serves_the_target_is_silent(qwen3_next_vllm, capsys, release):
    code, lines = run(capsys, qwen3_next_vllm, "--engine-version", release, "--", served(qwen3_next_vllm))
    assert code == 0 and not target_lines(lines), lines


def test_vllm_release_with_no_model_class_for_the_target(qwen3_next_vllm, capsys):
    """0.9.2 serves no EAGLE-3 at all: that is the one verdict (the kind's), not the target's on top."""
    code, lines = run(capsys, qwen3_next_vllm, "--engine-version", "0.9.2", "--", served(qwen3_next_vllm))
    assert code == 1 and any(line.startswith("mismatch engine release") for line in lines) and not target_lines(lines)


def test_sglang_target_class_without_the_capture_method(llama_exports, capsys, tmp_path):
    base = llama_exports[("eagle3", "sglang")]
    code, lines = run(capsys, base, "--engine-version", "0.5.23", "--", served(base))
    assert code == 0 and not target_lines(lines), lines  # a Llama target: not in the table, served
    directory = as_target(base, tmp_path, "granitemoehybrid")
    code, lines = run(capsys, directory, "--engine-version", "0.5.23", "--", served(directory))
    assert code == 1, lines
    line, = target_lines(lines)
    for part in ("SGLang 0.5.23", "granitemoehybrid", "GraniteMoeHybridForCausalLM", "srt/models/granitemoehybrid.py",
                 "set_eagle3_layers_to_capture", "export another kind or format"):
        assert part in line, (part, line)
    directory = as_target(base, tmp_path, "qwen3_vl")  # SGLang's Qwen3VLForConditionalGeneration captures
    code, lines = run(capsys, directory, "--engine-version", "0.5.23", "--", served(directory))
    assert code == 0 and not target_lines(lines), lines


def test_trtllm_snapshot_table_is_asked_without_a_release(llama_exports, capsys, tmp_path):
    directory = as_target(llama_exports[("eagle3", "trtllm")], tmp_path, "gemma3")
    code, lines = run(capsys, directory, "--", served(directory))
    assert code == 1, lines
    line, = target_lines(lines)
    for part in ("TensorRT-LLM main (2026-12 snapshot)", "gemma3", "tensorrt_llm/_torch/models/modeling_gemma3vl.py",
                 "maybe_capture_hidden_states"):
        assert part in line, (part, line)
    directory = as_target(llama_exports[("eagle3", "trtllm")], tmp_path, "nemotron_h")  # its layers capture
    code, lines = run(capsys, directory, "--", served(directory))
    assert code == 0 and not target_lines(lines), lines


def test_text_model_type_is_asked_when_the_verifiers_is_not_listed(llama_exports, capsys, tmp_path):
    """A verifier recorded under a model_type the tables do not list: its text model's model_type (target_architecture)
    is asked (Qwen3.5 text: vLLM 0.20 has no model class for qwen3_5_text)."""
    directory = as_target(llama_exports[("eagle3", "vllm")], tmp_path, "some_wrapper", "qwen3_5_text")
    code, lines = run(capsys, directory, "--engine-version", "0.20.0", "--", served(directory))
    assert code == 1, lines
    line, = target_lines(lines)
    assert "vLLM 0.20.0 has no model class for a qwen3_5_text target (model_executor/models/registry.py)" in line
    assert "fix: serve with vLLM 0.33.0" in line


def test_one_line_each(qwen3_next_vllm, capsys):
    code, lines = run(capsys, qwen3_next_vllm, "--engine-version", "0.20.0", "--", served(qwen3_next_vllm))
    line, = target_lines(lines)
    assert "\n" not in line and len(line) < 1500
