"""The package's docstrings and comments name only modules that exist: a dotted `hftoolkit.x.y` name, or a path
inside the package (`folder/module.py`, `folder/module.name`, `folder/module`, `folder/folder`), left behind by a
move fails here, with its file and line."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "hftoolkit"

DOTTED = re.compile(r"\bhftoolkit(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
# A relative path: folders, then a module or a folder (`training/strategies/zero.py`, `planning/plan.StrategyPlan`,
# `workflows/train`, `models/families`); checked where its first folder is one of the package's
# (`package_path_problem`), not where it names a run folder (`runs/encoder-reward`).
PATH = re.compile(r"(?<![\w./<>-])((?:[a-z_][a-z0-9_]*/)+[a-z_][a-z0-9_]*)(\.py\b|\.[A-Za-z_]\w*)?(?![\w-])")
# Another library's files, named after the library (`transformers (models/bert/modeling_bert.py, ...)`,
# `peft's tuners/lora/layer.py`): their folders may share a name with ours.
LIBRARIES = ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "evaluate", "deepspeed",
             "huggingface_hub", "bitsandbytes", "lm_eval", "optuna", "gguf", "onnx", "sacrebleu")
LIBRARY_BEFORE = re.compile(rf"\b(?:{'|'.join(LIBRARIES)})(?:'s?)?[\s(:]*(?:[\w/.]+\.py,\s*)*$")


def texts_of(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment in `path`."""
    source = path.read_text(encoding="utf-8")
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return found


def _names_defined(path: Path) -> set[str]:
    """The names a module binds outside its functions and classes: definitions, assignments, imports (under an `if`
    or a `try` too)."""
    names, todo = set(), list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(n for handler in getattr(node, "handlers", []) for n in handler.body)]
    return names


def dotted_problem(name: str) -> str | None:
    """Why the dotted `name` (hftoolkit.x.y...) names nothing in the package, or None. Its parts are followed down
    the package's folders and modules; the first that is neither must be a name the module (or the package's
    __init__.py) before it defines. What follows that is an attribute's attribute, not checked."""
    parts = name.split(".")[1:]
    here = PACKAGE
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
            continue
        if (here / f"{part}.py").is_file():
            module = here / f"{part}.py"
            rest = parts[i + 1:]
            if rest and rest[0] not in _names_defined(module):
                return f"{'.'.join(['hftoolkit', *parts[:i + 1]])} defines no {rest[0]}"
            return None
        if part not in _names_defined(here / "__init__.py"):
            return f"no module {'.'.join(['hftoolkit', *parts[:i + 1]])}"
        return None
    return None


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def package_path_problem(path: str, after: str | None, files: list[str], folders: set[str]) -> str | None:
    """Why `path` (a/b, then `after`: .py, .name or nothing) names nothing in the package, or None: a module
    (a/b.py) there, or with nothing after it a folder too, ending at any depth (`strategies/zero.py`). None too for
    a path that does not start at a folder of the package (another project's file)."""
    if path.startswith("hftoolkit/"):
        path = path.removeprefix("hftoolkit/")
    elif path.split("/")[0] not in folders:
        return None
    ends = (f"/{path}.py", f"/{path}/__init__.py") if after is None else (f"/{path}.py",)
    if any(f"/{f}".endswith(end) for f in files for end in ends):
        return None
    return f"no {'module or folder' if after is None else 'module'} {path} in hftoolkit/"


def stale_names() -> tuple[list[str], int]:
    """(a line per name that is not there, how many names were checked)."""
    files = [p.relative_to(PACKAGE).as_posix() for p in package_files()]
    folders = {p.name for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").is_file()}
    problems, checked = [], 0
    for path in package_files():
        where = path.relative_to(ROOT).as_posix()
        for line, text in texts_of(path):
            for match in DOTTED.finditer(text):
                checked += 1
                if why := dotted_problem(match.group()):
                    problems.append(f"{where}:{line}: {match.group()}: {why}")
            for match in PATH.finditer(text):
                if LIBRARY_BEFORE.search(text[:match.start()]):
                    continue
                checked += 1
                if why := package_path_problem(match.group(1), match.group(2), files, folders):
                    problems.append(f"{where}:{line}: {match.group()}: {why}")
    return problems, checked


def test_docstrings_and_comments_name_only_modules_that_exist():
    problems, checked = stale_names()
    assert checked > 100  # (the walk found the package's comments and docstrings)
    assert not problems, "docstrings and comments name modules that are not there:\n" + "\n".join(problems)


def _paths(text: str) -> list[str | None]:
    """What the check says of each path in `text` (None: found, or not a path of the package)."""
    files = [p.relative_to(PACKAGE).as_posix() for p in package_files()]
    folders = {"base", "training", "strategies", "workflows", "models", "runs"}
    return [package_path_problem(m.group(1), m.group(2), files, folders) for m in PATH.finditer(text)
            if not LIBRARY_BEFORE.search(text[:m.start()])]


def test_the_check_finds_a_moved_module_and_passes_a_real_one(tmp_path):
    # Real names pass: a package, a module, a module's function, a package's own name, paths at any depth.
    for name in ("hftoolkit.base", "hftoolkit.base.ranks", "hftoolkit.base.ranks.is_main_process",
                 "hftoolkit.training.strategies.STRATEGIES", "hftoolkit.training.launcher"):
        assert dotted_problem(name) is None, name
    assert _paths("training/strategies/zero.py, strategies/zero.py, hftoolkit/base/ranks.py, workflows/train, "
                  "models/families, base/lifecycle.first_reason, runs/encoder-reward") == [None] * 6
    # Another library's files, though their folders bear our names, are not the package's.
    assert _paths("utils/logging.py; DecoderLayer in transformers (models/bert/modeling_bert.py, "
                  "models/gpt2/modeling_gpt2.py); peft's tuners/lora/layer.py") == [None]
    # Moved or never there: each found.
    assert dotted_problem("hftoolkit.processes.die_with_parent") == "no module hftoolkit.processes"
    assert dotted_problem("hftoolkit.workflows.plan.StrategyPlan") == "no module hftoolkit.workflows.plan"
    assert dotted_problem("hftoolkit.base.ranks.no_such_reader") == "hftoolkit.base.ranks defines no no_such_reader"
    assert _paths("(workflows/plan.StrategyPlan), workflows/plan.py, base/processes") == [
        "no module workflows/plan in hftoolkit/", "no module workflows/plan in hftoolkit/",
        "no module or folder base/processes in hftoolkit/"]
    # Comments and docstrings are read; code and other strings are not.
    source = tmp_path / "m.py"
    source.write_text('"""Module: see hftoolkit.a.b."""\nX = "hftoolkit.c.d"  # and workflows/plan.py\n\n\n'
                      'def f():\n    """hftoolkit.e.f"""\n')
    assert sorted(t for _, t in texts_of(source)) == ["# and workflows/plan.py", "Module: see hftoolkit.a.b.",
                                                      "hftoolkit.e.f"]
