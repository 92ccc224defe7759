"""Issue 34: llama.cpp's converter runs under draftsmith's Python, so a package it imports that is
missing there (sentencepiece in a fresh virtual environment) fails the conversion: the error names
the one command that installs the converter's needs (pyproject's `llamacpp` extra)."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith.export.llamacpp.tools import LlamaCppError, LlamaCppTools, convert


def _converter(root: Path, body: str) -> Path:
    """A converter directory shaped like llama.cpp's: convert_hf_to_gguf.py beside conversion/base.py."""
    (root / "conversion").mkdir(parents=True)
    (root / "conversion" / "__init__.py").write_text("")
    (root / "conversion" / "base.py").write_text("class TextModel:\n    def get_vocab_base_pre(self, t):\n"
                                                 "        return 'gpt-2'\n")
    (root / "convert_hf_to_gguf.py").write_text(body)
    return root / "convert_hf_to_gguf.py"


def test_a_missing_converter_module_names_the_install_command(tmp_path):
    tools = LlamaCppTools(server=tmp_path / "llama-server",
                          converter=_converter(tmp_path / "src", "import draftsmith_no_such_module_xyz\n"))
    with pytest.raises(LlamaCppError) as info:
        convert(tools, tmp_path, tmp_path / "out.gguf")
    message = str(info.value)
    assert "No module named 'draftsmith_no_such_module_xyz'" in message
    assert "pip install 'draftsmith[llamacpp]'" in message and "\n" not in message


def test_another_converter_failure_does_not_name_it(tmp_path):
    tools = LlamaCppTools(server=tmp_path / "llama-server",
                          converter=_converter(tmp_path / "src", "raise SystemExit('unknown architecture')\n"))
    with pytest.raises(LlamaCppError, match="unknown architecture") as info:
        convert(tools, tmp_path, tmp_path / "out.gguf")
    assert "draftsmith[llamacpp]" not in str(info.value)
