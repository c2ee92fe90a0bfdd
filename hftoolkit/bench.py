"""`bench`: train every family's shipped smoke recipe and compare them in one report.

The cross-architecture comparison in one command: offline (init: checkpoints, builtin:
data), one run directory per family under OUT/runs, the report in OUT.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hftoolkit.errors import UserError

# family -> its smoke recipe (file name under recipes/)
SMOKE_RECIPES = {
    "encoder": "encoder-classification.yaml",
    "decoder": "decoder-clm.yaml",
    "seq2seq": "seq2seq-translation-t5.yaml",
    "vision": "vision-classification.yaml",
}


def bench(families: list[str], out: Path, recipes_dir: Path, overrides: list[str] = ()) -> tuple[Path, list[Path]]:
    """Train each family's smoke recipe into OUT/runs/<family> and write OUT/report.md."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from hftoolkit.recipe import load_recipe
    from hftoolkit.report import write_report
    from hftoolkit.train import train

    unknown = [f for f in families if f not in SMOKE_RECIPES]
    if unknown:
        raise UserError(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(SMOKE_RECIPES)}")
    recipes = {f: load_recipe(recipes_dir / SMOKE_RECIPES[f], list(overrides)) for f in families}
    runs = []
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task("bench", total=len(recipes))
        for family, recipe in recipes.items():
            progress.update(task, description=f"training {family} ({recipe.name})")
            started = time.perf_counter()
            run_dir = out / "runs" / family
            train(recipe, run_dir, command=sys.argv, overwrite=True)
            progress.console.print(f"{family}: {time.perf_counter() - started:.1f} s -> {run_dir}")
            runs.append(run_dir)
            progress.advance(task)
    return write_report(runs, out), runs
