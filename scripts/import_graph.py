"""Draw draftsmith's import graph at file level: floors (a module stands one floor above the
highest module it imports) and circles (strongly connected groups of files), counting imports
inside functions too (a lazy import still ties two files together).

    python scripts/import_graph.py            # floors, circles, the longest chain
    python scripts/import_graph.py --edges    # also every edge, "a -> b"

tests/test_layering.py checks the same graph (no circles; the library never imports a
command module; train/, eval/ and export/ never import each other).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "draftsmith"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_name(file: Path) -> str:
    rel = file.relative_to(PKG.parent)
    return ".".join(rel.with_suffix("").parts).removesuffix(".__init__")


def imports(file: Path):
    """(imported draftsmith module, line) for every import in `file`, module level and in functions;
    `if TYPE_CHECKING:` blocks never run and are skipped. `from a import b` names module a.b when b is one."""
    module, is_init = module_name(file), file.name == "__init__.py"
    stack = [ast.parse(file.read_text(), str(file))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_init else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            subs = []
            for alias in node.names:
                sub = PKG.parent / (name + "." + alias.name).replace(".", "/")
                if sub.with_suffix(".py").exists() or sub.is_dir():
                    subs.append(f"{name}.{alias.name}")
            if len(subs) < len(node.names):  # some names are attributes of `name` itself
                yield name, node.lineno
            for s in subs:
                yield s, node.lineno
        stack.extend(ast.iter_child_nodes(node))


def file_graph() -> dict[str, dict[str, list[str]]]:
    """module -> {imported module: ["file:line", ...]} over draftsmith's files (packages as their __init__).
    Importing a.b.c also runs a.b's __init__, but that edge is the package's, not the file's: it is not drawn."""
    files = {module_name(f): f for f in sorted(PKG.rglob("*.py"))}
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in files}
    for mod, file in files.items():
        for name, line in imports(file):
            while name and name not in files:
                name = name.rpartition(".")[0]  # an attribute import: the module that holds it
            if name and name != mod and name.startswith("draftsmith"):
                graph[mod].setdefault(name, []).append(f"{file.relative_to(PKG.parent)}:{line}")
    return graph


def cycles(graph: dict[str, dict]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(set(graph) | {w for e in graph.values() for w in e}):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def floors(graph: dict[str, dict]) -> dict[str, int]:
    """Floor of each module: 0 for one that imports nothing of draftsmith, else 1 + the highest floor it
    imports; the members of a circle share one floor (the circle is collapsed first)."""
    group = {}
    for comp in cycles(graph):
        for m in comp:
            group[m] = comp[0]
    node = lambda m: group.get(m, m)  # noqa: E731
    dag: dict[str, set[str]] = {}
    for m, edges in graph.items():
        dag.setdefault(node(m), set()).update(node(w) for w in edges if node(w) != node(m))
    memo: dict[str, int] = {}

    def floor(n: str) -> int:
        if n not in memo:
            memo[n] = 0
            memo[n] = 1 + max((floor(w) for w in dag.get(n, ())), default=-1)
        return memo[n]

    return {m: floor(node(m)) for m in graph}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edges", action="store_true")
    args = p.parse_args(argv)
    graph = file_graph()
    fl = floors(graph)
    found = cycles(graph)
    print(f"files {len(graph)}, import edges {sum(len(e) for e in graph.values())}, floors {max(fl.values()) + 1}, "
          f"circles {len(found)}")
    for comp in found:
        print("  circle: " + " <-> ".join(comp))
    for level in range(max(fl.values()) + 1):
        print(f"  floor {level}: " + ", ".join(sorted(m.removeprefix("draftsmith.") for m, f in fl.items() if f == level)))
    if args.edges:
        for m in sorted(graph):
            for w in sorted(graph[m]):
                print(f"{m} -> {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
