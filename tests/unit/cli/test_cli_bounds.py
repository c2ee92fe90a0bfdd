"""Every numeric option of the CLI has a range, and a value outside it is refused in one line before any work.
(Ports' upper bound is a callback's, so --help shows no "<=": tests/unit/cli/test_cli_help.py.)"""

from __future__ import annotations

import pytest

from tests.helpers import RECIPES, run_cli

# predict's generation options are checked by the recipe's eval.generation schema (all problems at once, named by
# their recipe key): tests/unit/workflows/test_predict_cli.py.
SCHEMA_CHECKED = {("predict", "--num-beams"), ("predict", "--max-new-tokens"), ("predict", "--temperature"),
                  ("predict", "--top-k"), ("predict", "--top-p")}
PORTS = {("serve", "--port"), ("train", "--main-process-port")}


def numeric_options():
    """(command, option, min, max) for every int or float option of every command."""
    import typer

    from hftoolkit.cli.app import app

    found = []
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            descriptor = getattr(param, "type_descriptor", None)
            annotation = str(getattr(descriptor, "annotation", ""))
            if param.param_type_name == "option" and ("int" in annotation or "float" in annotation):
                found.append((name, param.opts[0], param.min, param.max))
    return found


def test_every_numeric_option_has_a_range():
    options = numeric_options()
    assert {(c, o) for c, o, *_ in options} >= PORTS | SCHEMA_CHECKED, "the walk must see the options it checks"
    unbounded = [(c, o) for c, o, low, _ in options if low is None and (c, o) not in SCHEMA_CHECKED | {
        ("plan", "--gpu-memory")}]  # (--gpu-memory: refused in plan's own sentence, below)
    assert not unbounded, f"numeric options without a lower bound: {unbounded}"


@pytest.mark.parametrize("args", [("serve", "{run}", "--port", "70000"),
                                  ("serve", "{run}", "--port", "65536"),
                                  ("serve", "{run}", "--port", "-1"),
                                  ("train", "{recipe}", "--main-process-port", "70000"),
                                  ("train", "{recipe}", "--num-processes", "0"),
                                  ("serve", "{run}", "--max-batch", "0"),
                                  ("plan", "{recipe}", "--gpu-memory", "-3")])
def test_a_value_out_of_range_is_refused_in_one_line_naming_the_option(args, tmp_path):
    args = [a.format(run=tmp_path, recipe=RECIPES / "encoder-classification.yaml") for a in args]
    result = run_cli(*args, expect=None)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "Error" in line]
    assert len(errors) == 1 and args[2] in errors[0], result.output
    assert not (tmp_path / "runs").exists() and not list(tmp_path.iterdir()), "nothing written"
