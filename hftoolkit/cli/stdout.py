"""What commands print on standard output, where a script reads it: the results table of train and eval (or
metrics.json's content with --json, the path alone with --quiet), run rows, predict's rows. The toolkit's own
lines go to standard error through console.py. Light: rich is imported inside the functions.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def tsv_row(record: dict) -> str:
    """A record's values, tab-separated; a line break inside a value (generated text) written as \\n."""
    return "\t".join(str(v).replace("\r", "\\r").replace("\n", "\\n") for v in record.values())


def jsonl_row(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False)


def csv_rows(records: list[dict]) -> str:
    """RFC 4180 CSV, as the csv module writes it: a header of the fields, CRLF line ends, a field that holds a
    comma, quote or line break quoted (quotes doubled)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(records[0]) if records else [], lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def predict_text(records: list[dict], format_: str, submission: bool = False) -> str:
    """predict's rows in `format_` (tsv, jsonl or csv). A submission (--split) is a TSV with its header
    (index, prediction), as GLUE's leaderboard reads it; predict's other TSV rows have none."""
    if format_ == "csv":
        return csv_rows(records)
    if format_ == "jsonl":
        return "".join(jsonl_row(r) + "\n" for r in records)
    header = "\t".join(records[0]) + "\n" if submission and records else ""
    return header + "".join(tsv_row(r) + "\n" for r in records)


def files_in(folder: Path) -> str:
    """Every file under `folder`, as paths relative to it, sorted and comma-separated: what a command's summary says
    it wrote, read from the disk once it is written, so that the summary can't drift from the writers."""
    return ", ".join(sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file()))


# The report's columns that fit a terminal; report.md and report.html have them all.
TERMINAL_COLUMNS = ("run", "family", "task", "quant", "LoRA r", "main metric", "trainable / total", "train time")
# Left out first where the terminal is narrow (run and main metric stay).
FIT_DROP = ("quant", "LoRA r", "trainable / total", "family", "train time", "task")


def print_rows(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    from hftoolkit.base.text_width import fit_rows

    console, table = Console(), Table()
    shown = fit_rows([{c: row[c] for c in TERMINAL_COLUMNS if c in row} for row in rows], console.width,
                     drop=FIT_DROP, shorten=("run",))
    for column in (shown[0] if shown else ()):
        table.add_column(column, overflow="fold")
    for row in shown:
        table.add_row(*row.values())
    console.print(table)


def show_result(metrics: dict, path: Path | None, as_json: bool, verbosity, shown: dict | None = None,
                from_training: bool = False) -> None:
    """What train and eval end with on standard output: metrics.json's content as one JSON object (--json), the
    path written alone (--quiet), or the results table and the path. `from_training`: the figures only training
    measures are the training run's, kept in metrics.json (`eval RUN_DIR`), and the table says so."""
    from hftoolkit.base.console import Verbosity

    if as_json:
        typer.echo(json.dumps(metrics, indent=2, ensure_ascii=False))
    elif verbosity == Verbosity.QUIET:
        if path is not None:
            typer.echo(str(path))
    else:
        if (shown or metrics).get("eval") is not None:
            print_metrics(shown or metrics, from_training)
        if metrics.get("benchmarks"):
            print_benchmarks(metrics)
        typer.echo(f"run directory: {path}" if path is not None else
                   "run directory: none written (--output DIR keeps these scores)")


# The run's cost, shown under its scores.
RESULT_FIGURES = ("setup_seconds", "train_seconds", "eval_seconds", "samples_per_second", "tokens_per_second",
                  "padding_fraction", "matmul_fraction", "peak_memory_mb", "trainable_params", "total_params")
# Those only training measures (its throughput, and its peak memory, read as training ends): an eval pass measures
# its scores and eval_seconds, and shows these labelled as the training run's.
TRAINING_FIGURES = ("setup_seconds", "train_seconds", "samples_per_second", "tokens_per_second", "padding_fraction",
                    "matmul_fraction", "peak_memory_mb")
FROM_TRAINING = "(from training)"


def print_metrics(metrics: dict, from_training: bool = False) -> None:
    """The scores, then the run's figures; with `from_training`, TRAINING_FIGURES are labelled as the training
    run's (an eval pass shows what it measured, beside what it kept)."""
    from rich.console import Console
    from rich.table import Table

    from hftoolkit.base.text_width import short_path

    console = Console()  # a long checkpoint path shortened to its last folders: the title stays on a line or two
    room = console.width - len(f"{metrics['name']} ({metrics['task']}, )") - 4
    title = f"{metrics['name']} ({metrics['task']}, {short_path(str(metrics['checkpoint']), max(24, room))})"
    table = Table(title=title, min_width=min(console.width, len(title) + 4))  # (a title wraps at the table's width)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics["eval"].items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        table.add_row(key + (" *" if key == metrics["main_metric"] else ""), shown)
    measured = [key for key in RESULT_FIGURES if not (from_training and key in TRAINING_FIGURES)]
    for key in measured:
        if metrics.get(key) is not None:
            table.add_row(key, _cell(metrics[key]))
    carried = [key for key in TRAINING_FIGURES if from_training and metrics.get(key) is not None]
    if carried:  # (below a rule: what the training run measured, kept in metrics.json)
        table.add_section()
    for key in carried:
        table.add_row(f"{key} {FROM_TRAINING}", _cell(metrics[key]))
    console.print(table)


def print_benchmarks(metrics: dict) -> None:
    """The benchmark tasks of metrics.json (or of an untrained base), one row each: metric, value, stderr, shots,
    rows scored."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{metrics['name']}: benchmarks (lm-evaluation-harness)")
    for column in ("task", "metric", "value", "stderr", "shots", "rows"):
        table.add_column(column, justify="left" if column in ("task", "metric") else "right", overflow="fold")
    for task, record in metrics["benchmarks"].items():
        stderr = record.get("stderr")
        table.add_row(task, str(record.get("metric")), _figure(record.get("value")),
                      _figure(stderr) if isinstance(stderr, (int, float)) else "-",
                      str(record.get("num_fewshot")), str(record.get("rows")))
    Console().print(table)


def _cell(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _figure(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
