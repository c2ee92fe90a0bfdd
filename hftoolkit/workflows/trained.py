"""A finished run's model loaded back, for every command that reads one: eval, predict, merge, serve and bench."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hftoolkit.base import console
from hftoolkit.config import tasks
from hftoolkit.config.recipe import replaced
from hftoolkit.runs.rundir import FinishedRun, open_run
from hftoolkit.sources.data import use_split


def load_trained(run: FinishedRun | str | Path, full_precision: bool = False, data: bool = False,
                 split: str | None = None):
    """(job, formulation, model, processor) of a finished run (or a folder `merge` wrote), ready for eval or
    predict; the job reads the run's data (its eval split, or `split` of its hub data set) when `data` is True.

    full_precision loads an 8-bit or 4-bit base unquantized (for merging the adapter into it).
    """
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.models.loading import count_parameters

    run = run if isinstance(run, FinishedRun) else open_run(run)
    recipe = run.recipe
    if recipe.data.packing is True and recipe.task not in tasks.packed():
        recipe = replaced(recipe, {"data.packing": None})  # (accepted before preflight refused it: such runs load)
    if run.merged:  # a plain checkpoint: no adapter, not quantized
        recipe = replaced(recipe, {"model.checkpoint": str(run.path.resolve()), "model.gguf_file": None,
                                   "model.revision": None, "model.quantization": "none", "lora.enabled": False},
                          "merged")
    if full_precision:
        recipe = replaced(recipe, {"model.quantization": "none"})
    if split:
        recipe = use_split(recipe, split)
    # processor and config (full models) from the run's own folder
    job = resolve_job(recipe, data=data, weights=None if run.merged else run.weights)
    form = formulation(job)
    if run.adapter:  # the base, then the adapter as its own adapter_config.json says, whatever the recipe says now
        from peft import PeftModel

        # (a copy, not validated again: a quantized base without an adapter is no recipe to train)
        bare = recipe.model_copy(update={"lora": recipe.lora.model_copy(update={"enabled": False})})
        base, processor = form.load_model(dataclasses.replace(job, recipe=bare))
        model = PeftModel.from_pretrained(base, run.weights, is_trainable=True)  # (trainable: what the run trained)
        model.eval()
    else:
        model, processor = form.load_model(job)
    console.phase(console.model_line(str(run.weights), None, count_parameters(model)[1], recipe.model.quantization,
                                     model.peft_config["default"].r if run.adapter else None))
    return job, form, model, processor
