"""`merge`: fold a run's LoRA adapter into its base weights and save a plain checkpoint.

The result loads with the Auto classes and no peft. A base that was loaded in 8-bit or
4-bit is merged into a full-precision copy of the same base (merging into quantized
weights would round the update away), then cast to the dtype asked for. `export` starts
from the same merged model (`merged_model`).
"""

from __future__ import annotations

from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import RECIPE
from hftoolkit.runs.rundir import FinishedRun, RunDirectory, staged_folder

DTYPES = ("float32", "bfloat16", "float16")


def merge_run(run_dir: Path, out: Path, dtype: str = "float32") -> Path:
    import torch

    from hftoolkit.runs.rundir import open_run

    if dtype not in DTYPES:
        raise UserError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--output: {out} {'is a file' if not out.is_dir() else 'is not empty'}: choose a new folder")
    held = RunDirectory(run_dir).in_use("merge")
    if held:
        raise UserError(held)
    run = open_run(run_dir)
    if not run.recipe.lora.enabled:
        raise UserError(f"{run_dir}: this run fine-tuned the whole model, so there is no adapter to merge; "
                        f"its model/ folder is already a plain checkpoint")
    _, _, merged, processor = merged_model(run)
    merged.to(getattr(torch, dtype))
    with staged_folder(out) as folder:  # (a kill or a full disk leaves no half-saved checkpoint at `out`)
        merged.save_pretrained(folder, safe_serialization=True)
        processor.save_pretrained(folder)
        # The run's recipe beside the weights (from_pretrained ignores it): `serve` reads the task and settings there.
        (folder / RECIPE).write_bytes((run.path / RECIPE).read_bytes())
    return out


def merged_model(run: FinishedRun, data: bool = False):
    """(job, formulation, model, processor) of a finished run with its adapter folded in, in float32 on an
    unquantized base: a plain model, as the run's own predictions come from it; with `data`, the job has read the
    run's data."""
    from hftoolkit.workflows.trained import load_trained

    job, form, model, processor = load_trained(run, full_precision=True, data=data)
    if run.adapter:
        model = model.merge_and_unload()
    model.float()
    model.eval()
    return job, form, model, processor
