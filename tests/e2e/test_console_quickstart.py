"""The README quickstart as a user sees it: the toolkit's phases and the results table on the console, the
libraries' output in train.log; --json and --quiet for scripts; the exit codes the README documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import RECIPES, run_cli

QUICKSTART = RECIPES / "encoder-classification.yaml"
# What the libraries print during this run when nothing hides it (seen with -v): transformers' load report
# table, warnings, the Trainer's printed log dicts and tqdm bars.
NOISE = ("LOAD REPORT", "Warning", "{'loss'", "{'train_runtime'", "it/s]")


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory):
    """`hftoolkit train encoder-classification --overwrite`, the README's command, in an empty folder: the recipe is
    the one shipped inside the package, the run lands in the folder's runs/."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("empty"))
        result = run_cli("train", "encoder-classification", "--overwrite")
        return Path.cwd() / "runs" / "encoder-classification", result


@pytest.mark.slow
def test_the_quickstart_reads_the_shipped_recipe_in_an_empty_folder(quickstart):
    from hftoolkit import __version__

    run, _ = quickstart
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["recipe_file"] == f"encoder-classification (shipped with hftoolkit {__version__})"


def test_the_console_shows_the_toolkits_phases_and_the_table(quickstart):
    run, result = quickstart
    err = result.stderr.splitlines()
    assert err[:3] == [
        "data loaded: 960 train, 240 eval rows",
        "note: classifier head initialised from scratch (2 tensors): expected when fine-tuning for a new task",
        "note: checkpoint weights unused by this task, left out (7 tensors: cls.predictions, cls.seq_relationship): "
        "expected when the checkpoint was saved with another head"]
    assert re.fullmatch(r"model loaded: init:bert, 136,964 parameters, 4,226 trainable \(3.09%\), LoRA r=8, "
                        r"not quantized", err[3]), err[3]
    # (another test of the session may have tokenized the same built-in rows: the cache is then reused)
    assert re.fullmatch(r"tokenized (1,200 rows in \d+\.\d s( \([\d,]+ reused from the cache\))?|data reused from "
                        r"the cache \(.*\): 1,200 rows, nothing tokenized)", err[4]), err[4]
    progress = err[5:-1]  # without a terminal: one line per tenth of the steps
    assert [line.split(" loss ")[0] for line in progress] == [f"train {12 * i}/120 ({10 * i}%)" for i in range(1, 11)]
    assert all(re.search(r" lr \S+ elapsed \d:\d\d:\d\d eta \d:\d\d:\d\d$", line) for line in progress), progress
    assert err[-1] == "eval: 240 examples"

    out = result.stdout
    assert "accuracy *" in out and "train_seconds" in out
    assert out.endswith("run directory: runs/encoder-classification\n")
    for noise in NOISE:
        assert noise not in result.output, noise


def test_train_log_keeps_everything_the_libraries_said(quickstart):
    run, _ = quickstart
    log = (run / "train.log").read_text()
    for said in ("BertForSequenceClassification LOAD REPORT", "classifier.weight", "[trainer] step 5/120: {'loss'",
                 "{'train_runtime'", "[hftoolkit] data loaded: 960 train, 240 eval rows", "[hftoolkit] eval: 240",
                 "{'eval_loss'"):
        assert said in log, said


@pytest.mark.slow
def test_json_prints_metrics_json_alone_and_quiet_prints_the_path(tmp_path):
    run = tmp_path / "run"
    result = run_cli("train", QUICKSTART, "--output", run, "--json", "--set", "training.max_steps=3")
    assert json.loads(result.stdout) == json.loads((run / "metrics.json").read_text())
    assert "data loaded:" in result.stderr  # the toolkit's lines go to standard error

    scored = run_cli("eval", run, "--json")
    assert json.loads(scored.stdout)["eval"] == json.loads((run / "metrics.json").read_text())["eval"]
    assert (run / "train.log").read_text().count("log opened") == 2  # eval appends to the run's log

    quiet = run_cli("train", QUICKSTART, "--output", run, "--overwrite", "-q", "--set", "training.max_steps=3")
    assert (quiet.stdout, quiet.stderr) == (f"{run}\n", "")


@pytest.mark.slow
def test_verbose_shows_the_libraries_too(tmp_path):
    result = run_cli("train", QUICKSTART, "--output", tmp_path / "run", "-v", "--set", "training.max_steps=3")
    assert "LOAD REPORT" in result.stderr and "data loaded:" in result.stderr
    assert run_cli("train", QUICKSTART, "-v", "-q", expect=2).stderr.endswith(
        "-v/--verbose and -q/--quiet contradict each other: pass one of them\n")


def test_exit_codes_say_ok_failed_run_and_bad_input(tmp_path, monkeypatch):
    assert run_cli("validate", QUICKSTART).exit_code == 0
    bad = run_cli("train", tmp_path / "missing.yaml", expect=2)
    assert "recipe file not found" in bad.stderr and not (tmp_path / "missing").exists()

    import hftoolkit.workflows.train

    def broken_eval(*args, **kwargs):
        raise RuntimeError("the eval pass broke")

    monkeypatch.setattr(hftoolkit.workflows.train, "evaluate", broken_eval)
    run = tmp_path / "run"
    failed = run_cli("train", QUICKSTART, "--output", run, "--set", "training.max_steps=2", expect=1)
    assert isinstance(failed.exception, RuntimeError)
    assert f"note: the libraries' full log: {run / 'train.log'}" in failed.stderr
    assert json.loads((run / "manifest.json").read_text())["status"] == "trained, eval failed"
