"""sweep --search's input: the space options parsed, and every bad input refused in one line each, all at once, with
nothing written (no sweep folder, no study.db): a range empty, inverted or log through 0, a key the recipe lacks,
a storage that can't be reached (its password hidden), more workers than the machine gives, a study stored with
another space."""

from __future__ import annotations

import os

import pytest

from hftoolkit.sweeps.space import parse_param, parse_space, yaml_float
from tests.helpers import RECIPES, needs, plain, run_cli

pytestmark = needs("optuna")

ENCODER = RECIPES / "encoder-classification.yaml"


def search(out, *args):
    return run_cli("sweep", ENCODER, "--search", "--out", out, "--set", "eval.every=2", *args, expect=2)


def problems(result) -> list[str]:
    """The refusal's lines (each problem one line, after `Error:` or as an item of the list)."""
    lines = [line.strip().removeprefix("Error:").strip() for line in result.output.splitlines()]
    return [line.removeprefix("- ") for line in lines if line.startswith(("--", "- --"))]


def test_ranges_and_choices_parse_to_what_a_trial_trains_with():
    space = parse_space(["training.learning_rate=float:1e-5:1e-3:log", "lora.r=int:4:32",
                         "lora.targets=choice:[query,value],[query,key,value]"], ENCODER, [])
    assert space.specs() == {"training.learning_rate": "float:1e-05:0.001:log", "lora.r": "int:4:32",
                             "lora.targets": "choice:[query,value],[query,key,value]"}
    assert space.overrides({"training.learning_rate": 1e-5, "lora.r": 8, "lora.targets": "[query,value]"}) == [
        "training.learning_rate=1.0e-05", "lora.r=8", "lora.targets=[query,value]"]
    assert space.grid() is None  # (a float range has no finite grid)
    assert parse_param("lora.r=int:4:6")[0].grid_values() == [4, 5, 6]


def test_a_float_is_written_as_yaml_reads_a_float():
    import yaml

    for value in (1e-5, 0.001, 3e-10, 2.5):
        assert yaml.safe_load(yaml_float(value)) == value


def test_every_bad_range_and_key_is_one_line_and_nothing_is_written(tmp_path):
    out = tmp_path / "sweeps"
    result = search(out, "--param", "lora.r=int:8:8", "--param", "lora.dropout=float:0.3:0.1",
                    "--param", "training.learning_rate=float:0:1e-3:log", "--param", "lora.rank=int:4:16")
    lines = problems(result)
    assert lines[:3] == [
        "--param lora.r=int:8:8: an empty range (8 to 8): give a LOW below HIGH, or fix the value with --set lora.r=8",
        "--param lora.dropout=float:0.3:0.1: an inverted range: LOW 0.3 is above HIGH 0.1: swap them",
        "--param training.learning_rate=float:0:1e-3:log: a log range must stay above 0, and LOW is 0.0: raise LOW "
        "above 0, or drop :log"], result.output
    assert len(lines) == 4, result.output
    assert lines[3].startswith("--param lora.rank=int:4:16: lora.rank: unknown key: "), result.output
    assert not out.exists()


def test_a_value_the_recipe_refuses_is_named_by_its_param(tmp_path):
    result = search(tmp_path / "sweeps", "--param", "lora.r=int:0:8")
    assert any(line.startswith("--param lora.r=int:0:8: lora.r:") for line in problems(result)), result.output


def test_an_unreachable_storage_is_named_with_its_password_hidden(tmp_path):
    out = tmp_path / "sweeps"
    result = search(out, "--param", "lora.r=int:4:8", "--storage", "postgresql://me:s3cret@127.0.0.1:9/studies")
    assert "s3cret" not in result.output
    line = plain(result.output)
    assert "--storage postgresql://me:***@127.0.0.1:9/studies: the database can't be reached (" in line, line
    assert not out.exists()


def test_more_workers_than_the_machine_gives_are_refused(tmp_path):
    cores = len(os.sched_getaffinity(0))
    result = search(tmp_path / "sweeps", "--param", "lora.r=int:4:8", "--workers", str(cores + 1))
    assert any(line.startswith(f"--workers {cores + 1}: this machine gives ") for line in problems(result)), \
        result.output
    assert not (tmp_path / "sweeps").exists()


def test_a_pruner_without_evals_during_training_and_a_grid_over_floats_are_refused(tmp_path):
    result = run_cli("sweep", ENCODER, "--search", "--out", tmp_path, "--pruner", "median", "--sampler", "grid",
                     "--param", "training.learning_rate=float:1e-4:1e-2", expect=2)
    lines = problems(result)
    assert any(line.startswith("--pruner median: a pruner reads the evals made during training, and eval.every is "
                               "none") for line in lines), result.output
    assert any(line.startswith("--sampler grid: training.learning_rate has no finite set of values")
               for line in lines), result.output


def test_a_study_stored_with_another_space_is_refused_and_left_as_it_was(tmp_path):
    from hftoolkit.sweeps import study as ss
    from hftoolkit.sweeps.space import parse_space

    folder = tmp_path / "encoder-classification"
    folder.mkdir()
    space = parse_space(["lora.r=int:4:8"], ENCODER, [])
    goal = ss.Objective("accuracy", "maximize")
    ss.open_study(ss.default_url(folder), "encoder-classification", space, goal,
                  ss.sampler("tpe", space, 0, None), ss.pruner("none", None), 5)
    before = sorted(p.name for p in folder.iterdir()), (folder / ss.STUDY_DB).stat().st_mtime_ns
    result = search(tmp_path, "--param", "lora.r=int:4:16")
    assert any(line.startswith("--param: study encoder-classification searches another space (lora.r: int:4:8 "
                               "there, int:4:16 here)") for line in problems(result)), result.output
    assert (sorted(p.name for p in folder.iterdir()), (folder / ss.STUDY_DB).stat().st_mtime_ns) == before


def test_a_study_another_worker_has_just_made_is_joined_and_one_with_others_trials_is_refused(tmp_path):
    """Machines that start together: one has made the study and not yet labelled it with its space when the other
    checks it. An empty, unlabelled study is joined and labelled; one holding trials of its own is someone else's;
    the label that stuck is what each worker is held to."""
    import optuna

    from hftoolkit.base.errors import UserError
    from hftoolkit.sweeps import study as ss

    folder = tmp_path / "encoder-classification"
    folder.mkdir()
    url, goal = ss.default_url(folder), ss.Objective("accuracy", "maximize")
    space = parse_space(["lora.r=int:4:8"], ENCODER, [])
    bare = optuna.create_study(storage=url, study_name="racing", direction="maximize")
    assert ss.mismatch(ss.stored_study(url, "racing"), space.specs(), goal) == []
    minimize = ss.Objective("loss", "minimize")
    assert ss.mismatch(bare, space.specs(), minimize) == [
        "--objective: study racing is to maximize, not minimize: pass an objective of that direction, or name a "
        "new --study"]

    def joined(searched):
        return ss.open_study(url, "racing", searched, goal, ss.sampler("random", searched, 0, None),
                             ss.pruner("none", None), 5)

    assert joined(space).user_attrs[ss.SPACE_ATTR] == {"lora.r": "int:4:8"}
    with pytest.raises(UserError, match=r"^--param: study racing searches another space \(lora.r: int:4:8 there, "
                                        r"int:4:16 here\)"):
        joined(parse_space(["lora.r=int:4:16"], ENCODER, []))

    two = optuna.create_study(storage=url, study_name="two", directions=["maximize", "minimize"])
    assert ss.mismatch(two, space.specs(), goal) == [
        "--objective: study two is to maximize and minimize, not maximize: pass an objective of that direction, or "
        "name a new --study"]

    foreign = optuna.create_study(storage=url, study_name="theirs", direction="maximize")
    foreign.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    assert ss.mismatch(ss.stored_study(url, "theirs"), space.specs(), goal) == [
        "study theirs: not made by hftoolkit sweep --search: name another --study"]


def test_a_search_option_on_a_grid_sweep_asks_for_search(tmp_path):
    result = run_cli("sweep", ENCODER, "--out", tmp_path, "--param", "lora.r=int:4:8", expect=2)
    assert "--param: a search option, and this is a grid sweep: add --search" in plain(result.output)


def test_a_search_file_gives_settings_and_params_a_list_being_a_choice(tmp_path):
    from hftoolkit.sweeps.space import file_items

    path = tmp_path / "search.yaml"
    path.write_text("trials: 12\npruner: median\nparams:\n  training.learning_rate: float:1e-5:1e-3:log\n"
                    "  lora.r: [4, 8]\n  lora.targets: [[query, value], [query, key, value]]\n")
    settings, items = file_items(path)
    assert settings == {"trials": 12, "pruner": "median"}
    space = parse_space(items, ENCODER, [])
    assert space.specs() == {"training.learning_rate": "float:1e-05:0.001:log", "lora.r": "choice:4,8",
                             "lora.targets": "choice:[query, value],[query, key, value]"}
    path.write_text("params:\n  lora.r: int:4:8\ntrails: 3\n")
    with pytest.raises(Exception, match="trails: unknown key"):
        file_items(path)
