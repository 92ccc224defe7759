"""Nothing outside heads/ spells a drafter kind's name (issue 31, item 3): code asks the kind's class
(heads/base.py: is_draft_model, drafts_block, ...) or heads' constants (DEFAULT_KIND) instead.
Docstrings and registry names (`X.register("name")`) are not code that switches on a kind."""
from __future__ import annotations

import ast

from draftsmith.heads import DRAFTERS
from tests.conftest import REPO

PKG = REPO / "draftsmith"
SKIPPED = ("heads",)  # each kind's own file names itself


def _not_code(tree: ast.AST) -> set[int]:
    """ids of docstring constants and of the arguments of `<registry>.register(...)` calls."""
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register":
            skip.update(id(a) for a in node.args)
    return skip


def kind_literals(files, root=REPO) -> list[tuple[str, int, str]]:
    """(file relative to root, line, name) of each kind name written as a string in code."""
    kinds = set(DRAFTERS.names())
    found = []
    for file in files:
        tree = ast.parse(file.read_text())
        skip = _not_code(tree)
        found += [(str(file.relative_to(root)), n.lineno, n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in kinds and id(n) not in skip]
    return found


def test_the_scan_finds_a_kind_name_in_code(tmp_path):
    (tmp_path / "m.py").write_text('"""eagle3 in a docstring"""\nX.register("medusa")\nif kind == "eagle3":\n    pass\n')
    assert kind_literals([tmp_path / "m.py"], tmp_path) == [("m.py", 3, "eagle3")]


def test_no_kind_names_outside_heads():
    files = [f for f in sorted(PKG.rglob("*.py")) if f.relative_to(PKG).parts[0] not in SKIPPED]
    found = kind_literals(files)
    assert not found, f"kind names spelt outside heads/ (ask the kind's class or a heads constant): {found}"
