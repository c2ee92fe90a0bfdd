"""One writer per run directory: the run's lock (runs/rundir.py), as train, eval, merge, runs and compare meet it.

A writer in another process is a small Python process that holds the lock as a training process does (flock: the
kernel releases it when the holder ends, SIGKILL included); the end-to-end case, a live 2-process run, is
tests/e2e/test_kills.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hftoolkit.runs.rundir import LOCK, RunDirectory
from tests.helpers import RECIPES, plain, run_cli, train_recipe
from tests.helpers.locks import can_lock, end, hold_elsewhere

ENCODER = RECIPES / "encoder-classification.yaml"
TINY = ("data.max_train_samples=16", "data.max_eval_samples=8", "training.max_steps=2", "training.save_steps=1",
        "eval.max_predictions=2")

@pytest.fixture
def trained(tmp_path) -> Path:
    """A complete LoRA run, released by its writer."""
    run = tmp_path / "run"
    train_recipe(ENCODER, run, *TINY)
    return run


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory) -> Path:
    """A complete LoRA run that the tests using it leave as it is."""
    run = tmp_path_factory.mktemp("locked") / "run"
    train_recipe(ENCODER, run, *TINY)
    return run


@pytest.mark.slow
def test_a_finished_run_leaves_no_lock_and_a_killed_writers_record_is_reported_as_interrupted(trained):
    assert not (trained / LOCK).exists()
    assert RunDirectory(trained).holder() is None
    manifest = json.loads((trained / "manifest.json").read_text())
    (trained / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))  # as a SIGKILL leaves it
    (trained / LOCK).write_text(json.dumps({"pid": 4242, "host": "vm", "started": "2026-01-01T00:00:00+0000"}))
    listed = json.loads(run_cli("runs", trained.parent, "--json").stdout)
    assert [r["status"] for r in listed] == ["interrupted"]
    result = run_cli("eval", trained)  # takes the dead writer's lock over
    assert not (trained / LOCK).exists()
    assert json.loads((trained / "manifest.json").read_text())["status"] == "complete", result.output


@pytest.mark.slow
@pytest.mark.parametrize("args", [("train", "--resume", "{run}"), ("train", str(ENCODER), "--output", "{run}"),
                                  ("train", str(ENCODER), "--output", "{run}", "--overwrite"), ("eval", "{run}"),
                                  ("merge", "{run}", "--output", "{out}")],
                         ids=["resume", "second-train", "overwrite", "eval", "merge"])
def test_a_folder_a_live_run_writes_is_refused_in_one_line_that_names_the_run(trained_once, tmp_path, args):
    trained = trained_once
    before = {p.name: p.stat().st_mtime_ns for p in trained.iterdir() if p.name != LOCK}
    writer = hold_elsewhere(trained)
    try:
        result = run_cli(*(a.format(run=trained, out=tmp_path / "merged") for a in args), expect=2)
    finally:
        end(writer)
    said = plain(result.output)
    assert said.count("Error:") == 1 and "being written by a live run" in said, result.output
    assert "hftoolkit train recipes/x.yaml" in said and "elsewhere" in said and "kill" in said, said
    after = {p.name: p.stat().st_mtime_ns for p in trained.iterdir() if p.name != LOCK}
    assert after == before, "the refused command wrote into the live run's folder"
    assert not (tmp_path / "merged").exists()
    assert json.loads(run_cli("runs", trained.parent, "--json").stdout)[0]["status"] == "complete"


def test_a_running_run_whose_writer_lives_is_listed_running_and_once_killed_interrupted(tmp_path):
    run = tmp_path / "runs" / "live"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"status": "running", "started": "2026-01-01T00:00:00+0000"}))
    writer = hold_elsewhere(run)
    try:
        assert [r["status"] for r in json.loads(run_cli("runs", tmp_path / "runs", "--json").stdout)] == ["running"]
    finally:
        end(writer)
    assert [r["status"] for r in json.loads(run_cli("runs", tmp_path / "runs", "--json").stdout)] == ["interrupted"]
    report = run_cli("compare", run, "--output", tmp_path / "report")
    assert "interrupted" in (tmp_path / "report" / "report.md").read_text(), report.output


def test_a_lock_is_taken_once_and_given_back(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    assert run.hold("train", "hftoolkit train a.yaml") is None
    assert not can_lock(run / LOCK), "another process could take a held lock"
    assert RunDirectory(run.path).in_use("eval") is None  # (this process is the writer)
    run.release()
    assert not (run / LOCK).exists()
    assert can_lock(run / LOCK)
