"""`hftoolkit predict` for scripts: standard input, TSV or JSON Lines, a file written atomically, batch size."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.helpers import RECIPES, no_model_loads, plain, run_cli, train_recipe
from tests.helpers.inputs import weightless_run

TEXTS = ["the movie was wonderful", "a dull and boring plot", "every scene was superb"]


def predict(*args, stdin: str | None = None, expect: int = 0):
    """The predict command in-process, standard input given; stdout and stderr apart."""
    from typer.testing import CliRunner

    from hftoolkit.cli.app import app

    result = CliRunner().invoke(app, ["predict", *map(str, args)], input=stdin)
    assert result.exit_code == expect, f"{result.output}\n{result.exception!r}"
    return result


@pytest.fixture(scope="session")
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
    refused = predict(run, "--input", "x", "--format", "xml", expect=2)
    assert "'xml' is not one of 'tsv', 'jsonl', 'csv'" in refused.output


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


# ---------------------------------------------------------------- tables


# A user's test file: ids that must survive as written (007), a review with a comma and a quote in it.
TABLE = [{"id": "007", "review": TEXTS[0]}, {"id": "12", "review": 'a "dull", boring plot'},
         {"id": "x3", "review": TEXTS[2]}]


def _write_table(path, rows=TABLE):
    """The rows in the format the suffix names, as the user's tools write them."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_a_table_is_read_by_its_suffix_and_keeps_its_ids(run, tmp_path, suffix):
    table = _write_table(tmp_path / f"test{suffix}")
    records = [json.loads(x) for x in predict(run, "--input", table, "--column", "review", "--format", "jsonl")
               .stdout.splitlines()]
    texts = "\n".join(r["review"] for r in TABLE)
    alone = [json.loads(x) for x in predict(run, "-i", "-", "--format", "jsonl", stdin=texts).stdout.splitlines()]
    assert [r["id"] for r in records] == ["007", "12", "x3"]
    assert [{k: v for k, v in r.items() if k != "id"} for r in records] == alone  # the model saw the same texts


def test_csv_output_is_rfc_4180_and_reads_back_whole(run, tmp_path):
    table = _write_table(tmp_path / "test.csv")
    out = predict(run, "--input", table, "--column", "review", "--format", "csv").stdout_bytes.decode()
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    assert out.startswith("id,input,label,probability\r\n")
    assert [(r["id"], r["input"]) for r in rows] == [(t["id"], t["review"]) for t in TABLE]
    assert '"a ""dull"", boring plot"' in out  # quoted, the quotes doubled


def test_the_recipe_text_column_is_the_default_and_a_missing_one_names_the_columns(run, tmp_path):
    table = _write_table(tmp_path / "test.csv", [{"id": r["id"], "text": r["review"]} for r in TABLE])
    assert len(predict(run, "--input", table).stdout.splitlines()) == 3
    reviews = _write_table(tmp_path / "reviews.csv")
    missing = predict(run, "--input", reviews, expect=2)
    assert plain(missing.output).endswith(f"Error: --input: {reviews} has no column 'text' (--column); columns found: "
                                          "id, review: name the input column with --column")
    assert "\t" not in missing.stdout  # no row predicted


def test_sentence_pairs_come_from_the_run_pair_column_or_pair_column(tmp_path):
    """What a run trained on pairs reads from a table (the rows then go through parse_inputs as first<TAB>second)."""
    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.workflows.predict import parse_inputs, table_inputs

    table = _write_table(tmp_path / "pairs.jsonl", [{"idx": 0, "premise": "a cat sat", "hypothesis": "a cat"},
                                                    {"idx": 1, "premise": "it rained", "hypothesis": "dry"}])
    pairs = load_recipe(RECIPES / "encoder-classification.yaml", ["data.text_pair_column=hypothesis"])
    ids, lines = table_inputs(table, pairs, "premise", None)
    assert ids == [{"idx": 0}, {"idx": 1}]
    assert parse_inputs(lines, "classification", pairs=True) == [("a cat sat", "a cat"), ("it rained", "dry")]
    assert table_inputs(table, pairs, "hypothesis", "premise")[1][0] == "a cat\ta cat sat"
    with pytest.raises(UserError) as err:
        table_inputs(table, pairs, "premise", "sentence2")
    assert "has no column 'sentence2' (--pair-column); columns found: idx, premise, hypothesis" in err.value.message
    single = load_recipe(RECIPES / "encoder-classification.yaml")
    with pytest.raises(UserError) as err:
        table_inputs(table, single, "premise", "hypothesis")
    assert "this run reads one text per example, not sentence pairs" in err.value.message


@pytest.mark.parametrize("given, expect", [
    ("test.csv", "test.csv looks like a file path, and there is no such file"),
    ("data/reviews", "data/reviews looks like a file path, and there is no such file"),
    ("5/10", "pipe a text that looks like one through --input -"),
])
def test_a_path_is_never_predicted_on_as_a_text(run, tmp_path, monkeypatch, given, expect):
    monkeypatch.chdir(tmp_path)
    result = predict(run, "--input", given, expect=2)
    assert expect in plain(result.output) and f"{tmp_path}/{given}" in plain(result.output)
    assert "negative" not in result.stdout and "positive" not in result.stdout


def test_split_of_a_run_trained_on_files_points_to_input(run):
    result = predict(run, "--split", "test", expect=2)
    assert "'test' names a split of a hub data set, but the run's data.train (builtin:sentiment) is not one: " \
           "predict on a file of inputs with --input FILE" in plain(result.output)


def test_an_unknown_suffix_is_refused_in_one_line(run, tmp_path):
    sheet = tmp_path / "reviews.xlsx"
    sheet.write_bytes(b"PK\x03\x04")
    result = predict(run, "--input", sheet, expect=2)
    assert plain(result.output).endswith(f"Error: --input: predict reads csv, tsv, jsonl, json, parquet and txt "
                                         f"files, and {sheet} has suffix .xlsx: convert it to one of those, or pipe "
                                         "its lines through --input -")
    assert "that was plain" in predict(run, "--input", "that was plain fun. Really").stdout  # a text with a dot


# ---------------------------------------------------------------- refused before the model loads


@pytest.mark.parametrize("recipe, args, said", [
    ("encoder-classification.yaml", ["--column", "summary"],
     "--input: {table} has no column 'summary' (--column); columns found: id, review: name the input column with "
     "--column"),
    ("encoder-classification.yaml", ["--column", "review", "--pair-column", "id"],
     "--pair-column: this run reads one text per example, not sentence pairs: drop --pair-column id"),
    ("encoder-classification.yaml", ["--column", "review", "--num-beams", "0"],
     "predict options: eval.generation.num_beams: input should be greater than"),
    ("encoder-reward.yaml", ["--column", "summary", "--pair-column", "review"],
     "--column: {table} has no column 'summary'; columns found: id, review"),
    ("encoder-reward.yaml", [], "--input: {table} has no answer column 'chosen' (the run's data.chosen_column); "
                                "columns found: id, review: name it with --pair-column"),
], ids=["column", "pair-column", "generation option", "reward column", "reward answer column"])
def test_what_the_inputs_can_tell_is_refused_in_one_line_before_the_model_loads(tmp_path, monkeypatch, recipe, args,
                                                                               said):
    no_model_loads(monkeypatch)
    run = weightless_run(tmp_path / "run", recipe)  # (no weights: a load before the refusal fails on them too)
    table = _write_table(tmp_path / "test.csv")
    result = predict(run, "--input", table, *args, expect=2)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {said.format(table=table)}"), result.output


# ---------------------------------------------------------------- a hidden-label test split


def _glue_sst2(n: int = 24) -> tuple:
    """GLUE's sst2 as the hub lays it out: sentence, label (ClassLabel), idx; the test split's labels are -1."""
    import datasets

    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"]),
                                  "idx": datasets.Value("int32")})
    words = ["dull", "superb"]

    def rows(split, count, hidden=False):
        return [{"sentence": f"the {split} film was {words[i % 2]}", "label": -1 if hidden else i % 2,
                 "idx": 1000 + i if hidden else i}
                for i in range(count)]

    return features, {"train": rows("train", n), "validation": rows("dev", 8), "test": rows("test", 6, hidden=True)}


def test_split_test_writes_a_glue_submission_of_index_and_label_name(tmp_path, monkeypatch):
    from tests.helpers import hub_cache

    home = tmp_path / "hf-home"
    hub_cache.plant_dataset(home / "hub", home / "datasets", "nyu-mll/glue", {"sst2": _glue_sst2()})
    hub_cache.use_hf_home(monkeypatch, home)
    run = tmp_path / "runs" / "sst2"
    train_recipe(RECIPES / "encoder-classification.yaml", run, "data.train=nyu-mll/glue", "data.config=sst2",
                 "data.eval_split=validation", "data.text_column=sentence", "training.max_steps=2")
    submission = tmp_path / "SST-2.tsv"
    predict(run, "--split", "test", "--output", submission)
    lines = submission.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert [line.split("\t")[0] for line in lines[1:]] == [str(1000 + i) for i in range(6)]  # the set's idx
    assert {line.split("\t")[1] for line in lines[1:]} <= {"negative", "positive"}
    scored = run_cli("eval", run, "--split", "test", expect=2)  # scoring it stays refused: no labels to score
    assert "has no labels" in plain(scored.output)
    both = predict(run, "--split", "test", "--input", "x", expect=2)
    assert "pass --input (a text, a file or -) or --split NAME" in plain(both.output)
