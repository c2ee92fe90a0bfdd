"""The package's import graph has no cycles: each module's imports, at module level, inside functions (which run
too) and under `if TYPE_CHECKING:` (a reader and a type checker follow them), point one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "hftoolkit"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The hftoolkit modules `path` imports (a `from package import submodule` counts as the submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py") if "metrics" not in p.relative_to(PACKAGE).parts[:-1]
             or p.parent == PACKAGE / "metrics"]  # the evaluate module scripts are loaded by evaluate, not imported
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) - {module_name(p)} for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.slow
def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert {"hftoolkit.runs.report_plots", "hftoolkit.models.families.encoder"} <= set(graph)  # the walk found them
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_modeling_does_not_import_data():
    assert "hftoolkit.sources.data" not in import_graph()["hftoolkit.models.loading"]


# The package by stage, lowest first: a module imports its own layer and those below it, never one above.
# `reference` stands apart: the course's mechanisms in plain torch, importing nothing of the toolkit.
LAYERS = ("base", "config", "metrics", "sources", "job", "patches", "models", "evaluation", "exports", "runs",
          "training", "planning", "workflows", "sweeps", "serving", "cli")


def layer_of(module: str) -> str:
    if module == "hftoolkit":
        return "base"
    if module == "hftoolkit.__main__":
        return "cli"
    return module.split(".")[1]


def test_each_layer_imports_only_itself_and_the_layers_below():
    graph = import_graph()
    assert {layer_of(m) for m in graph} == set(LAYERS) | {"reference"}  # every module sits in a known layer
    upward = [f"{m} ({layer_of(m)}) imports {i} ({layer_of(i)})" for m, imported in sorted(graph.items())
              for i in sorted(imported) if layer_of(m) != "reference" and layer_of(i) != "reference"
              and LAYERS.index(layer_of(i)) > LAYERS.index(layer_of(m))]
    assert not upward, "\n".join(upward)
    apart = [f"{m} imports {i}" for m, imported in graph.items() for i in imported
             if (layer_of(m) == "reference") != (layer_of(i) == "reference") and layer_of(m) == "reference"]
    assert not apart, "\n".join(apart)
