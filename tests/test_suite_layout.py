"""The suite's own layout: test helpers live in tests/helpers/, so no module imports a test module (tests/test_*.py)
or tests/conftest.py (pytest's fixture file, not a library). Imports are read with ast, at module level and inside
functions, as tests/test_imports.py reads the package's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def imported_test_modules(source: str) -> set[str]:
    """The test modules (tests.test_*, tests.conftest; bare test_* and conftest, as with tests/ itself on sys.path)
    that `source` imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + ([f"{node.module}.{alias.name}" for alias in node.names]
                                     if node.module == "tests" else [])
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests":
                parts = parts[1:]
            if parts and (parts[0].startswith("test_") or parts[0] == "conftest"):
                found.add(f"tests.{parts[0]}")
    return found


def imports_of_test_modules() -> set[tuple[str, str]]:
    """(file, the test module it imports) for every Python file under tests/ and benchmarks/."""
    return {(path.relative_to(ROOT).as_posix(), module)
            for folder in (TESTS, ROOT / "benchmarks") for path in sorted(folder.rglob("*.py"))
            for module in imported_test_modules(path.read_text(encoding="utf-8"))}


def test_no_module_imports_a_test_module():
    assert (TESTS / "helpers" / "__init__.py").is_file() and (TESTS / "helpers" / "launches.py").is_file()
    imports = sorted(imports_of_test_modules())
    assert not imports, "helpers belong in tests/helpers/, fixtures in tests/conftest.py:\n" + "\n".join(
        f"{path} imports {module}" for path, module in imports)


def test_the_reader_finds_each_way_of_importing_a_test_module():
    # (the package named through {t}, so that a grep of the suite for such imports finds none here)
    source = """
from {t}.test_resume import start_training
from {t} import test_distributed, helpers
import {t}.test_kills
from {t}.conftest import RECIPES
def f():
    from test_serve import serving
    import conftest
from {t}.helpers import run_cli
from {t}.helpers.launches import step_losses
import testing, tests_extra
""".format(t="tests")
    assert imported_test_modules(source) == {"tests.test_resume", "tests.test_distributed", "tests.test_kills",
                                             "tests.conftest", "tests.test_serve"}
