"""`hftoolkit sweep`: train the cross product of a grid of recipe values, then compare the runs in one report.

    hftoolkit sweep RECIPE --grid model.checkpoint=init:bert,init:gpt2 --grid lora.r=4,16 [--set k=v]... [--output DIR]

Every variant is validated before anything trains; each is a run directory DIR/<name>/<variant>/ named from its
grid values (grid.py), trained as variants.py runs them, and DIR/<name>/report.md compares them all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.sweeps.grid import grid_variants, parse_grid
from hftoolkit.sweeps.variants import SweepResult, prepare, run_variants


def sweep(recipe_path: Path, grid_items: list[str], sets: list[str], out: Path, overwrite: bool = False,
          num_processes: int | None = None, command: list[str] | None = None,
          echo: Callable[[str], None] = print, verbosity=None) -> SweepResult:
    """Validate every variant, train each into out/<recipe name>/<variant>/, write the report there."""
    from hftoolkit.base.ranks import is_main_process
    from hftoolkit.runs.report import write_report

    grid = parse_grid(grid_items)
    if not grid:
        raise UserError("--grid: no grid given: name a key and its values, for example "
                        "--grid model.checkpoint=init:bert,init:gpt2")
    variants = grid_variants(recipe_path, grid, sets)
    folder = prepare(variants, out, overwrite=overwrite, num_processes=num_processes, by_recipe_name=True)
    counts = {a: sum(v.action == a for v in variants) for a in ("train", "resume", "restart", "skip")}
    summary = ", ".join(f"{n} to {a}" if a != "skip" else f"{n} complete" for a, n in counts.items() if n)
    echo(f"sweep {folder}: {len(variants)} variants ({summary})")
    outcomes = run_variants(variants, command or sys.argv, num_processes, echo, verbosity)
    report = folder / "report.md"
    if is_main_process():  # (a sweep started by a launcher runs in every process; one writes)
        write_report([v.run_dir for v in variants], folder)
    return SweepResult(folder, report, outcomes)
