"""`hftoolkit runs`: every run directory under a folder, newest first.

Sweeps nest runs (DIR/<sweep>/<variant>/), so the folder is searched recursively; a run directory
is a folder holding manifest.json or metrics.json. Each run is read with `runsummary.load_run`, so a
half-written, failed, older or garbled run is listed with what it does say, never an error.
Light: no torch, transformers or datasets; rich only when printing the table.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import MANIFEST, METRICS
from hftoolkit.runs.summary import DASH, export_name, format_seconds, format_value, load_run

RUN_MARKERS = (MANIFEST, METRICS)
# A run's own subfolders hold weights and checkpoints, not runs: not searched inside a run.
RUN_CONTENTS = {"checkpoints", "adapter", "model"}
# Never searched anywhere (hidden folders such as .git and .venv are skipped too).
NOT_RUNS = {"node_modules", "__pycache__"}


def find_runs(root: Path) -> list[Path]:
    """Run directories at or below root, in path order; symlinked folders are not followed."""
    found = []
    for folder, subfolders, files in os.walk(root):
        is_run = any(marker in files for marker in RUN_MARKERS)
        if is_run:
            found.append(Path(folder))
        subfolders[:] = sorted(name for name in subfolders if not name.startswith(".") and name not in NOT_RUNS
                               and not (is_run and name in RUN_CONTENTS))
    return found


def _started(value: object, path: Path) -> datetime:
    """When the run started: manifest.json's "started", else the folder's modification time."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    return datetime.fromtimestamp(path.stat().st_mtime).astimezone()


def describe_run(path: Path) -> dict:
    """One run as a JSON-ready dict: what `hftoolkit runs --json` prints for it."""
    run = load_run(path, read_history=False)
    return {
        "name": run.name, "path": str(path), "status": run.status, "task": run.task, "checkpoint": run.checkpoint,
        "main_metric": run.main_metric, "main_value": run.main_value,
        "greater_is_better": run.greater_is_better if run.main_metric else None,
        "train_seconds": run.train_seconds,
        "started": _started(run.started, path).isoformat(timespec="seconds"),
        "error": run.error,
        "exports": [{"format": e["format"], "quantization": e.get("quantization"), "path": e.get("path")}
                    for e in run.exports],
    }


def list_runs(root: Path) -> list[dict]:
    """Every run directory under root (root itself may be one), newest first."""
    root = Path(root)
    if not root.is_dir():
        what = "not a folder" if root.exists() else "no such folder"
        raise UserError(f"DIR: {what}: {root}: pass the folder that holds your run directories "
                        "(hftoolkit train writes them under runs/ unless output.dir says otherwise)")
    runs = [describe_run(path) for path in find_runs(root)]
    runs.sort(key=lambda run: run["path"])  # ties in start time: path order
    runs.sort(key=lambda run: _timestamp(run["started"]), reverse=True)
    return runs


def _timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()  # a naive time counts as local time


def table_rows(runs: list[dict], root: Path) -> list[dict[str, str]]:
    """The table's cells per run: run (path under root), status, task, checkpoint, main metric, train time, date,
    and its exports where some run has any."""
    rows = []
    for run in runs:
        relative = Path(run["path"]).relative_to(root).as_posix()
        metric = DASH
        if run["main_metric"]:
            arrow = "↑" if run["greater_is_better"] else "↓"
            metric = f"{run['main_metric']}={format_value(run['main_value'])} {arrow}"
        rows.append({
            "run": run["name"] if relative == "." else relative, "status": run["status"] or DASH,
            "task": run["task"] or DASH, "checkpoint": run["checkpoint"] or DASH, "main metric": metric,
            "train time": format_seconds(run["train_seconds"]),
            "date": run["started"][:16].replace("T", " "),  # the run's own clock, to the minute
            **({"exports": ", ".join(export_name(e) for e in run["exports"]) or DASH}
               if any(r["exports"] for r in runs) else {}),
        })
    return rows


# The columns a narrow terminal leaves out first (run and main metric stay), named under the table; --wide shows
# them all, and --json has every field.
FIT_DROP = ("exports", "date", "checkpoint", "train time", "task", "status")


def print_runs(runs: list[dict], root: Path, wide: bool = False) -> None:
    """The runs as a rich table of one line a run, the columns left out to fit the terminal named below it; with
    `wide`, every column however wide the lines get (as `ps -ww` does: a pager such as `less -S` shows them
    whole); then the first line of each failed run's error; or one line saying there are none."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text  # cells as plain text: a "[...]" in a name or an error is not rich markup

    console = Console()
    if not runs:
        console.print(Text(f"no runs were found under {root}"), soft_wrap=True)
        return
    from hftoolkit.base.text_width import fit_rows

    every = table_rows(runs, root)
    rows = every if wide else fit_rows(every, console.width, drop=FIT_DROP, shorten=("run", "checkpoint"))
    table = Table(title=Text(f"{len(rows)} run(s) under {root}, newest first"))
    for column in rows[0]:  # short cells stay on one line; names, paths and errors fold
        short = column in ("train time", "date")
        table.add_column(column, overflow="fold", no_wrap=short, justify="right" if column == "train time" else "left")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row.values()))
    if wide:  # (at the table's own width, past the terminal's)
        natural = console.measure(table, options=console.options.update_width(100_000)).maximum
        console = Console(width=max(console.width, natural))
    console.print(table)
    hidden = [column for column in every[0] if column not in rows[0]]
    if hidden:  # (wrapped at the terminal's width, as the table is)
        console.print(Text(f"not shown at {console.width} columns: {', '.join(hidden)} (--wide shows every column, "
                           "--json every field)"))
    for run, row in zip(runs, every):  # below the table: a long message squeezes no column
        if run["error"]:
            console.print(Text(f"{row['run']} failed: {run['error']}"), soft_wrap=True)
