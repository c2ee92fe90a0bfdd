"""`eval` and `predict` on a finished run directory."""

from __future__ import annotations

from pathlib import Path

from hftoolkit.errors import UserError
from hftoolkit.rundir import RunDirectory

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def reevaluate(run_dir: Path) -> dict:
    """Score the run's saved weights on its eval split again; metrics.json's eval part is replaced."""
    from hftoolkit.data import load_data
    from hftoolkit.throughput import TokenCounter
    from hftoolkit.train import build_trainer, evaluate, load_trained

    recipe, family, model, processor = load_trained(run_dir)
    run = RunDirectory(run_dir)
    data = load_data(recipe)
    encoded = {split: family.preprocess(recipe, processor, ds) for split, ds in data.items()}
    scorer = family.metrics(recipe, processor)
    # The run's own Trainer settings; with saving off, an evaluate-only Trainer writes nothing there.
    trainer = build_trainer(recipe, run, model, processor, encoded,
                            TokenCounter(family.collator(recipe, processor)), scorer)
    results, predictions, seconds = evaluate(recipe, family, trainer, processor, data, encoded, scorer)
    metrics = {**run.metrics(), "eval": results, "eval_seconds": round(seconds, 3)}
    run.write_json("metrics.json", metrics)
    run.write_jsonl("predictions.jsonl", predictions)
    return metrics


def predict(run_dir: Path, given: str, generation: dict) -> list[dict]:
    """One record per input: the input and the family's prediction (label and probability, or text)."""
    from hftoolkit.train import load_trained

    recipe, family, model, processor = load_trained(run_dir)
    if generation:  # --strategy and friends, validated like the recipe's own eval.generation
        from hftoolkit.recipe import validate_recipe

        raw = recipe.model_dump()
        raw["eval"]["generation"].update(generation)
        recipe.eval.generation = validate_recipe(raw, "predict options").eval.generation
    inputs = read_inputs(given, recipe.task)
    outputs = family.generate(recipe, model, processor, inputs)
    shown = [x if isinstance(x, str) else given for x in inputs]
    return [{"input": x, **o} for x, o in zip(shown, outputs)]


def read_inputs(given: str, task: str) -> list:
    """A literal text, a .txt file (one input a line), or an image file."""
    path = Path(given)
    if task == "image-classification":
        if not path.is_file():
            raise UserError(f"--input: image file {given} not found: pass the path of an image")
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as image:
                return [image.convert("RGB")]
        except (UnidentifiedImageError, OSError):
            raise UserError(f"--input: {given} is not a readable image: pass a PNG or JPEG file") from None
    if path.suffix == ".txt" and path.is_file():
        try:
            lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise UserError(f"--input: {given} is not UTF-8 text: convert it to UTF-8") from None
        if not lines:
            raise UserError(f"--input: {given} has no lines of text: add one input per line")
        if task == "tagging":
            return [line.split() for line in lines]
        return lines
    if path.suffix.lower() in IMAGE_SUFFIXES | {".txt"} and not path.exists():
        raise UserError(f"--input: file {given} not found: check the path, or pass the text itself")
    return [given.split()] if task == "tagging" else [given]
