"""Write draftsmith/export/sglang/cli_flags.py: every option string SGLang's server parser registers, read from a
SGLang wheel's source without importing it (its imports need a GPU stack). `draftsmith doctor` resolves a command's
flags against this list as SGLang's own parser does: SGLang builds a stdlib argparse.ArgumentParser (allow_abbrev on),
so a unique prefix of an option is that option, and a prefix of two or more is refused as ambiguous.

    python -m pip download --no-deps sglang==0.5.23 -d /tmp/sgl
    python scripts/sglang_cli_flags.py /tmp/sgl/sglang-0.5.23-*.whl > draftsmith/export/sglang/cli_flags.py

Read: the fields of srt/arg_groups/fields/*.py and srt/server_args.py annotated `A[T, "help"]` or `A[T, Arg(...)]`
(the option is `--` + the field name with '-' for '_', or Arg's cli_name, plus Arg's aliases; no_cli fields have
none; a BooleanOptionalAction adds `--no-NAME`), and the literal option strings of every `parser.add_argument(...)`
in those files (srt/arg_groups/arg_utils.py add_cli_args_from_dataclass, srt/server_args.py add_cli_args).
"""
from __future__ import annotations

import ast
import re
import sys
import zipfile


def annotated_options(node: ast.AnnAssign) -> list[str]:
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) in ("A", "Annotated")):
        return []
    parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    if len(parts) < 2:
        return []
    meta, cli, aliases, boolean = parts[1], "--" + node.target.id.replace("_", "-"), [], False
    if isinstance(meta, ast.Call):
        for kw in meta.keywords:
            if kw.arg == "no_cli" and ast.literal_eval(kw.value):
                return []
            if kw.arg == "cli_name":
                cli = ast.literal_eval(kw.value)
            elif kw.arg == "aliases":
                aliases = list(ast.literal_eval(kw.value))
            elif kw.arg == "action":
                boolean = "BooleanOptional" in ast.unparse(kw.value)
    return [cli, *aliases, *(["--no-" + cli[2:]] if boolean else [])]


def options(sources: list[str]) -> set[str]:
    found = set()
    for text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.update(annotated_options(node))
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                found.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                             and a.value.startswith("-"))
    return found


def main(wheel: str) -> None:
    version = re.search(r"sglang-([0-9.]+)-", wheel).group(1)
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n == "sglang/srt/server_args.py"
                 or re.fullmatch(r"sglang/srt/arg_groups/fields/\w+\.py", n)]
        found = sorted(options([z.read(n).decode() for n in names]))
    print(f'"""Every option string the SGLang {version} server parser registers (python -m sglang.launch_server), '
          'written by\n`python scripts/sglang_cli_flags.py sglang-WHEEL` from the wheel\'s source; read by '
          'export/sglang/doctor.py."""\n')
    print(f'SGLANG_VERSION = "{version}"')
    print("OPTIONS = frozenset(\"\"\"")
    line = ""
    for name in found:
        if len(line) + len(name) + 1 > 116:
            print(line.rstrip())
            line = ""
        line += name + " "
    print(line.rstrip())
    print("\"\"\".split())")


if __name__ == "__main__":
    main(sys.argv[1])
