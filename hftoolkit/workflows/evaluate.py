"""`eval`: a finished run's weights scored again, on its eval split or another split, or a recipe's
untrained base checkpoint (the baseline)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hftoolkit.base import console
from hftoolkit.base.errors import UserError
from hftoolkit.base.memory import peak_memory_mb
from hftoolkit.base.run_layout import CARD, LOG, METRICS, PREDICTIONS
from hftoolkit.config import tasks
from hftoolkit.config.recipe import Recipe, RecipeError, recipe_to_yaml, replaced
from hftoolkit.evaluation.evaluate import evaluate
from hftoolkit.job.spec import Job
from hftoolkit.models.families import formulation
from hftoolkit.runs.record import metrics_record
from hftoolkit.runs.rundir import RunDirectory, open_run
from hftoolkit.sources.data import use_split
from hftoolkit.workflows.rewards import scoring
from hftoolkit.workflows.trained import load_trained


def reevaluate(run_dir: Path) -> dict:
    """Score the run's saved weights on its eval split again; metrics.json's eval part is replaced.

    A run whose eval pass failed after training ("trained, eval failed", or killed during it) is completed:
    metrics.json (what training measured, kept, plus the eval), predictions.jsonl, the model card, and the
    status "complete". A run without metrics.json gets what can be known without training again.
    """
    from hftoolkit.models.loading import count_parameters
    from hftoolkit.runs.card import model_card
    from hftoolkit.training.throughput import TokenCounter
    from hftoolkit.training.trainer import build_trainer

    opened = open_run(run_dir)
    refuse_missing_libraries(opened.recipe)
    job, form, model, processor = load_trained(opened, data=True)
    run, data = RunDirectory(run_dir), job.data
    console.phase(console.data_line({"eval": len(data["eval"])}))
    encoded = {split: form.preprocess(job, processor, ds) for split, ds in data.items()}
    scorer, rewards = scoring(job, form, processor)
    # The run's own Trainer settings; with saving off, an evaluate-only Trainer writes nothing there.
    trainer = build_trainer(job, run, model, processor, encoded, TokenCounter(form.collator(job, processor)), scorer,
                            rewards=rewards)
    results, predictions, seconds = evaluate(job, form, trainer, processor, data, encoded, scorer)
    trainable, total = count_parameters(model)
    metrics = {**metrics_record(job, scorer, trainable_params=trainable, total_params=total),
               **{k: v for k, v in run.metrics().items() if v is not None},  # what training measured, kept
               "eval": results, "eval_seconds": round(seconds, 3)}
    run.write_jsonl(PREDICTIONS, predictions)
    run.write_json(METRICS, metrics)
    run.write_text(CARD, model_card(job.recorded_recipe(), metrics, model_type=job.model.model_type))
    if run.manifest().get("status") != "complete":
        run.finish("complete")
    return metrics


def evaluate_recipe(recipe: Recipe, split: str | None = None, output: Path | None = None, overwrite: bool = False,
                    command: list[str] = ()) -> dict:
    """The recipe's base checkpoint scored on its eval split (or `split` of its hub data set), untrained.

    The zero-shot or untrained baseline a comparison report shows beside the fine-tuned runs: the model is
    loaded as training would load it, with no adapter (a preference recipe: one at zero) and unquantized (the
    Trainer refuses a quantized model without an adapter); a new task head is initialised from training.seed, so
    the baseline of a classifier is that of a random head. Data, preprocessing and metrics are exactly training's.
    Nothing is written
    unless `output` names a run directory: it then holds recipe.yaml (as evaluated), manifest.json,
    metrics.json ("trained": false, no train figures) and predictions.jsonl, no weights, and `hftoolkit
    runs` and `compare` read it like any run.
    """
    if split:
        recipe = use_split(recipe, split)
    # A preference baseline keeps its adapter, at zero: TRL's reference is then these weights with the adapter
    # switched off (every reward exactly 0), where without one it would load a second copy of the model.
    bare = {} if recipe.task == tasks.PREFERENCE else {"lora.enabled": False}
    recipe = replaced(recipe, {**bare, "model.quantization": "none"})
    refuse_missing_libraries(recipe)
    run = RunDirectory(output) if output else None
    if run is not None:
        run.claim(overwrite=overwrite)
    try:
        return _evaluate_base(recipe, split, run, command)
    except BaseException:
        if run is not None and not run.contents():
            run.discard()  # bad input: leave no empty run directory behind
        raise
    finally:
        if run is not None:
            run.release()


def _evaluate_base(recipe: Recipe, split: str | None, run: RunDirectory | None, command) -> dict:
    from accelerate.utils import set_seed

    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.loading import count_parameters

    job = resolve_job(recipe)  # the checks training runs: lengths clamped, empty rows dropped
    for line in job.findings.notes:
        console.note(f"preflight: {line}")
    console.phase(console.data_line({"eval": len(job.data["eval"])}))
    set_seed(recipe.training.seed)  # the new head's initialisation
    form = formulation(job)
    model, processor = form.load_model(job)
    console.phase(console.model_line(recipe.model.checkpoint, None, count_parameters(model)[1]))
    scorer, results, predictions, seconds = _score(job, form, model, processor, job.data)
    metrics = metrics_record(job, scorer, name=f"{recipe.name}-untrained", trained=False,
                             split=split or recipe.data.eval_split, eval=results, eval_seconds=round(seconds, 3),
                             peak_memory_mb=peak_memory_mb(), trainable_params=0,
                             total_params=count_parameters(model)[1])
    if run is not None:
        console.attach(run / LOG)  # the libraries' output so far, kept with the scores
        run.start(recipe_to_yaml(job.recorded_recipe()), list(command), recipe.training.seed)
        run.update_manifest(preflight=job.findings.record)
        run.write_json(METRICS, metrics)
        run.write_jsonl(PREDICTIONS, predictions)
        run.finish("complete")
    return metrics


def reevaluate_split(run_dir: Path, split: str) -> tuple[dict, float]:
    """Score the run's saved weights on `split` of its hub data set (a test split, a mismatched validation set).

    metrics.json keeps its eval part and gains splits[split]; the records go to predictions-<split>.jsonl.
    Returns metrics.json's content, and the seconds the split's eval pass took (metrics.json's eval_seconds stays
    the eval split's).
    """
    if not re.fullmatch(r"\w+(\.\w+)*", split):  # datasets' own rule for split names
        raise UserError(f"--split: {split!r} is not a split name (letters, digits and _): name a split such as test")
    opened = open_run(run_dir)
    refuse_missing_libraries(opened.recipe)
    job, form, model, processor = load_trained(opened, data=True, split=split)
    console.phase(console.data_line({split: len(job.data["eval"])}))
    scorer, results, predictions, seconds = _score(job, form, model, processor, job.data)
    run = RunDirectory(run_dir)
    metrics = run.metrics()
    metrics["splits"] = {**metrics.get("splits", {}), split: results}
    run.write_json(METRICS, metrics)
    run.write_jsonl(f"predictions-{split}.jsonl", predictions)
    return metrics, seconds


def refuse_missing_libraries(recipe: Recipe) -> None:
    """What the eval pass needs and this machine lacks, before anything loads: TRL, whose trainer scores tasks
    preference and grpo as it trained them; bitsandbytes, for a model loaded in 8 or 4 bits."""
    from hftoolkit.job.hardware import library_problems

    lacking = library_problems(recipe, training=False)
    if lacking:
        raise RecipeError(lacking)


def _score(job: Job, form, model, processor, data):
    """(scorer, results, records, seconds) of `model` on data["eval"], through a Trainer that trains nothing.

    Only the eval split is preprocessed (it also stands in for the train split the Trainer is built with),
    and the Trainer's output folder is a temporary one: nothing is written anywhere else.
    """
    from hftoolkit.training.throughput import TokenCounter
    from hftoolkit.training.trainer import build_trainer

    encoded_eval = form.preprocess(job, processor, data["eval"])
    encoded = {"train": encoded_eval, "eval": encoded_eval}
    scorer, rewards = scoring(job, form, processor)
    with tempfile.TemporaryDirectory(prefix="hftoolkit-eval-") as tmp:
        trainer = build_trainer(job, RunDirectory(tmp), model, processor, encoded,
                                TokenCounter(form.collator(job, processor)), scorer, rewards=rewards)
        results, predictions, seconds = evaluate(job, form, trainer, processor, data, encoded, scorer)
    return scorer, results, predictions, seconds
