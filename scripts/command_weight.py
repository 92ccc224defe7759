"""How much of commands/ is more than flags and printing: lines of code outside each command module's
add_arguments and main (blank lines, comments and docstrings not counted).

    python scripts/command_weight.py        # per file, then the total
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

COMMANDS = Path(__file__).resolve().parent.parent / "draftsmith" / "commands"
KEPT = ("add_arguments", "main")  # what a command module is for


def code_lines(text: str) -> set[int]:
    """Line numbers that hold code (no blank lines, comments or docstrings)."""
    lines = set()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - docstrings


def weight(path: Path) -> int:
    text = path.read_text()
    kept = set()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in KEPT:
            kept.update(range(node.lineno, node.end_lineno + 1))
    return len(code_lines(text) - kept)


def main() -> int:
    total = 0
    for path in sorted(COMMANDS.glob("*.py")):
        n = weight(path)
        total += n
        print(f"{n:5d}  {path.name}")
    print(f"{total:5d}  total outside add_arguments and main")
    return 0


if __name__ == "__main__":
    sys.exit(main())
