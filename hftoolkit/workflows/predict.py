"""`predict`: a finished run answers new inputs (texts, text pairs, image paths), one record per input."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import EXPORT, RECIPE
from hftoolkit.config import tasks
from hftoolkit.config.recipe import load_recipe, replaced
from hftoolkit.runs.rundir import FinishedRun, open_run
from hftoolkit.workflows.trained import load_trained

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


# Tables predict reads, by suffix: the field delimiter of the csv module's reader, or the reader's name.
TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
# Columns that identify a row, kept in the output (GLUE's test files call it index, hub sets idx).
ID_COLUMNS = ("id", "idx", "index")


def predict(run_dir: Path, given: str | None, generation: dict, batch_size: int | None = None,
            column: str | None = None, pair_column: str | None = None, split: str | None = None) -> list[dict]:
    """One record per input: the input and the family's prediction (label and probability, or text); a table's
    rows keep their id. With `split`, the rows of that split of the run's hub data set (its labels may be
    hidden), each as {index, prediction}: what a GLUE-style submission holds.

    generation overrides eval.generation (--strategy and friends), batch_size eval.batch_size: the inputs go
    through the model in batches of that many. Everything the inputs can be checked for (the run folder, the
    options, the input file, its columns, each input) is checked from the run's recipe before the model loads.
    """
    folder = Path(run_dir)
    exported = (folder / EXPORT).is_file()  # a folder `export --format onnx` wrote: ONNX Runtime, no torch
    run = None if exported else open_run(folder, merged=True)
    recipe = _export_recipe(folder) if exported else run.recipe
    # --strategy and friends, and --batch-size, validated like the recipe's own eval section
    values = {f"eval.generation.{k}": v for k, v in generation.items()}
    if batch_size is not None:
        values["eval.batch_size"] = batch_size
    if values and not exported:
        replaced(recipe, values, "predict options")  # (refused here; applied to the loaded run's recipe below)
    table = None if split else _table_path(given)
    if not exported and recipe.task == tasks.REWARD:  # a score per answer (workflows/reward_model.py)
        if split:
            raise UserError("--split: a reward run scores answers, and a split's rows hold pairs to train on: "
                            "pass them with --input FILE (a prompt, chosen and rejected column each)")
        from hftoolkit.workflows.reward_model import predict_scores, reward_columns

        lines, rows = (None, read_table(table)) if table is not None else (input_lines(given, recipe.task), None)
        if rows is not None:
            reward_columns(recipe, rows, table, column, pair_column)
        return predict_scores(*_loaded(run, values), lines, rows, table, column, pair_column)
    if split:
        from hftoolkit.sources.data import unlabelled_split

        inputs, index = unlabelled_split(recipe, split)
        outputs = _answerer(folder, run, recipe, values, batch_size)(inputs)
        return [{"index": i, "prediction": o.get("label", o.get("value"))} for i, o in zip(index, outputs)]
    talks = conversation_inputs(given, recipe) if table is not None else None
    if talks is not None:  # the file a conversation run trained on answers its last user turns
        from hftoolkit.sources.conversations import last_user_text, question

        outputs = _answerer(folder, run, recipe, values, batch_size)([question(turns) for turns in talks])
        return [{"input": last_user_text(turns), **o} for turns, o in zip(talks, outputs)]
    if table is not None:
        ids, given_lines = table_inputs(table, recipe, column, pair_column)
    else:
        ids, given_lines = None, input_lines(given, recipe.task)
    inputs = parse_inputs(given_lines, recipe.task, pairs=bool(recipe.data.text_pair_column))
    shown = ["\t".join(x) if isinstance(x, tuple) else x if isinstance(x, str) else line
             for line, x in zip(given_lines, inputs)]
    outputs = _answerer(folder, run, recipe, values, batch_size)(inputs)
    records = [{"input": x, **o} for x, o in zip(shown, outputs)]
    return [{**i, **r} for i, r in zip(ids, records)] if ids else records


def _loaded(run: FinishedRun, values: dict):
    """(job, formulation, model, processor) of the run, its recipe with the predict options in `values`."""
    import dataclasses

    job, form, model, processor = load_trained(run)
    if values:
        job = dataclasses.replace(job, recipe=replaced(job.recipe, values, "predict options"))
    return job, form, model, processor


def _answerer(folder: Path, run: FinishedRun | None, recipe, values: dict, batch_size: int | None):
    """inputs -> records, once the model is loaded: the run's (`run`), or the ONNX export's in `folder` (`run` None,
    `recipe` its recipe)."""
    if run is None:
        from hftoolkit.exports.onnx import OnnxPredictor

        runtime = OnnxPredictor(folder, json.loads((folder / EXPORT).read_text())["onnx"])
        return lambda inputs: runtime.predict(inputs, batch_size or recipe.eval.batch_size)
    job, form, model, processor = _loaded(run, values)
    return lambda inputs: form.generate(job, model, processor, inputs)


def _export_recipe(folder: Path):
    """The recipe of a folder `export --format onnx` wrote (the run's, which says how inputs are read); an export
    predict can't run is refused in one line."""
    record = json.loads((folder / EXPORT).read_text())
    if record.get("format") != "onnx":
        raise UserError(f"{folder}: a {record.get('format')} export runs in llama.cpp or Ollama, not in predict: "
                        f"predict with the run it came from ({record.get('run')}), or name its .gguf file as "
                        "model.checkpoint in a recipe")
    return load_recipe(folder / RECIPE)


def looks_like_path(given: str) -> bool:
    """Whether `--input` names a file rather than giving a text: it exists, or it has a suffix (a table's, a text
    file's or an image's anywhere; any short one when it holds no space), or a path separator and no space.
    Such an input is read as a file or refused: predict never labels a path."""
    if "\n" in given or not given.strip():
        return False
    path = Path(given)
    if path.exists():
        return True
    if path.suffix.lower() in TABLE_SUFFIXES or path.suffix.lower() in IMAGE_SUFFIXES | {".txt"}:
        return True
    spaced = any(c.isspace() for c in given)
    return not spaced and ("/" in given or os.sep in given or re.fullmatch(r"\.[A-Za-z0-9]{1,8}", path.suffix) is
                           not None)


def _table_path(given: str) -> Path | None:
    """The table `--input` names, or None for any other input; a path that is not a readable file is refused."""
    if given == "-" or not looks_like_path(given):
        return None
    path = Path(given).expanduser()
    if not path.exists():
        raise UserError(f"--input: {given} looks like a file path, and there is no such file (looked for "
                        f"{path.absolute()}): check the path, or pipe a text that looks like one through "
                        "--input - to predict on it")
    if path.is_dir():
        raise UserError(f"--input: {given} is a folder: pass a file (csv, tsv, jsonl, json, parquet, or txt with "
                        "one input a line)")
    return path if path.suffix.lower() in TABLE_SUFFIXES else None


def table_inputs(path: Path, recipe, column: str | None, pair_column: str | None) -> tuple[list[dict], list]:
    """(each row's id as {name: value}, or [] when the table has no id column; each row's input, as input_lines
    gives it: a text, `first<TAB>second` for sentence pairs, or an image path), from the recipe's text column
    (the image column for images) or --column, and its text_pair_column or --pair-column."""
    rows = read_table(path)
    found = list(dict.fromkeys(k for row in rows[:100] for k in row))
    d = recipe.data
    if pair_column and not d.text_pair_column:
        raise UserError(f"--pair-column: this run reads one text per example, not sentence pairs: drop "
                        f"--pair-column {pair_column}")
    wanted = {"--column": column or (d.image_column if recipe.task == tasks.IMAGE_CLASSIFICATION else d.text_column)}
    if d.text_pair_column:
        wanted["--pair-column"] = pair_column or d.text_pair_column
    missing = [f"{v!r} ({k})" for k, v in wanted.items() if v not in found]
    if missing:
        raise UserError(f"--input: {path} has no column {' or '.join(missing)}; columns found: {', '.join(found)}: "
                        "name the input column with --column" + (" and --pair-column" if d.text_pair_column else ""))
    name = next((c for c in ID_COLUMNS if c in found), None)
    ids = [{name: row.get(name)} for row in rows] if name else []
    texts = [[_cell(row.get(c)) for c in wanted.values()] for row in rows]
    return ids, [t[0] if len(t) == 1 else "\t".join(t) for t in texts]


def _cell(value) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value))  # a tagging row's words
    return "" if value is None else str(value)


def read_table(path: Path) -> list[dict]:
    """A table's rows as dicts, read by its suffix; cells are kept as written (an id of 007 stays 007)."""
    kind = TABLE_SUFFIXES[path.suffix.lower()]
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        elif kind in ("jsonl", "json"):
            rows = _json_rows(path, kind)
        else:
            with path.open(encoding="utf-8-sig", newline="") as f:
                rows = list(csv.DictReader(f, delimiter=kind))
    except UnicodeDecodeError:
        raise UserError(f"--input: {path} is not UTF-8 text: convert it to UTF-8") from None
    except (ValueError, OSError) as err:  # json's and pyarrow's parse errors are ValueErrors
        raise UserError(f"--input: could not read {path} as {path.suffix.lstrip('.')} "
                        f"({str(err).splitlines()[0][:160]}): check its format") from None
    if not rows:
        raise UserError(f"--input: {path} has no rows: add one input a row")
    return rows


def _json_rows(path: Path, kind: str) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    rows = json.loads(text) if kind == "json" and text.lstrip().startswith("[") else \
        [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(row, dict) for row in rows):
        raise ValueError("every row must be a JSON object of column: value")
    return rows


def conversation_inputs(given: str, recipe) -> list[list[dict]] | None:
    """The conversations of a .jsonl or .json file for an instruction run, read from data.messages_column (the
    format `train` and `eval` read); None where `given` is no such file, or its rows hold no such column."""
    import json

    path = Path(given)
    if recipe.task != tasks.INSTRUCTION or path.suffix.lower() not in (".jsonl", ".json") or not path.is_file():
        return None
    from hftoolkit.sources.conversations import problem

    column, text = recipe.data.messages_column, path.read_text(encoding="utf-8")
    try:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix.lower() == ".jsonl" \
            else json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"--input: {given} is not JSON lines ({err.msg}, line {err.lineno}): write one JSON object "
                        "a line") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and column in r for r in rows):
        return None
    for row, item in enumerate(rows):
        if (line := problem(item[column], row, given, "--input")) is not None:
            raise UserError(line)
    return [item[column] for item in rows]


def input_lines(given: str, task: str) -> list[str]:
    """What `--input` gives, one string per input: a literal text; `-`, standard input, one input a line; a .txt
    file, one input a line; for an image task, an image file, or with `-` one image path a line. Anything that
    looks like a path (looks_like_path) is read as a file or refused, never predicted on as a text."""
    if given == "-":
        try:
            lines = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise UserError("--input -: standard input is not UTF-8 text: convert it to UTF-8") from None
        if not lines:
            raise UserError("--input -: standard input has no lines of text: pipe one input per line")
        return lines
    path = Path(given).expanduser()
    if task == tasks.IMAGE_CLASSIFICATION:
        return [given]
    if path.suffix.lower() == ".txt" and path.is_file():
        try:
            lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise UserError(f"--input: {given} is not UTF-8 text: convert it to UTF-8") from None
        if not lines:
            raise UserError(f"--input: {given} has no lines of text: add one input per line")
        return lines
    if looks_like_path(given):
        suffix = path.suffix or "(none)"
        raise UserError(f"--input: predict reads csv, tsv, jsonl, json, parquet and txt files, and {given} has suffix "
                        f"{suffix}: convert it to one of those, or pipe its lines through --input -")
    return [given]


def parse_inputs(lines: list[str], task: str, pairs: bool = False) -> list:
    """Each input line as the family reads it: an image (image task), its words (tagging), a (first, second) pair
    (a run trained on sentence pairs: `first<TAB>second`, or the two characters \\t between them in a literal
    given on the command line), or the text itself."""
    if task == tasks.IMAGE_CLASSIFICATION:
        return [_image(line) for line in lines]
    if pairs:
        return [_pair(line) for line in lines]
    return [line.split() for line in lines] if task == tasks.TAGGING else list(lines)


def _image(given: str):
    path = Path(given)
    if not path.is_file():
        raise UserError(f"--input: image file {given} not found: pass the path of an image")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError):
        raise UserError(f"--input: {given} is not a readable image: pass a PNG or JPEG file") from None


def _pair(line: str) -> tuple[str, str]:
    first, tab, second = line.replace("\\t", "\t").partition("\t")
    if not tab:
        raise UserError(f"--input: this run reads sentence pairs, but {line[:60]!r} has no tab: give each input as "
                        "first<TAB>second (a .txt file of such lines, or a text with \\t between the two)")
    return first, second
