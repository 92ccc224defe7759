"""Export is one table of format x kind: a format is one registered Exporter with one layout per kind
(registered by kind), and can_export is the one answer to "can kind K go to format F (at release V)".

- A toy format registered here through the public decorators only (one exporter with one flag of its own and its
  own doctor reader, one layout for EAGLE-3, its own validate hook) appears in `draftsmith ls`, `inspect`,
  `export --help`, is accepted by `draftsmith export --to toyfmt --toy-level N`, read by `draftsmith doctor`, and
  exported by the architecture matrix; its flag given to another format is refused naming the toy format.
- can_export agrees with what `export` does for every (kind, format, engine release): a refusal is the
  error export raises before writing anything, and a yes is an export that gets past every kind gate.
- inspect names llama.cpp for EAGLE-3 on a target llama.cpp serves."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import make_checkpoint
from safetensors.torch import load_file

from draftsmith.cli import main as cli_main
from draftsmith.core.errors import UserError
from draftsmith.core.flags import flag
from draftsmith.export import EXPORTERS, can_export, engine_versions, export, formats_for
from draftsmith.export.doctor.contract import Finding
from draftsmith.export.exporter import Exporter
from draftsmith.export.layout import (
    LAYOUTS,
    REFUSED,
    ExportFiles,
    ExportOptions,
    Layout,
    cast_floats,
    layouts,
    sidecar,
    unregister_format,
)
from draftsmith.export.llamacpp import tools as llamacpp_tools
from draftsmith.heads import DRAFTERS
from draftsmith.testing import arch_target

TOY = "toyfmt"
TOY_KIND = "eagle3"


@dataclass
class ToyFlags:
    toy_level: int = flag(1, about="the toy engine's level", help="toyfmt: the level the toy engine serves at")


class ToyDoctor:
    """The toy engine's doctor reader: `toy-serve DIR [--level N]`; the level must be the exported one."""

    PROGRAM, ENGINE, PACKAGE = "toy-serve", "Toy engine", None

    @staticmethod
    def recognises(argv):
        return argv[0] == "toy-serve"

    @staticmethod
    def read(command, source):
        argv = command.argv
        return {"level": int(argv[argv.index("--level") + 1]) if "--level" in argv else 1}

    @classmethod
    def expected(cls, contract, command):
        return cls.read(command, "the export")

    @staticmethod
    def check(contract, got, want, release):
        if got["level"] == want["level"]:
            return [], []
        return [Finding("level", f"serve at level {got['level']}", f"level {want['level']}",
                        f"--level {want['level']}")], []

    @staticmethod
    def config_command(path):
        raise UserError("the toy engine has no config file")


class ToyExporter(Exporter):
    name = TOY
    engine = "Toy engine"
    Flags = ToyFlags
    doctor = ToyDoctor

    def validate(self, export_dir, loaded, opts, files) -> dict:
        """The toy engine's check: the weights as written are the trained drafter's, bit for bit."""
        written = load_file(str(Path(export_dir) / "model.safetensors"))
        want = cast_floats(loaded.drafter.state_dict_for_export(), torch.float32)
        same = written.keys() == want.keys() and all(torch.equal(written[k], want[k]) for k in want)
        if not same:
            raise UserError(f"{export_dir}: the toy export's weights are not the drafter's")
        return {"round_trip": f"toy: {len(want)} tensors identical"}


class ToyLayout(Layout):
    def build(self, loaded, opts, out_dir):
        tensors = cast_floats(loaded.drafter.state_dict_for_export(), torch.float32)
        return ExportFiles(config={"toy_kind": self.kind, "toy_level": opts.flags.toy_level}, tensors=tensors,
                           sidecar=sidecar(loaded, self.name, self.engine, opts))

    def serve_command(self, out_dir, loaded, opts) -> str:
        level = opts.flags.toy_level
        return f"toy-serve {out_dir}" + (f" --level {level}" if level != 1 else "")


@pytest.fixture
def toy_format():
    """toyfmt in the registries for one test, through the public decorators (removed again even when the test fails)."""
    EXPORTERS.register(TOY)(ToyExporter)
    layouts(TOY).register(TOY_KIND)(ToyLayout)
    REFUSED.register(TOY, "medusa", "the toy engine has no Medusa heads")
    try:
        yield TOY
    finally:
        unregister_format(TOY)


@pytest.fixture(scope="module")
def eagle3_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("toy-eagle3"), TOY_KIND, {"ttt_steps": 2})


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    target = arch_target("llama3")
    out = tmp_path_factory.mktemp("llama3")
    target.model.save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    return out


def test_a_toy_format_is_one_registration(toy_format, eagle3_ckpt, tmp_path, capsys):
    assert can_export(TOY_KIND, TOY) == [] and TOY in formats_for(TOY_KIND)
    assert can_export("medusa", TOY) == ["--to toyfmt does not take medusa drafters: the toy engine has no Medusa heads"]
    assert can_export("peagle", TOY)[0].startswith("--to toyfmt does not take peagle drafters (it takes ['eagle3'])")

    assert cli_main(["ls"]) == 0
    out = capsys.readouterr().out
    assert TOY in out.split("export formats: ")[1].splitlines()[0] and f"  {TOY}: {TOY_KIND}\n" in out

    assert cli_main(["export", str(eagle3_ckpt), "--to", TOY, "--out", str(tmp_path / "toy")]) == 0
    out = capsys.readouterr().out
    assert f"({TOY}; validated: toy: " in out and f"toy-serve {tmp_path / 'toy'}" in out
    side = json.loads((tmp_path / "toy" / "draftsmith.json").read_text())
    assert (side["format"], side["drafter_kind"], side["serve_command"]) == (TOY, TOY_KIND, f"toy-serve {tmp_path / 'toy'}")
    assert json.loads((tmp_path / "toy" / "config.json").read_text()) == {"toy_kind": TOY_KIND, "toy_level": 1}


def test_a_toy_formats_own_flag_reaches_help_export_and_doctor(toy_format, eagle3_ckpt, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main(["export", "--help"])
    assert "--to toyfmt only:" in capsys.readouterr().out

    out = tmp_path / "toy"
    assert cli_main(["export", str(eagle3_ckpt), "--to", TOY, "--out", str(out), "--toy-level", "3"]) == 0
    capsys.readouterr()
    assert json.loads((out / "config.json").read_text())["toy_level"] == 3

    assert cli_main(["export", str(eagle3_ckpt), "--to", "vllm", "--out", str(tmp_path / "v"), "--toy-level", "3"]) == 2
    assert "--toy-level applies to --to toyfmt (the toy engine's level), not --to vllm" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()

    assert cli_main(["doctor", str(out), "--", "toy-serve", str(out), "--level", "3"]) == 0
    assert "the Toy engine command matches the export" in capsys.readouterr().out
    assert cli_main(["doctor", str(out), "--", "toy-serve", str(out)]) == 1
    assert "mismatch level: Toy engine will serve at level 1; the drafter was trained for level 3; fix: --level 3" in \
        capsys.readouterr().out
    assert cli_main(["doctor", str(out), "--", "someserver", str(out)]) == 2
    assert "toy-serve" in capsys.readouterr().err  # the programs doctor reads name the toy's too


def test_the_architecture_matrix_exports_to_a_toy_format(toy_format, tmp_path):
    from draftsmith.testing import matrix

    (cell,) = matrix.run_arch("llama3", tmp_path, kinds=[TOY_KIND])
    assert cell.status == "ok", cell.reasons
    assert cell.checks[f"export {TOY}"].startswith("toy: ") and (cell.exports[TOY] / "config.json").is_file()


def test_a_toy_format_is_listed_by_inspect(toy_format, llama3_dir, capsys):
    assert cli_main(["inspect", str(llama3_dir), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["kinds"][TOY_KIND]["formats"][TOY] == []
    assert TOY not in rep["kinds"]["medusa"]["formats"]
    assert cli_main(["inspect", str(llama3_dir)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith(f"{TOY_KIND}: ok"))
    assert TOY in line.split("export: ")[1].split(";")[0]


def test_the_toy_format_is_gone_after_its_test():
    assert TOY not in EXPORTERS and TOY not in LAYOUTS and can_export("medusa", TOY)[0].startswith("--to toyfmt: no such")


def test_inspect_names_llamacpp_for_eagle3(llama3_dir, capsys):
    assert cli_main(["inspect", str(llama3_dir)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("eagle3: ok"))
    assert "llama.cpp" in line.split("export: ")[1].split(";")[0], line
    assert set(formats_for("eagle3")) == {"llama.cpp", "sglang", "trtllm", "vllm"}
    assert {k for k in DRAFTERS.names() if "llama.cpp" in formats_for(k)} == {"eagle3", "draft_lm", "dflash", "dspark",
                                                                              "dflash2"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One tiny checkpoint per registered kind (its class's tiny options)."""
    return {kind: make_checkpoint(tmp_path_factory.mktemp(kind), kind, dict(DRAFTERS.get(kind).tiny_options))
            for kind in DRAFTERS.names()}


def no_llama_cpp():
    raise llamacpp_tools.LlamaCppMissing("llama.cpp is not installed (this test)")


@pytest.mark.parametrize("kind", DRAFTERS.names())
def test_can_export_agrees_with_export_for_every_format_and_release(kind, checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp_tools, "find_llama_cpp", no_llama_cpp)  # llama.cpp's yes: past every kind gate
    for fmt in EXPORTERS.names():
        for version in engine_versions.versions(fmt) or [None]:
            out = tmp_path / f"{fmt}-{version}"
            reasons = can_export(kind, fmt, version)
            opts = ExportOptions(engine_version=version)
            if reasons:
                with pytest.raises(UserError) as err:
                    export(checkpoints[kind], fmt, out, opts, validate=False)
                assert str(err.value) == "; ".join(reasons) and "\n" not in str(err.value), (kind, fmt, version)
                assert not out.exists()
            elif EXPORTERS.get(fmt).checked_in_process:
                side = json.loads((export(checkpoints[kind], fmt, out, opts, validate=False).out_dir /
                                   "draftsmith.json").read_text())
                assert (side["format"], side["drafter_kind"], side.get("engine_version")) == (fmt, kind, version)
            else:  # refused for this trained drafter (one line, "--to FMT: ...") or stopped at the missing tools
                with pytest.raises((llamacpp_tools.LlamaCppMissing, UserError)) as err:
                    export(checkpoints[kind], fmt, out, opts, validate=False)
                assert isinstance(err.value, llamacpp_tools.LlamaCppMissing) or str(err.value).startswith(f"--to {fmt}: ")
                assert not out.exists()
