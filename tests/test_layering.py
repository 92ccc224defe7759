"""Layering (issue 11, item 21): eval and export never load the training code, and draftsmith's
subpackages and top-level modules import each other without cycles."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.helpers import load_repo_module

PKG = REPO / "draftsmith"


def test_eval_and_export_do_not_import_training():
    code = ("import json, sys; import draftsmith.commands.eval, draftsmith.export.api, draftsmith.checkpoint; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'draftsmith.train' or m.startswith('draftsmith.train.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _unit(module: str) -> str | None:
    """draftsmith.eval.loop -> eval; draftsmith.config -> config; draftsmith -> None (the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "draftsmith" else None


def import_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit: ["file:line", ...]}; a unit is a subpackage (heads, eval, ...) or a top-level module."""
    graph: dict[str, dict[str, list[str]]] = {}
    tool = _graph_tool()
    for file in sorted(PKG.rglob("*.py")):
        rel = file.relative_to(PKG.parent)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        src = _unit(module)
        if src is None:
            continue
        for name, line in tool.imports(file):  # scripts/import_graph.py reads the imports (lazy ones too)
            dst = _unit(name)
            if dst is not None and dst != src:
                graph.setdefault(src, {}).setdefault(dst, []).append(f"{rel}:{line}")
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected groups of more than one unit: scripts/import_graph.py's finder (Tarjan)."""
    return _graph_tool().cycles(graph)


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}, "d": {"a": ["w"]}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": ["x"]}, "b": {}}) == []


def test_no_import_cycles_between_subpackages():
    graph = import_graph()
    assert "eval" in graph and "heads" in graph.get("eval", {})  # the graph sees real edges
    found = cycles(graph)
    detail = [{u: {v: graph[u][v][:3] for v in comp if v in graph.get(u, {})} for u in comp} for comp in found]
    assert not found, f"import cycles between draftsmith's subpackages/modules: {detail}"


# --------------------------------------------------------------------------- file level (issue 18)

def _graph_tool():
    """scripts/import_graph.py: the file-level import graph (imports inside functions included)."""
    return load_repo_module("scripts/import_graph.py")


def command_modules() -> set[str]:
    """The modules behind `draftsmith COMMAND` (cli.SUBCOMMANDS), the cli itself and __main__."""
    from draftsmith.cli import SUBCOMMANDS

    return {module for module, _ in SUBCOMMANDS.values()} | {"draftsmith.cli", "draftsmith.__main__"}


def test_file_graph_tool_sees_lazy_imports_and_circles():
    tool = _graph_tool()
    graph = tool.file_graph()
    assert "draftsmith.eval.tree" in graph["draftsmith.eval.loop"]  # a module-level import
    assert "draftsmith.data.hf_tokenize" in graph["draftsmith.data.dataset"]  # an import inside a function
    assert tool.cycles({"a": {"b": []}, "b": {"a": []}, "c": {}}) == [["a", "b"]]
    assert tool.floors({"a": {"b": []}, "b": {"c": []}, "c": {}}) == {"a": 2, "b": 1, "c": 0}


def test_no_import_circles_between_files():
    """eval/loop <-> eval/tree, data/dataset <-> data/hf_tokenize, data/formats <-> data/hf_sources and the
    registries (heads/__init__ <-> kind files, export/__init__ <-> exporters) were circles hidden by lazy imports."""
    tool = _graph_tool()
    graph = tool.file_graph()
    found = tool.cycles(graph)
    detail = [{u: {v: graph[u][v][:2] for v in comp if v in graph[u]} for u in comp} for comp in found]
    assert not found, f"import circles between draftsmith's files: {detail}"


def test_the_library_never_imports_a_command_module():
    commands = command_modules()
    graph = _graph_tool().file_graph()
    bad = {f"{src} -> {dst}": where[:2] for src, edges in graph.items() if src not in commands
           for dst, where in edges.items() if dst in commands}
    assert not bad, f"library modules importing command modules (move the function into the library): {bad}"


# train/, eval/ and export/ stand side by side on the core; the one arrow between them, and why.
ALLOWED_BETWEEN_STAGES = {
    # train.init_from warm-starts from an export directory through that format's own re-import (load_back)
    ("draftsmith.train.checkpoint", "draftsmith.export"),
    # train.workload_eval measures the drafter on the contexts draftsmith's loop will see: the workload's prompts as
    # `draftsmith eval` reads and encodes them, answered by the loop itself with no drafter (a copy could drift)
    ("draftsmith.train.workload_eval", "draftsmith.eval.workloads"),
    ("draftsmith.train.workload_eval", "draftsmith.eval.loop"),
}


def test_train_eval_and_export_stand_side_by_side():
    commands = command_modules()
    stages = ("train", "eval", "export")
    graph = _graph_tool().file_graph()
    crossing = {}
    for src, edges in graph.items():
        a = _unit(src)
        if src in commands or a not in stages:
            continue
        for dst, where in edges.items():
            b = _unit(dst)
            if b in stages and b != a and (src, dst) not in ALLOWED_BETWEEN_STAGES:
                crossing[f"{src} -> {dst}"] = where[:2]
    assert not crossing, f"train/, eval/ and export/ import each other: {crossing}"


ENGINE_FOLDERS = ("vllm", "sglang", "trtllm", "llamacpp")


def _engine_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "export" and parts[2] in ENGINE_FOLDERS else None


def test_no_engine_folder_imports_another():
    """export/ is one folder per engine; what two engines share lives beside the folders (layout.py, speculators.py,
    eagle_tensors.py, doctor/), never in one engine's folder for another to import."""
    graph = _graph_tool().file_graph()
    crossing = {f"{src} -> {dst}": where[:2] for src, edges in graph.items() for dst, where in edges.items()
                if _engine_of(src) and _engine_of(dst) and _engine_of(src) != _engine_of(dst)}
    assert not crossing, f"engine folders importing each other: {crossing}"
    assert {_engine_of(m) for m in graph} >= set(ENGINE_FOLDERS), "an engine folder is missing from the graph"


def test_export_top_level_stays_small():
    from pathlib import Path

    top = Path(__file__).resolve().parent.parent / "draftsmith" / "export"
    modules = sorted(p.name for p in top.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 10, f"export/ holds {len(modules)} modules beside its folders: {modules}"
