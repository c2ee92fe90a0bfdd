"""Small facts stated once: the package's code writes the ignore index and the bytes in a GiB in one module each,
and every other module imports them (comments and docstrings may say the number)."""

from __future__ import annotations

import ast

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "hftoolkit"


def _is(node: ast.AST, value: int) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and node.operand.value == -value
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == value


def _gib(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and _is(node.left, 2) and _is(node.right, 30)


@pytest.mark.parametrize("fact, found, homes", [
    # hftoolkit/reference/ stands apart from the toolkit (it imports none of it), so it keeps its own copy.
    ("the ignore index, -100", lambda node: _is(node, -100), {"sources/labels.py", "reference/objectives.py"}),
    ("a GiB, 2**30", _gib, {"base/console.py"}),
])
def test_a_fact_is_written_in_its_home_only(fact, found, homes):
    written = sorted(f"{path.relative_to(PACKAGE)}:{node.lineno}" for path in PACKAGE.rglob("*.py")
                     for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if found(node))
    assert {place.split(":")[0] for place in written} == homes, f"{fact} written outside {homes}: {written}"
