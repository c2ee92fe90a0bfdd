"""The suite's own layout: unit tests mirror the package (tests/unit/<stage>/), whole commands, processes, kills,
Docker, the browser and the docs sit apart (tests/e2e/), and test helpers live in tests/helpers/, so no module imports
a test module (test_*.py) or a conftest.py (pytest's fixture file, not a library). Imports are read with ast, at
module level and inside functions, as tests/unit/test_imports.py reads the package's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def imported_test_modules(source: str) -> set[str]:
    """The test modules (test_* and conftest, at any depth of tests/, or bare as with a test folder on sys.path)
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
            for depth, part in enumerate(parts):
                if part.startswith("test_") or part == "conftest":
                    found.add(".".join(["tests", *parts[:depth + 1]]))
                    break
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
from {t}.unit.runs.test_report import ARTIFACTS
import testing, tests_extra
""".format(t="tests")
    assert imported_test_modules(source) == {"tests.test_resume", "tests.test_distributed", "tests.test_kills",
                                             "tests.conftest", "tests.test_serve", "tests.unit.runs.test_report"}


# The suite's own checks, at the top of tests/: they are about the suite, not a stage of the package.
SUITE = {"test_suite.py", "test_suite_layout.py"}


def test_unit_tests_mirror_the_package_and_the_rest_sit_in_e2e():
    """Each test module is in tests/unit/ (a folder named after a stage of the package: hftoolkit/<stage>/), in
    tests/e2e/, or one of the suite's own checks; a module anywhere else fails here."""
    package = {p.name for p in (ROOT / "hftoolkit").iterdir() if (p / "__init__.py").is_file()}
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        where = path.relative_to(TESTS).parts
        if where[0] == "unit":
            ok = len(where) == 2 or (len(where) == 3 and where[1] in package)
        else:
            ok = where[0] == "e2e" and len(where) == 2 or len(where) == 1 and where[0] in SUITE
        if not ok:
            misplaced.append(path.relative_to(ROOT).as_posix())
    assert not misplaced, ("test modules belong in tests/unit/<stage>/ (a stage of hftoolkit/) or tests/e2e/:\n"
                           + "\n".join(misplaced))
    assert {p.name for p in (TESTS / "unit").iterdir() if p.is_dir() and p.name != "__pycache__"} <= package
