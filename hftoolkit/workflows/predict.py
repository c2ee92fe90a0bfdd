"""`predict`: a finished run answers new inputs (texts, text pairs, image paths), one record per input."""

from __future__ import annotations

import sys
from pathlib import Path

from hftoolkit.errors import UserError
from hftoolkit.workflows.evaluate import load_trained

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def predict(run_dir: Path, given: str, generation: dict, batch_size: int | None = None) -> list[dict]:
    """One record per input: the input and the family's prediction (label and probability, or text).

    generation overrides eval.generation (--strategy and friends), batch_size eval.batch_size: the inputs go
    through the model in batches of that many.
    """
    import dataclasses

    from hftoolkit.config.recipe import replaced

    job, form, model, processor = load_trained(run_dir)
    # --strategy and friends, and --batch-size, validated like the recipe's own eval section
    values = {f"eval.generation.{k}": v for k, v in generation.items()}
    if batch_size is not None:
        values["eval.batch_size"] = batch_size
    if values:
        job = dataclasses.replace(job, recipe=replaced(job.recipe, values, "predict options"))
    recipe = job.recipe
    talks = conversation_inputs(given, recipe)
    if talks is not None:  # the file a conversation run trained on answers its last user turns
        from hftoolkit.sources.conversations import last_user_text, question

        outputs = form.generate(job, model, processor, [question(turns) for turns in talks])
        return [{"input": last_user_text(turns), **o} for turns, o in zip(talks, outputs)]
    given_lines = input_lines(given, recipe.task)
    inputs = parse_inputs(given_lines, recipe.task, pairs=bool(recipe.data.text_pair_column))
    outputs = form.generate(job, model, processor, inputs)
    shown = ["\t".join(x) if isinstance(x, tuple) else x if isinstance(x, str) else line
             for line, x in zip(given_lines, inputs)]
    return [{"input": x, **o} for x, o in zip(shown, outputs)]


def conversation_inputs(given: str, recipe) -> list[list[dict]] | None:
    """The conversations of a .jsonl or .json file for an instruction run, read from data.messages_column (the
    format `train` and `eval` read); None where `given` is no such file, or its rows hold no such column."""
    import json

    path = Path(given)
    if recipe.task != "instruction" or path.suffix.lower() not in (".jsonl", ".json") or not path.is_file():
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
    file, one input a line; for an image task, an image file, or with `-` one image path a line."""
    if given == "-":
        try:
            lines = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise UserError("--input -: standard input is not UTF-8 text: convert it to UTF-8") from None
        if not lines:
            raise UserError("--input -: standard input has no lines of text: pipe one input per line")
        return lines
    path = Path(given)
    if task == "image-classification":
        return [given]
    if path.suffix == ".txt" and path.is_file():
        try:
            lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise UserError(f"--input: {given} is not UTF-8 text: convert it to UTF-8") from None
        if not lines:
            raise UserError(f"--input: {given} has no lines of text: add one input per line")
        return lines
    if path.suffix.lower() in IMAGE_SUFFIXES | {".txt"} and not path.exists():
        raise UserError(f"--input: file {given} not found: check the path, or pass the text itself")
    return [given]


def parse_inputs(lines: list[str], task: str, pairs: bool = False) -> list:
    """Each input line as the family reads it: an image (image task), its words (tagging), a (first, second) pair
    (a run trained on sentence pairs: `first<TAB>second`, or the two characters \\t between them in a literal
    given on the command line), or the text itself."""
    if task == "image-classification":
        return [_image(line) for line in lines]
    if pairs:
        return [_pair(line) for line in lines]
    return [line.split() for line in lines] if task == "tagging" else list(lines)


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
