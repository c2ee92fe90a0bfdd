"""`merge`: fold a run's LoRA adapter into its base weights and save a plain checkpoint.

The result loads with the Auto classes and no peft. A base that was loaded in 8-bit or
4-bit is merged into a full-precision copy of the same base (merging into quantized
weights would round the update away), then cast to the dtype asked for.
"""

from __future__ import annotations

from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import RECIPE
from hftoolkit.runs.rundir import RunDirectory

DTYPES = ("float32", "bfloat16", "float16")


def merge_run(run_dir: Path, out: Path, dtype: str = "float32") -> Path:
    import torch

    from hftoolkit.workflows.trained import load_trained

    if dtype not in DTYPES:
        raise UserError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--output: {out} is not empty: choose a new folder")
    held = RunDirectory(run_dir).in_use("merge")
    if held:
        raise UserError(held)
    job, _, model, processor = load_trained(run_dir, full_precision=True)
    if not job.recipe.lora.enabled:
        raise UserError(f"{run_dir}: this run fine-tuned the whole model, so there is no adapter to merge; "
                        f"its model/ folder is already a plain checkpoint")
    merged = model.merge_and_unload()
    merged.to(getattr(torch, dtype))
    merged.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    # The run's recipe beside the weights (from_pretrained ignores it): `serve` reads the task and settings there.
    (out / RECIPE).write_bytes((Path(run_dir) / RECIPE).read_bytes())
    return out
