"""Issue 19 problem 5: what vLLM serves depends on its release. `--engine-version` checks the kind against the
table in export/engine_versions.py (read from the vllm 0.9.2 / 0.20.0 / 0.27.0 / 0.33.0 and sglang 0.5.23
wheels): vLLM 0.33 serves neither Medusa nor the MLP speculator, no V1 vLLM serves the MLP speculator
(0.9.2 is the last, through V0), 0.20 has no P-EAGLE or DSpark reader."""
from __future__ import annotations

import json

import pytest

from draftsmith.export import EXPORTERS, engine_versions, export, refusals
from draftsmith.export.layout import ExportOptions, layouts
from draftsmith.heads import DRAFTERS

CHECKPOINTS = {"medusa": ("medusa", {"num_heads": 2, "num_layers": 1}), "mlp_speculator": ("mlp_speculator", {"n_predict": 2}),
               "peagle": ("peagle", {"num_depths": 2})}


def test_the_newest_vllm_refuses_medusa_in_one_line_naming_0_27(ckpts, tmp_path, capsys):
    from draftsmith.cli import main

    path, _ = ckpts["medusa"]
    assert main(["export", str(path), "--to", "vllm", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "vLLM 0.33.0 cannot serve a medusa drafter" in err and "not a speculative method" in err
    assert "pass --engine-version 0.27.0" in err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("version", ["0.27", "v0.27.0", "0.20.0"])
def test_vllm_0_27_and_0_20_serve_medusa(ckpts, tmp_path, version):
    path, loaded = ckpts["medusa"]
    result = export(path, "vllm", tmp_path / "m", ExportOptions(engine_version=version), loaded=loaded)
    assert '"method": "medusa"' in result.serve_command and result.serve_command.startswith("vllm serve ")
    side = json.loads((result.out_dir / "draftsmith.json").read_text())
    assert side["engine_version"] == engine_versions.resolve("vllm", version)
    assert result.report["round_trip"].endswith("identical")


@pytest.mark.parametrize("version", ["0.33.0", "0.27.0", "0.20.0"])
def test_no_v1_vllm_serves_the_mlp_speculator(ckpts, tmp_path, version):
    path, loaded = ckpts["mlp_speculator"]
    with pytest.raises(ValueError) as err:
        export(path, "vllm", tmp_path / "p", ExportOptions(engine_version=version), loaded=loaded)
    msg = str(err.value)
    assert f"vLLM {version} cannot serve a mlp_speculator drafter" in msg and "\n" not in msg
    assert "pass --engine-version 0.9.2" in msg and "V0 speculative decoding" in msg
    if version != "0.33.0":  # the V1 releases that still ship the model file comment it out of the registry
        assert "Temporarily disabled" in msg and "registry.py" in msg
    assert not (tmp_path / "p").exists()


def test_vllm_0_9_2_serves_the_mlp_speculator_on_its_v0_engine(ckpts, tmp_path):
    path, loaded = ckpts["mlp_speculator"]
    result = export(path, "vllm", tmp_path / "p", ExportOptions(engine_version="0.9.2"), loaded=loaded)
    assert result.serve_command.startswith("VLLM_USE_V1=0 vllm serve ")
    assert '"method": "mlp_speculator"' in result.serve_command
    assert json.loads((result.out_dir / "draftsmith.json").read_text())["serve_command"] == result.serve_command


def test_vllm_0_20_has_no_peagle_reader(ckpts, tmp_path):
    path, loaded = ckpts["peagle"]
    with pytest.raises(ValueError, match=r"vLLM 0\.20\.0 cannot serve a peagle drafter .*algos\.py.*"
                                         r"pass --engine-version 0\.33\.0"):
        export(path, "vllm", tmp_path / "p", ExportOptions(engine_version="0.20"), loaded=loaded)
    assert "parallel_drafting" in export(path, "vllm", tmp_path / "q", loaded=loaded).serve_command  # default 0.33
    assert not engine_versions.serving("vllm", "0.20.0", "dspark").served
    assert engine_versions.serving("vllm", "0.20.0", "dflash").served
    assert engine_versions.serving("vllm", "0.20.0", "eagle3").served


def test_version_spelling_and_unknown_versions():
    assert engine_versions.resolve("vllm", None) == "0.33.0" and engine_versions.resolve("sglang", None) == "0.5.23"
    assert engine_versions.resolve("vllm", "v0.27") == "0.27.0" and engine_versions.resolve("vllm", "0.9.2") == "0.9.2"
    with pytest.raises(ValueError, match=r"--engine-version 0\.30: .*0\.9\.2, 0\.20\.0, 0\.27\.0, 0\.33\.0 only"):
        engine_versions.resolve("vllm", "0.30")
    assert engine_versions.resolve("trtllm", None) is None
    with pytest.raises(ValueError, match="--engine-version applies to --to vllm, --to sglang, not --to trtllm"):
        engine_versions.resolve("trtllm", "1.0")


def test_engine_version_is_refused_for_formats_without_a_table(ckpts, tmp_path, capsys):
    from draftsmith.cli import main

    path, _ = ckpts["medusa"]
    for fmt in ("hf", "llama.cpp"):
        assert main(["export", str(path), "--to", fmt, "--out", str(tmp_path / fmt), "--engine-version", "1"]) == 2
        assert "--engine-version applies to --to vllm" in capsys.readouterr().err
        assert not (tmp_path / fmt).exists()


def test_every_kind_of_a_versioned_format_has_a_row_per_release():
    for fmt in engine_versions.ENGINE_NAMES:
        kinds = [k for k in DRAFTERS.names() if k in layouts(fmt)]
        assert kinds and set(kinds) == set(EXPORTERS.get(fmt)().kinds)
        for version in engine_versions.versions(fmt):
            rows = engine_versions.SERVING.row(fmt, version)
            assert set(rows) == set(kinds), (fmt, version, sorted(set(kinds) ^ set(rows)))
            for kind, row in rows.items():
                assert row.source and (row.served or row.why), (fmt, version, kind)


def test_inspect_refusals_name_the_default_release(ckpts):
    config = ckpts["medusa"][1].target.config
    assert any("vLLM 0.33.0 cannot serve a medusa drafter" in r for r in refusals(config, "medusa", "vllm"))
    assert any("mlp_speculator" in r for r in refusals(config, "mlp_speculator", "vllm"))
    assert refusals(config, "eagle3", "vllm") == []
