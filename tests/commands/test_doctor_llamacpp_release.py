"""doctor finds the project's own llama.cpp build as `eval --engine` does (issue 44, "Also"): where
scripts/install_llama_cpp.sh built llama-server (its cache, or DRAFTSMITH_LLAMA_CPP_DIR / DRAFTSMITH_LLAMA_SERVER),
doctor runs `llama-server --version` and compares it with the build the export was checked with
(draftsmith.json llama_cpp.server_version) instead of saying "llama.cpp release: not checked". The build here is a
stand-in executable in the install script's layout (build/bin/llama-server, src/convert_hf_to_gguf.py), found
through the real lookup (export/llamacpp/tools.find_llama_cpp)."""
from __future__ import annotations

import json

import pytest

from tests.commands.doctor_exports import build_exports
from tests.commands.test_doctor import LLAMACPP, last_line, run, served


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return build_exports(tmp_path_factory.mktemp("doctor-llamacpp-release"), [("eagle3", LLAMACPP)])[("eagle3", LLAMACPP)]


def fake_build(root, version_line: str):
    (root / "build" / "bin").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "src" / "convert_hf_to_gguf.py").write_text("# stand-in\n")
    server = root / "build" / "bin" / "llama-server"
    server.write_text(f"#!/bin/sh\necho '{version_line}' >&2\necho 'built with cc for x86_64' >&2\n")
    server.chmod(0o755)
    return server


def test_no_build_is_not_checked(export_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTSMITH_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("DRAFTSMITH_LLAMA_CPP_DIR", str(tmp_path / "none"))
    code, lines = run(capsys, export_dir, "--", *last_line(served(export_dir)))
    assert code == 0 and any(line.startswith("not checked:") and "llama.cpp release" in line for line in lines), lines


def test_the_projects_build_is_found_and_checked(export_dir, capsys, tmp_path, monkeypatch):
    checked_with = json.loads((export_dir / "draftsmith.json").read_text())["llama_cpp"]["server_version"]
    monkeypatch.delenv("DRAFTSMITH_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("DRAFTSMITH_LLAMA_CPP_DIR", str(tmp_path / "cache"))
    fake_build(tmp_path / "cache", checked_with)
    code, lines = run(capsys, export_dir, "--", *last_line(served(export_dir)))
    assert code == 0, lines
    assert not any("llama.cpp release" in line for line in lines), lines


def test_another_build_is_a_note(export_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_LLAMA_CPP_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DRAFTSMITH_LLAMA_SERVER", str(fake_build(tmp_path / "cache", "version: 9999 (abcdef0)")))
    code, lines = run(capsys, export_dir, "--", *last_line(served(export_dir)))
    assert code == 0, lines
    assert any(line.startswith("note engine release: llama.cpp will run version: 9999 (abcdef0)") for line in lines), lines
