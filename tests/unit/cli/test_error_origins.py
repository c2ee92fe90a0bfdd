"""Every refusal names where the problem came from, in one line, before any model loads: a `--set` typo is blamed
on the option, not the recipe file, and a run folder misspelt gets one sentence from every command that takes one
(runs/rundir.run_folder_problem)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import RECIPES, no_model_loads, plain, run_cli
from tests.helpers.inputs import weightless_run

ENCODER = RECIPES / "encoder-classification.yaml"
TYPO = "trainng.epochs=1"


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


# ---------------------------------------------------------------- --set


@pytest.mark.parametrize("command", ["train", "eval", "plan", "validate"])
def test_a_set_typo_is_blamed_on_the_option_with_the_close_key(command, monkeypatch):
    no_model_loads(monkeypatch)
    result = run_cli(command, ENCODER, "--set", TYPO, expect=2)
    assert error_lines(result) == [f"Error: --set {TYPO}: trainng: unknown key: did you mean 'training'?"]
    assert not Path("runs").exists(), "nothing written"


@pytest.mark.parametrize("command", ["sweep", "bench"])
def test_a_set_typo_is_blamed_on_the_option_by_the_commands_that_train_many(command, monkeypatch):
    no_model_loads(monkeypatch)
    args = [ENCODER, "--grid", "training.learning_rate=0.01,0.02"] if command == "sweep" else []
    result = run_cli(command, *args, "--set", TYPO, expect=2)
    assert f"--set {TYPO}: trainng: unknown key: did you mean 'training'?" in plain(result.output)
    assert "encoder-classification.yaml: trainng" not in result.output


def test_a_key_the_file_holds_keeps_the_file_name_though_a_set_reaches_into_it(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(ENCODER.read_text() + "trainng:\n  epochs: 2\n")
    result = run_cli("validate", recipe, "--set", TYPO, expect=2)
    assert error_lines(result) == [f"Error: {recipe}: trainng: unknown key: did you mean 'training'?"]


@pytest.mark.parametrize("item, line", [
    ("training.epohcs=1", "training.epohcs: unknown key: did you mean 'epochs'?"),
    ("eval.early_stopping.patiense=2", "eval.early_stopping.patiense: unknown key: did you mean 'patience'?"),
    ("eval.generaton.num_beams=2", "eval.generaton: unknown key: did you mean 'generation'?"),
    ("training.epochs=many", "training.epochs: input should be a valid number"),
])
def test_a_set_problem_at_any_depth_names_the_option_and_the_close_key(item, line):
    result = run_cli("validate", ENCODER, "--set", item, expect=2)
    assert plain(result.output).startswith(f"Error: --set {item}: {line}"), result.output


# ---------------------------------------------------------------- run folders

MISSPELT = "runs/encoder-clasification"
SAID = (f"Error: {MISSPELT}: no such run folder: did you mean runs/encoder-classification? "
        "(hftoolkit runs lists them)")

# Every command that takes a run folder, given the misspelt one (each with the options it needs to get that far).
COMMANDS = {
    "eval": ["eval", MISSPELT],
    "predict": ["predict", MISSPELT, "--input", "a fine film"],
    "serve": ["serve", MISSPELT],
    "compare": ["compare", MISSPELT, "--output", "report"],
    "export": ["export", MISSPELT, "--format", "onnx", "--output", "exported"],
    "merge": ["merge", MISSPELT, "--output", "merged"],
    "push": ["push", MISSPELT, "--repo-id", "alice/x", "--dry-run"],
    "train --resume": ["train", "--resume", MISSPELT],
}


@pytest.fixture
def runs():
    """runs/encoder-classification in the test's working folder, where `hftoolkit runs` looks by default."""
    return weightless_run(Path("runs") / "encoder-classification")


@pytest.mark.parametrize("argv", COMMANDS.values(), ids=COMMANDS.keys())
def test_every_command_that_takes_a_run_folder_says_one_sentence_for_a_misspelt_one(argv, runs, monkeypatch):
    no_model_loads(monkeypatch)
    before = sorted(Path().rglob("*"))
    result = run_cli(*argv, expect=2)
    assert error_lines(result) == [SAID]
    assert sorted(Path().rglob("*")) == before, "nothing written"


@pytest.mark.parametrize("argv", [["predict", "runs", "--input", "x"], ["eval", "runs"], ["compare", "runs"]],
                         ids=lambda a: a[0])
def test_the_folder_of_the_runs_given_for_a_run_names_one_of_them(argv, runs, monkeypatch):
    no_model_loads(monkeypatch)
    result = run_cli(*argv, expect=2)
    needs = "manifest.json, metrics.json or log_history.jsonl" if argv[0] == "compare" else "recipe.yaml"
    assert error_lines(result) == [f"Error: runs: not a run folder (no {needs}): it holds runs: pass one of them, "
                                   "such as runs/encoder-classification (hftoolkit runs lists them)"]


def test_a_folder_that_is_no_run_says_what_it_lacks_and_where_runs_are_listed(tmp_path, monkeypatch):
    no_model_loads(monkeypatch)
    (tmp_path / "notes").mkdir()
    result = run_cli("predict", tmp_path / "notes", "--input", "x", expect=2)
    assert error_lines(result) == [f"Error: {tmp_path / 'notes'}: not a run folder (no recipe.yaml): pass a folder "
                                   f"written by hftoolkit train or hftoolkit merge (hftoolkit runs {tmp_path} lists "
                                   "them)"]


def test_eval_of_a_missing_yaml_keeps_the_recipe_wording_and_a_folder_like_path_gets_the_run_folder(runs):
    recipe = run_cli("eval", "encoder-clasification.yaml", expect=2)
    assert error_lines(recipe) == ["Error: encoder-clasification.yaml: recipe file not found: did you mean "
                                   "'encoder-classification'? check the path, or name a shipped recipe (`hftoolkit "
                                   "recipes` lists them)"]
    shipped = run_cli("eval", "encoder-clasification", expect=2)  # (no runs beside it: a shipped recipe's name)
    assert "recipe file not found: did you mean 'encoder-classification'?" in plain(shipped.output)
    assert error_lines(run_cli("eval", MISSPELT, expect=2)) == [SAID]
