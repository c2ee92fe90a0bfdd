"""A finished run's weights at work: the eval pass, `eval` of a run again, and `predict`.

`evaluate` scores a trained model on the eval split (loss, the task's metrics, prediction
records); `train.py` calls it once training ends, `reevaluate` on a run directory later,
`reevaluate_split` on another split of its hub data set (a test split), and `evaluate_recipe`
on a recipe's base checkpoint before any training (the untrained or zero-shot baseline).
`load_trained` rebuilds a run's model from its recipe and saved weights.
"""

from __future__ import annotations

import math
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

from hftoolkit import console, tasks
from hftoolkit.batching import shortest_first
from hftoolkit.errors import UserError
from hftoolkit.families import family_module, label_records
from hftoolkit.launch import generate_everywhere
from hftoolkit.recipe import Recipe, load_recipe
from hftoolkit.rundir import RunDirectory

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def evaluate(recipe: Recipe, family, trainer, processor, data, encoded, scorer):
    """Eval loss and metrics on the eval split, plus up to eval.max_predictions prediction records.

    Eval batches run shortest first, so they pad little; the metrics do not depend on the order, and
    records are mapped back to the data's order. Classification and regression records come from that same
    pass's probabilities or values; other tasks generate theirs (a text, tags or filled masks the loss pass
    does not give).
    """
    console.phase(f"eval: {len(data['eval']):,} examples")
    started = time.perf_counter()
    task = tasks.spec(recipe.task)
    column = task.columns[0]
    raw = data["eval"]
    count = len(raw) if task.scoring == "generation" else min(len(raw), recipe.eval.max_predictions)
    eval_set, order = shortest_first(encoded["eval"])
    outputs = None
    if task.labels in ("class", "value"):
        output = trainer.predict(eval_set, metric_key_prefix="eval")
        trainer.log(output.metrics)  # as trainer.evaluate does: the eval lands in the log history
        scored = output.metrics
        predicted = output.predictions if order is None else output.predictions[order.argsort()]
        outputs = _pass_records(task, predicted[:count], trainer.model.config.id2label)
    else:
        scored = trainer.evaluate(eval_set, metric_key_prefix="eval")
    results = {k.removeprefix("eval_"): v for k, v in scored.items()
               if k.startswith("eval_") and not k.endswith(("_runtime", "_per_second", "_time"))}
    if task.main_metric == "perplexity" and "loss" in results:
        results["perplexity"] = math.exp(min(results["loss"], 50))
    inputs = raw[column][:count]
    if outputs is None:
        prompt = {"prompt_fraction": task.prompt_fraction} if task.prompt_fraction < 1 else {}
        outputs = generate_everywhere(family, recipe, trainer.model, processor, inputs, **prompt)  # shared by processes
    if task.scoring == "generation":
        results.update(scorer.compute([o["text"] for o in outputs], raw["target"]))
    references = _references(recipe, raw, count)
    pairs = raw["text_pair"][:count] if "text_pair" in raw.column_names else [None] * len(inputs)
    predictions = [{"input": _show(x), **({"input_pair": p} if p is not None else {}),
                    **({"reference": r} if r is not None else {}), **o}
                   for x, p, r, o in zip(inputs, pairs, references, outputs)][:recipe.eval.max_predictions]
    return results, predictions, time.perf_counter() - started


def _pass_records(task, predicted, id2label: dict) -> list[dict]:
    """Records from the eval pass's own outputs: label and probability (classes), or the predicted value."""
    if task.labels == "value":
        from hftoolkit.families.labels import value_records

        return value_records(predicted)
    return label_records(predicted, id2label)


def _references(recipe: Recipe, raw, count: int) -> list:
    if "target" in raw.column_names:
        return raw["target"][:count]
    if tasks.spec(recipe.task).labels == "value":
        return [round(float(v), 4) for v in raw["label"][:count]]
    if "label" in raw.column_names and recipe.data.label_names:
        names = recipe.data.label_names
        return [[names[i] for i in v] if isinstance(v, list) else names[v] for v in raw["label"][:count]]
    return [None] * count


def _show(value):
    return value if isinstance(value, (str, list)) else f"<{type(value).__name__}>"


def load_trained(run_dir: Path, full_precision: bool = False):
    """(recipe, family module, model, processor) of a finished run, ready for eval or predict.

    full_precision loads an 8-bit or 4-bit base unquantized (for merging the adapter into it).
    """
    run = RunDirectory(run_dir)
    if not (run / "recipe.yaml").is_file():
        raise UserError(f"{run_dir}: not a run directory (no recipe.yaml): pass a folder written by hftoolkit train")
    weights = run.weights_dir()
    recipe = load_recipe(run / "recipe.yaml")
    if full_precision:
        recipe.model.quantization = "none"
    from hftoolkit.modeling import resolve_family

    family = family_module(resolve_family(recipe))
    if weights.name == "model":
        recipe.model.checkpoint = str(weights)
        model, processor = family.load_model(recipe)
    else:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        model, processor = family.load_model(recipe)
        set_peft_model_state_dict(model, load_file(weights / "adapter_model.safetensors"))
        model.eval()
        # The processor the run trained with, saved beside its adapter (a rebuilt init: tokenizer may differ).
        processor = type(processor).from_pretrained(weights)
    from hftoolkit.modeling import count_parameters

    console.phase(console.model_line(str(weights), None, count_parameters(model)[1], recipe.model.quantization,
                                     recipe.lora.r if weights.name == "adapter" else None))
    return recipe, family, model, processor


def run_facts(recipe: Recipe, scorer) -> dict:
    """What a run is, as metrics.json opens: name, family, task, checkpoint, quantization, LoRA rank, main metric."""
    return {
        "name": recipe.name, "family": recipe.family, "task": recipe.task, "checkpoint": recipe.model.checkpoint,
        "quantization": recipe.model.quantization, "lora_rank": recipe.lora.r if recipe.lora.enabled else None,
        "main_metric": scorer.main, "greater_is_better": scorer.greater_is_better,
    }


def peak_memory_mb() -> float:
    """Peak GPU memory allocated when on CUDA, else the process's peak resident set size."""
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def reevaluate(run_dir: Path) -> dict:
    """Score the run's saved weights on its eval split again; metrics.json's eval part is replaced.

    A run whose eval pass failed after training ("trained, eval failed", or killed during it) is completed:
    metrics.json (what training measured, kept, plus the eval), predictions.jsonl, the model card, and the
    status "complete". A run without metrics.json gets what can be known without training again.
    """
    from hftoolkit.data import load_data
    from hftoolkit.modeling import count_parameters
    from hftoolkit.publish import model_card
    from hftoolkit.throughput import TokenCounter
    from hftoolkit.trainer import build_trainer

    recipe, family, model, processor = load_trained(run_dir)
    run = RunDirectory(run_dir)
    data = load_data(recipe)
    console.phase(console.data_line({"eval": len(data["eval"])}))
    encoded = {split: family.preprocess(recipe, processor, ds) for split, ds in data.items()}
    scorer = family.metrics(recipe, processor)
    # The run's own Trainer settings; with saving off, an evaluate-only Trainer writes nothing there.
    trainer = build_trainer(recipe, run, model, processor, encoded,
                            TokenCounter(family.collator(recipe, processor)), scorer)
    results, predictions, seconds = evaluate(recipe, family, trainer, processor, data, encoded, scorer)
    trainable, total = count_parameters(model)
    metrics = {**run_facts(recipe, scorer), "trainable_params": trainable, "total_params": total,
               "hftoolkit_version": __import__("hftoolkit").__version__, **run.metrics(),
               "eval": results, "eval_seconds": round(seconds, 3)}
    run.write_jsonl("predictions.jsonl", predictions)
    run.write_json("metrics.json", metrics)
    run.write_text("README.md", model_card(recipe, metrics))
    if run.manifest().get("status") != "complete":
        run.finish("complete")
    return metrics


# ---------------------------------------------------------------- other splits, untrained baselines


def evaluate_recipe(recipe: Recipe, split: str | None = None, output: Path | None = None, overwrite: bool = False,
                    command: list[str] = ()) -> dict:
    """The recipe's base checkpoint scored on its eval split (or `split` of its hub data set), untrained.

    The zero-shot or untrained baseline a comparison report shows beside the fine-tuned runs: the model is
    loaded as training would load it, with no adapter and unquantized (the Trainer refuses a quantized model
    without an adapter); a new task head is initialised from training.seed, so the baseline of a classifier
    is that of a random head. Data, preprocessing and metrics are exactly training's. Nothing is written
    unless `output` names a run directory: it then holds recipe.yaml (as evaluated), manifest.json,
    metrics.json ("trained": false, no train figures) and predictions.jsonl, no weights, and `hftoolkit
    runs` and `compare` read it like any run.
    """
    from accelerate.utils import set_seed

    from hftoolkit.data import use_split
    from hftoolkit.modeling import count_parameters, resolve_family
    from hftoolkit.preflight import prepare

    if split:
        use_split(recipe, split)
    recipe.lora.enabled, recipe.model.quantization = False, "none"
    run = RunDirectory(output) if output else None
    if run is not None:
        run.claim(overwrite=overwrite)
    try:
        family = family_module(resolve_family(recipe))
        data, findings = prepare(recipe)  # the checks training runs: lengths clamped, empty rows dropped
        for line in findings.notes:
            console.note(f"preflight: {line}")
        console.phase(console.data_line({"eval": len(data["eval"])}))
        set_seed(recipe.training.seed)  # the new head's initialisation
        model, processor = family.load_model(recipe)
        console.phase(console.model_line(recipe.model.checkpoint, None, count_parameters(model)[1]))
        scorer, results, predictions, seconds = _score(recipe, family, model, processor, data)
    except BaseException:
        if run is not None and not any(run.path.iterdir()):
            run.path.rmdir()  # bad input: leave no empty run directory behind
        raise
    from hftoolkit.recipe import recipe_to_yaml

    metrics = {
        "name": f"{recipe.name}-untrained", "family": recipe.family, "task": recipe.task,
        "checkpoint": recipe.model.checkpoint, "quantization": "none", "lora_rank": None, "trained": False,
        "split": split or recipe.data.eval_split, "main_metric": scorer.main,
        "greater_is_better": scorer.greater_is_better, "eval": results, "train_seconds": None,
        "eval_seconds": round(seconds, 3), "samples_per_second": None, "tokens_per_second": None,
        "peak_memory_mb": peak_memory_mb(), "trainable_params": 0, "total_params": count_parameters(model)[1],
        "hftoolkit_version": __import__("hftoolkit").__version__,
    }
    if run is not None:
        console.attach(run / "train.log")  # the libraries' output so far, kept with the scores
        run.start(recipe_to_yaml(recipe), list(command), recipe.training.seed)
        run.update_manifest(preflight=findings.record)
        run.write_json("metrics.json", metrics)
        run.write_jsonl("predictions.jsonl", predictions)
        run.finish("complete")
    return metrics


def reevaluate_split(run_dir: Path, split: str) -> dict:
    """Score the run's saved weights on `split` of its hub data set (a test split, a mismatched validation set).

    metrics.json keeps its eval part and gains splits[split]; the records go to predictions-<split>.jsonl.
    Returns metrics.json's content.
    """
    from hftoolkit.data import load_data, use_split

    if not re.fullmatch(r"\w+(\.\w+)*", split):  # datasets' own rule for split names
        raise UserError(f"--split: {split!r} is not a split name (letters, digits and _): name a split such as test")
    recipe, family, model, processor = load_trained(run_dir)
    use_split(recipe, split)
    data = load_data(recipe)
    console.phase(console.data_line({split: len(data["eval"])}))
    scorer, results, predictions, seconds = _score(recipe, family, model, processor, data)
    run = RunDirectory(run_dir)
    metrics = run.metrics()
    metrics["splits"] = {**metrics.get("splits", {}), split: results}
    run.write_json("metrics.json", metrics)
    run.write_jsonl(f"predictions-{split}.jsonl", predictions)
    return metrics


def _score(recipe: Recipe, family, model, processor, data):
    """(scorer, results, records, seconds) of `model` on data["eval"], through a Trainer that trains nothing.

    Only the eval split is preprocessed (it also stands in for the train split the Trainer is built with),
    and the Trainer's output folder is a temporary one: nothing is written anywhere else.
    """
    from hftoolkit.throughput import TokenCounter
    from hftoolkit.trainer import build_trainer

    encoded_eval = family.preprocess(recipe, processor, data["eval"])
    encoded = {"train": encoded_eval, "eval": encoded_eval}
    scorer = family.metrics(recipe, processor)
    with tempfile.TemporaryDirectory(prefix="hftoolkit-eval-") as tmp:
        trainer = build_trainer(recipe, RunDirectory(tmp), model, processor, encoded,
                                TokenCounter(family.collator(recipe, processor)), scorer)
        results, predictions, seconds = evaluate(recipe, family, trainer, processor, data, encoded, scorer)
    return scorer, results, predictions, seconds


def predict(run_dir: Path, given: str, generation: dict, batch_size: int | None = None) -> list[dict]:
    """One record per input: the input and the family's prediction (label and probability, or text).

    generation overrides eval.generation (--strategy and friends), batch_size eval.batch_size: the inputs go
    through the model in batches of that many.
    """
    recipe, family, model, processor = load_trained(run_dir)
    if generation:  # --strategy and friends, validated like the recipe's own eval.generation
        from hftoolkit.recipe import validate_recipe

        raw = recipe.model_dump()
        raw["eval"]["generation"].update(generation)
        recipe.eval.generation = validate_recipe(raw, "predict options").eval.generation
    if batch_size is not None:
        recipe.eval.batch_size = batch_size
    given_lines = input_lines(given, recipe.task)
    inputs = parse_inputs(given_lines, recipe.task, pairs=bool(recipe.data.text_pair_column))
    outputs = family.generate(recipe, model, processor, inputs)
    shown = ["\t".join(x) if isinstance(x, tuple) else x if isinstance(x, str) else line
             for line, x in zip(given_lines, inputs)]
    return [{"input": x, **o} for x, o in zip(shown, outputs)]


def read_inputs(given: str, task: str, pairs: bool = False) -> list:
    """The model inputs `--input` names: see `input_lines` and `parse_inputs`."""
    return parse_inputs(input_lines(given, task), task, pairs)


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
