"""Where the package branches on a task's name or its scoring kind (issue 58: a task kind is to become one module, and
no stage outside it to ask which task it runs). Until the task modules exist, the sites left are counted per module:
a new branch fails here, and a module that sheds some must lower its count, so the list only shrinks."""

from __future__ import annotations

import ast
from collections import Counter

from tests.helpers import ROOT

PACKAGE = ROOT / "hftoolkit"
# The table of tasks itself, where every fact about a task is stated.
HOME = "hftoolkit/config/tasks.py"
# The branches left, per module (2026-12-08: 63 in 22 modules).
LEFT = {
    "hftoolkit/exports/onnx.py": 8, "hftoolkit/evaluation/evaluate.py": 7, "hftoolkit/config/recipe.py": 6,
    "hftoolkit/job/preflight.py": 6, "hftoolkit/sources/data.py": 6, "hftoolkit/workflows/predict.py": 6,
    "hftoolkit/planning/timing.py": 5, "hftoolkit/planning/model.py": 3, "hftoolkit/serving/api.py": 2,
    "hftoolkit/serving/registry.py": 2, "hftoolkit/config/families.py": 1, "hftoolkit/exports/gguf.py": 1,
    "hftoolkit/job/hardware.py": 1, "hftoolkit/job/resolve.py": 1, "hftoolkit/models/families/decoder.py": 1,
    "hftoolkit/sources/labels.py": 1, "hftoolkit/training/arguments.py": 1,
    "hftoolkit/training/eval_during_training.py": 1, "hftoolkit/training/frozen_weights.py": 1,
    "hftoolkit/workflows/evaluate.py": 1, "hftoolkit/workflows/export.py": 1, "hftoolkit/workflows/reward_model.py": 1,
}


def _names_a_task(node: ast.AST) -> bool:
    """`tasks.GRPO`, `spec.scoring`, or a tuple, list or set holding one."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_task(element) for element in node.elts)
    if not isinstance(node, ast.Attribute):
        return False
    return node.attr == "scoring" or (isinstance(node.value, ast.Name) and node.value.id == "tasks"
                                      and node.attr.isupper())


def branches(source: str) -> int:
    """The comparisons in `source` with a task's name or a scoring kind on one side."""
    return sum(isinstance(node, ast.Compare) and any(map(_names_a_task, [node.left, *node.comparators]))
               for node in ast.walk(ast.parse(source)))


def test_the_counter_sees_each_form_of_branch():
    assert branches("if recipe.task == tasks.GRPO: pass") == 1
    assert branches("x = task in (tasks.MLM, tasks.DENOISE)") == 1
    assert branches("ok = spec.scoring not in TRL_SCORINGS") == 1
    assert branches("ok = tasks.spec(task).trainer is None") == 0


def test_no_module_branches_on_a_task_more_than_it_did():
    found = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where != HOME:
            found[where] = branches(path.read_text(encoding="utf-8"))
    grown = {where: f"{count} (was {LEFT.get(where, 0)})" for where, count in found.items()
             if count > LEFT.get(where, 0)}
    assert not grown, ("a new branch on a task's name or scoring kind: put what differs in the task's own facts "
                       f"(config/tasks.py) instead: {grown}")
    shrunk = {where: f"{found[where]} (was {count})" for where, count in LEFT.items() if found[where] < count}
    assert not shrunk, f"fewer branches than LEFT says: lower its count here: {shrunk}"
