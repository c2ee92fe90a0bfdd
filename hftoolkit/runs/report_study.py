"""The sweep report's study section, for a search's sweep folder: study.json (written by sweeps/report.py)
rendered as Markdown and HTML: the best trial and its recipe, Optuna's plots and parameter importances, and the
pruned trials with the compute each saved. Light: no Optuna import; the plots are files already written."""

from __future__ import annotations

import html
import json
from pathlib import Path

from hftoolkit.runs.summary import DASH, format_seconds, format_value

STUDY_RECORD = "study.json"
PLOT_TITLES = {"study-history.png": "Optimisation history", "study-importances.png": "Parameter importances",
               "study-slice.png": "Slice plot: each parameter against the objective"}


def read_study(folder: Path) -> dict | None:
    try:
        record = json.loads((Path(folder) / STUDY_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "rows" in record else None


def _value(value) -> str:
    return DASH if value is None else format_value(value)


def _params(params: dict) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={format_value(v) if isinstance(v, float) else v}"
                     for k, v in params.items()) or DASH


def summary_lines(record: dict) -> list[str]:
    objective = record["objective"]
    counts = {}
    for row in record["rows"]:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in counts.items())
    lines = [f"Study {record['study']} in {record['storage']}: {len(record['rows'])} of {record['trials']} trials "
             f"({states}); {record['sampler']} sampler, {record['pruner']} pruner; objective {objective['metric']} "
             f"({objective['direction']}). Trial time {format_seconds(record['train_seconds'])} in all"
             + (f"; pruning saved about {format_seconds(record['saved_seconds'])}" if record["saved_seconds"] else "")
             + "."]
    best = record.get("best")
    if best:
        lines.append(f"Best trial: {best['run']}, {objective['metric']}={_value(best['value'])} "
                     f"({_params(best['params'])})"
                     + (f"; its recipe, ready to train in full: `hftoolkit train {record['best_recipe']}` "
                        "(in this folder)" if record.get("best_recipe") else "") + ".")
    else:
        lines.append("No trial has completed yet.")
    return lines


def trial_table(record: dict) -> tuple[list[str], list[list[str]]]:
    keys = list(record["space"])
    header = ["trial", "state", record["objective"]["metric"], *(k.rsplit(".", 1)[-1] for k in keys), "time",
              "pruned at", "saved"]
    best = (record.get("best") or {}).get("run")
    rows = []
    for row in record["rows"]:
        pruned = f"step {row['pruned_at_step']} of {row['planned_steps']}" if row.get("pruned_at_step") else DASH
        rows.append([row["run"] + (" ★" if row["run"] == best else ""), row["state"], _value(row["value"]),
                     *(_cell(row["params"].get(k)) for k in keys), format_seconds(row.get("seconds")), pruned,
                     format_seconds(row.get("saved_seconds")) if row.get("saved_seconds") else DASH])
    return header, rows


def _cell(value) -> str:
    return DASH if value is None else format_value(value) if isinstance(value, float) else str(value)


def importance_lines(record: dict) -> list[str]:
    if record.get("importances"):
        return [f"{key}: {value:.2f}" for key, value in record["importances"].items()]
    return [record.get("importances_note") or "no importances"]


def markdown(record: dict, table) -> list[str]:
    """The section's Markdown lines; `table(header, rows)` renders a table as the rest of the report does."""
    parts = ["## Study", "", *summary_lines(record), "", table(*trial_table(record)), "",
             "Parameter importances (Optuna's, the share of the objective's variance each explains): "
             + "; ".join(importance_lines(record)), ""]
    for filename in record.get("plots", []):
        parts += [f"![{PLOT_TITLES.get(filename, filename)}]({filename})", ""]
    return parts


def html_section(record: dict, out: Path, image, table) -> str:
    """The section as HTML; `image(out, filename, title)` inlines a plot and `table(header, rows)` renders a table
    as the rest of the page does."""
    esc = html.escape
    trials = table(*trial_table(record))
    text = "".join(f"<p>{esc(line)}</p>" for line in summary_lines(record))
    importances = "<p>Parameter importances: " + esc("; ".join(importance_lines(record))) + "</p>"
    images = "".join(image(out, f, PLOT_TITLES.get(f, f)) for f in record.get("plots", []) if (out / f).is_file())
    return f'<section id="study"><h2>Study</h2>{text}{trials}{importances}{images}</section>'
