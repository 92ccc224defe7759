"""The runtime dependencies pyproject.toml declares are exactly the third-party packages that
draftsmith imports (module level or inside functions), issue 11 item 21."""
from __future__ import annotations

import ast
import re
import sys

import pytest

from tests.conftest import REPO

tomllib = pytest.importorskip("tomllib")

# Distributions whose import name differs from their normalized distribution name.
IMPORT_NAME = {"pyyaml": "yaml", "pillow": "PIL"}
# Declared distributions that draftsmith reaches only through another package's module: that
# module must really be imported (the test checks), or the dependency is dead.
REACHED_THROUGH = {"tensorboard": "torch.utils.tensorboard"}


def declared() -> set[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].strip().lower().replace("-", "_") for d in deps}


def imported_modules() -> dict[str, list[str]]:
    """Every absolute module name imported anywhere in draftsmith/ -> files that import it."""
    found: dict[str, list[str]] = {}
    for file in sorted((REPO / "draftsmith").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                found.setdefault(name, []).append(str(file.relative_to(REPO)))
    return found


def third_party(modules) -> set[str]:
    tops = {m.split(".")[0] for m in modules}
    return {t for t in tops if t not in sys.stdlib_module_names and t not in ("draftsmith", "__future__")}


def test_declared_and_imported_dependencies_agree():
    modules = imported_modules()
    deps = declared()
    for dist, module in REACHED_THROUGH.items():
        assert dist in deps, f"{dist} is listed in REACHED_THROUGH but not declared"
        assert module in modules, f"{dist} is declared for {module}, which draftsmith no longer imports: drop it"
    want = {IMPORT_NAME.get(d, d) for d in deps - set(REACHED_THROUGH)}
    have = third_party(modules)
    assert not have - want, f"imported but not declared in pyproject.toml: {sorted(have - want)}"
    assert not want - have, f"declared in pyproject.toml but never imported by draftsmith: {sorted(want - have)}"


def test_no_distribution_is_declared_twice():
    """Issue 44: gguf was declared as ==0.19.0 and as >=0.19 (the set above hid the second)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].strip().lower().replace("-", "_") for d in deps]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_the_check_sees_imports_inside_functions():
    modules = imported_modules()
    assert "datasets" in modules and "torch.utils.tensorboard" in modules  # both are function-level imports
    assert "accelerate" not in third_party(modules)


def test_the_llamacpp_extra_is_what_the_install_script_installs():
    """Issue 34: the converter's Python needs are declared (`pip install 'draftsmith[llamacpp]'`), and
    scripts/install_llama_cpp.sh installs the same pins into the Python it runs under."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["llamacpp"]
    script = (REPO / "scripts" / "install_llama_cpp.sh").read_text()
    gguf = re.search(r'GGUF_VERSION="\$\{GGUF_VERSION:-([^}]+)\}"', script).group(1)
    line = next(line for line in script.splitlines() if "-m pip install" in line)
    installed = [spec.replace("$GGUF_VERSION", gguf) for spec in re.findall(r'"([^"]*)"', line)
                 if spec != "$PYTHON"]
    assert sorted(installed) == sorted(extra) and "sentencepiece" in " ".join(extra)
    assert re.search(r'pip install .*"\.\[dev,llamacpp\]"', (REPO / ".ci" / "run").read_text())  # CI installs it
