"""`hftoolkit predict` for scripts: standard input, TSV or JSON Lines, a file written atomically, batch size."""

from __future__ import annotations

import json

import pytest

from tests.conftest import RECIPES, plain, train_recipe

TEXTS = ["the movie was wonderful", "a dull and boring plot", "every scene was superb"]


def predict(*args, stdin: str | None = None, expect: int = 0):
    """The predict command in-process, standard input given; stdout and stderr apart."""
    from typer.testing import CliRunner

    from hftoolkit.cli.app import app

    result = CliRunner().invoke(app, ["predict", *map(str, args)], input=stdin)
    assert result.exit_code == expect, f"{result.output}\n{result.exception!r}"
    return result


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "bert"
    train_recipe(RECIPES / "encoder-classification.yaml", run, "training.max_steps=3", "data.max_eval_samples=8")
    return run


def test_stdin_one_input_a_line_gives_the_rows_a_file_gives(run, tmp_path):
    lines = tmp_path / "inputs.txt"
    lines.write_text("\n".join(TEXTS) + "\n")
    from_file = predict(run, "--input", lines)
    from_stdin = predict(run, "--input", "-", stdin="\n".join(TEXTS) + "\n\n")  # a blank line is no input
    rows = [row.split("\t") for row in from_stdin.stdout.splitlines()]
    assert from_stdin.stdout == from_file.stdout
    assert [r[0] for r in rows] == TEXTS and all(r[1] in ("negative", "positive") for r in rows)
    assert "model loaded:" in from_stdin.stderr  # the toolkit's lines stay off standard output

    empty = predict(run, "--input", "-", stdin="\n  \n", expect=2)
    assert "standard input has no lines of text" in plain(empty.output)


def test_jsonl_rows_carry_the_same_predictions_as_tsv(run):
    stdin = "\n".join(TEXTS)
    tsv = [row.split("\t") for row in predict(run, "--input", "-", stdin=stdin).stdout.splitlines()]
    records = [json.loads(line) for line in predict(run, "-i", "-", "--format", "jsonl", stdin=stdin).stdout
               .splitlines()]
    assert [list(r) for r in records] == [["input", "label", "probability"]] * 3
    assert [[r["input"], r["label"], str(r["probability"])] for r in records] == tsv
    refused = predict(run, "--input", "x", "--format", "csv", expect=2)
    assert "'csv' is not one of 'tsv', 'jsonl'" in refused.output


def test_output_file_is_written_and_quiet_prints_only_its_path(run, tmp_path):
    target = tmp_path / "out" / "predictions.jsonl"
    result = predict(run, "--input", "-", "--format", "jsonl", "--output", target, stdin="\n".join(TEXTS))
    assert result.stdout == "" and f"3 predictions written to {target}" in result.stderr
    assert [json.loads(line)["input"] for line in target.read_text().splitlines()] == TEXTS
    quiet = predict(run, "--input", "-", "-o", target, "-q", stdin=TEXTS[0])
    assert (quiet.stdout, quiet.stderr) == (f"{target}\n", "")
    assert target.read_text().count("\n") == 1 and "\t" in target.read_text()  # replaced whole, as TSV


def test_batch_size_changes_how_inputs_are_batched_not_the_predictions(run):
    stdin = "\n".join(TEXTS)
    default = [json.loads(x) for x in predict(run, "-i", "-", "--format", "jsonl", stdin=stdin).stdout.splitlines()]
    one = [json.loads(x) for x in predict(run, "-i", "-", "--format", "jsonl", "--batch-size", "1", stdin=stdin)
           .stdout.splitlines()]
    assert [r["label"] for r in one] == [r["label"] for r in default]
    assert [r["probability"] for r in one] == pytest.approx([r["probability"] for r in default], abs=1e-5)
    assert "--batch-size" in predict(run, "-i", "x", "--batch-size", "0", expect=2).output
