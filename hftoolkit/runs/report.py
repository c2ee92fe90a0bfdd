"""Run directories -> comparison report (report.md, a self-contained report.html, PNG plots).

Runs are read by `runs.summary`; matplotlib is imported only inside the plotting functions of `runs.report_plots`.
The best run of each task (by its main metric, respecting `greater_is_better`) is marked with a star; runs
without a finished metrics.json are not ranked.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

from hftoolkit.config import tasks
from hftoolkit.runs.summary import (
    BEST,
    COSTS,
    DASH,
    ReportError,
    RunSummary,
    best_per_task,
    export_name,
    format_count,
    format_memory,
    format_seconds,
    format_value,
    load_run,
    lora_cell,
    memory_cell,
    params_cell,
    pareto_best,
    recipe_settings,
    same_task_groups,
)

BENCHMARK_PLOT = ("benchmarks.png", "Benchmarks: each run beside its base")
BENCHMARK_NOTE = ("lm-evaluation-harness tasks (`hftoolkit eval RUN --benchmark TASKS`); each value ± the harness's "
                  "standard error, and for a tuned run whose base checkpoint was also evaluated (`eval RECIPE "
                  "--benchmark TASKS --output DIR`), the change from that base.")
EXPORTS_NOTE = ("`hftoolkit export`: each export was read back and run on eval inputs beside the run; the check is "
                "the largest difference from the run's outputs (GGUF: logits, and greedy answers identical; ONNX: "
                "probabilities or values, and labels identical).")
PREFERENCE_PLOT = ("preference.png", "Preference: loss and reward margin")
PREFERENCE_NOTE = ("For preference runs: the reward of an answer is beta x its log-probability under the tuned model "
                   "minus the reference's (orpo, which has no reference: beta x its mean token log-probability); "
                   "reward_accuracy is the share of held-out pairs whose chosen answer has the higher reward, "
                   "reward_margin the mean chosen-minus-rejected reward (kto ranks no pairs: the mean reward of its "
                   "good answers minus that of its bad ones, its main metric). An untrained base is its own "
                   "reference, so it scores 0 on both (orpo excepted). For reward runs (task reward): the reward is "
                   "the reward model's score of a prompt and answer; reward_accuracy is the share of held-out pairs "
                   "whose chosen answer scores higher (a tie counts half), reward_margin the mean chosen-minus-"
                   "rejected score, and the training curve is of the pairs of each logging interval.")
REWARDS_PLOT = ("rewards.png", "Rewards: per step, answer length and KL")
REWARDS_NOTE = ("For grpo runs: each step's reward is the mean over the answers it sampled (the band: one spread "
                "either side), summed with the weights of rl.rewards and shown per reward too; the answers' mean "
                "length in tokens; and the KL to the reference where rl.beta > 0. Their eval reward is that of greedy "
                "answers to the held-out prompts.")
PLOTS = (
    ("loss.png", "Training loss"),
    ("eval.png", "Eval main metric by task"),
    ("params.png", "Trainable vs total parameters"),
    ("resources.png", "Memory, throughput and wall time"),
)


def _order(runs: list[RunSummary]) -> list[RunSummary]:
    """Group runs by task (tasks in order of first appearance), keeping input order within a task."""
    first = {}
    for run in runs:
        first.setdefault(run.task, len(first))
    return sorted(runs, key=lambda run: first[run.task])


# A recipe key left out of a label: it differs between runs without saying how they differ (where each was written).
UNTELLING_KEYS = ("output.dir",)
# Keys a run fills in from what it found (Job.recorded_recipe: its checkpoint's family, its data's labels): in a
# label only when nothing the user set differs.
FILLED_KEYS = ("model.family", "data.label_names")
LABEL_KEYS = 3  # a label names at most this many differing keys, and counts the rest
LABEL_VALUE_LENGTH = 32  # a longer value (a path) keeps its end
MISSING = object()  # a key one run's recipe lacks (written by another version)


def _label(runs: list[RunSummary]) -> None:
    """Each run's display name: its name; where several runs share one, the name and the recipe keys whose values
    tell them apart (`decoder-preference preference.method=orpo`), read from each run's recipe.yaml, else the
    run's folder, as a sweep names its variants. Labels come out unique."""
    groups: dict[str, list[RunSummary]] = {}
    for run in runs:
        groups.setdefault(run.name, []).append(run)
    for name, members in groups.items():
        if len(members) == 1:
            members[0].label = name
            continue
        differing, folders = _differing_settings(members), _folder_names(members)
        for run, settings, folder in zip(members, differing, folders):
            parts = [name, settings] if settings else [name]
            if not settings or differing.count(settings) > 1:  # (the keys cut at LABEL_KEYS may leave two alike)
                parts.append(f"({folder})")
            run.label = " ".join(parts)
    seen: dict[str, int] = {}
    for run in runs:  # what still collides (a value too long to tell, the same folder twice) is numbered
        seen[run.label] = seen.get(run.label, 0) + 1
        if seen[run.label] > 1:
            run.label = f"{run.label} ({seen[run.label]})"


def _differing_settings(members: list[RunSummary]) -> list[str]:
    """For runs that share a name: each one's `key=value` for the recipe keys whose values differ among them
    ("" for every run where any has no readable recipe.yaml, or none differs)."""
    recipes = [recipe_settings(run.path) for run in members]
    if not all(recipes):
        return [""] * len(members)
    keys = [key for key in dict.fromkeys(k for recipe in recipes for k in recipe) if key not in UNTELLING_KEYS
            and len({_raw(recipe.get(key, MISSING)) for recipe in recipes}) > 1]
    keys = [key for key in keys if key not in FILLED_KEYS] or keys
    labels = []
    for recipe in recipes:
        shown = [f"{key}={_shown(recipe.get(key, MISSING))}" for key in keys[:LABEL_KEYS]]
        if len(keys) > LABEL_KEYS:
            shown.append(f"(+{len(keys) - LABEL_KEYS} more)")
        labels.append(" ".join(shown))
    return labels


def _raw(value) -> str:
    return "" if value is MISSING else json.dumps(value, sort_keys=True, default=str)


def _shown(value) -> str:
    """A recipe value as `--set` would take it: a string as it is, anything else as YAML's flow style (JSON)."""
    from hftoolkit.base.text_width import short_path

    if value is MISSING:
        return "(unset)"
    return short_path(value if isinstance(value, str) else json.dumps(value, default=str), LABEL_VALUE_LENGTH)


def _folder_names(members: list[RunSummary]) -> list[str]:
    """The shortest end of each run's path (its folder, then its parent's too, ...) that tells the runs apart, as
    far as their paths differ at all."""
    parts = [run.path.resolve().parts for run in members]
    ends = [["/".join(p[-depth:]) for p in parts] for depth in range(1, max(len(p) for p in parts) + 1)]
    return next(names for names in ends if len(set(names)) == len(set(parts)))


def summary_rows(runs: list[RunSummary]) -> list[dict[str, str]]:
    """One dict of display strings per run, keys in column order (for the CLI's rich table)."""
    if any(not run.label for run in runs):
        _label(runs)
    best = best_per_task(runs)
    rows = []
    for index, run in enumerate(runs):
        metric = DASH
        if run.main_metric:
            arrow = "↑" if run.greater_is_better else "↓"
            metric = f"{run.main_metric}={format_value(run.main_value)} {arrow}"
            if run.main_value is not None and not run.eval_final:
                metric += " (interim)"
        label = run.label if run.trained else f"{run.label} (untrained baseline)"
        rows.append({
            "run": f"{label} {BEST}" if index in best else label,
            "status": run.status or DASH, "family": run.family or DASH,
            "checkpoint": run.checkpoint or DASH, "task": run.task or DASH,
            "quant": run.quantization or DASH, "LoRA r": lora_cell(run),
            "main metric": metric,
            "trainable / total": params_cell(run), "peak mem": memory_cell(run),
            "train time": format_seconds(run.train_seconds), "notes": "; ".join(run.notes),
        })
    return rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    cells = [[c.replace("|", "\\|").replace("\n", " ") for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _eval_tables(runs: list[RunSummary]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per task: every eval metric any of its runs reported, one row per run."""
    tables = []
    for task in dict.fromkeys(run.task for run in runs):
        members = [run for run in runs if run.task == task and run.eval]
        names = sorted({k for run in members for k in run.eval}, key=lambda k: (k == "loss", k))
        if names:
            rows = [[run.label] + [format_value(run.eval.get(k)) for k in names] for run in members]
            tables.append((task or "unknown task", ["run", *names], rows))
    return tables


def base_of(run: RunSummary, runs: list[RunSummary]) -> RunSummary | None:
    """The untrained baseline of a tuned run's checkpoint among `runs`, if one was evaluated."""
    if not run.trained:
        return None
    return next((r for r in runs if not r.trained and r.checkpoint == run.checkpoint and r.benchmarks), None)


def exports_table(runs: list[RunSummary]) -> tuple[list[str], list[list[str]]] | None:
    """One row per export of the runs: what, where, when, and its check; None when no run was exported."""
    rows = []
    for run in runs:
        for export in run.exports:
            check = export.get("check") or {}
            difference = check.get("max_logit_difference", check.get("max_difference"))
            same = check.get("greedy_identical", check.get("identical"))
            rows.append([run.label, export_name(export), str(export.get("path", DASH)),
                         str(export.get("exported", DASH))[:16].replace("T", " "),
                         DASH if difference is None else f"{difference:.3g}",
                         DASH if same is None else f"{same}/{check.get('inputs', '?')}"])
    header = ["run", "export", "path", "date", "largest difference", "identical answers"]
    return (header, rows) if rows else None


def benchmark_table(runs: list[RunSummary]) -> tuple[list[str], list[list[str]]] | None:
    """Each benchmark task a row, each run with benchmark results a column: value ± stderr, and the change from
    the run's base where the base was evaluated too; None when no run has any."""
    members = [run for run in runs if run.benchmarks]
    if not members:
        return None
    tasks_ = list(dict.fromkeys(task for run in members for task in run.benchmarks))
    header = ["benchmark", "metric"] + [run.label + ("" if run.trained else " (base)") for run in members]
    rows = []
    for task in tasks_:
        first = next(run.benchmarks[task] for run in members if task in run.benchmarks)
        shots = f"{first.get('num_fewshot')}-shot, {first.get('rows')} rows"
        row = [f"{task} ({shots})", str(first.get("metric"))]
        for run in members:
            record, base = run.benchmarks.get(task), base_of(run, members)
            if record is None:
                row.append(DASH)
                continue
            stderr = record.get("stderr")
            cell = format_value(record["value"]) + (f" ± {format_value(stderr)}" if isinstance(stderr, float) else "")
            if base is not None and task in base.benchmarks:
                cell += f" ({record['value'] - base.benchmarks[task]['value']:+.4f} vs base)"
            row.append(cell)
        rows.append(row)
    return header, rows


@dataclass
class SameTask:
    """One task's same-task comparison: its runs, their Pareto-best costs, the course's advice, its figure."""

    task: str | None
    metric: str | None
    greater_is_better: bool
    members: list[int]  # indices into the report's runs
    pareto: dict[str, set[int]]  # cost's short name -> Pareto-best run indices
    advice: str
    figure: str  # PNG file name

    @property
    def title(self) -> str:
        return f"Same-task comparison: {self.task or 'unknown task'}"


PARETO_NOTE = ("Pareto-best: no other run of the task reaches an equal or better {metric} with less of that "
               "cost (trainable parameters, train time, peak memory); ringed in the figure.")


def same_task_comparisons(runs: list[RunSummary]) -> list[SameTask]:
    """A SameTask for every (task, main metric) that two runs or more share: its main metric against trainable
    parameters, train time and peak memory (one figure, three panels), the Pareto-best runs of each panel marked,
    and the family the course recommends for the task (tasks.py)."""
    best = best_per_task(runs)
    found = []
    for task, metric, members in same_task_groups(runs):
        spec = tasks.find(task)
        advice = (f"The course recommends the {spec.recommended} family for {task}: {spec.why}." if spec
                  else "This task is not in hftoolkit's task table, so no family is recommended.")
        winners = [runs[i] for i in members if i in best]
        if winners and spec:
            fits = ", of the recommended family" if all(r.family == spec.recommended for r in winners) else ""
            shown = ", ".join(f"{r.label} ({r.family or 'unknown family'})" for r in winners)
            advice += f" Best {metric} here: {shown}{fits}."
        safe = re.sub(r"[^A-Za-z0-9.]+", "-", f"{task or 'unknown'}-{metric or 'none'}").strip("-")
        found.append(SameTask(task, metric, runs[members[0]].greater_is_better, members,
                              {short: pareto_best(runs, members, attr) for attr, short, _ in COSTS}, advice,
                              f"same-task-{safe}.png"))
    return found


def same_task_table(runs: list[RunSummary], comparison: SameTask) -> tuple[list[str], list[list[str]]]:
    """Header and display rows: run, family, checkpoint, main metric, costs, Pareto-best."""
    arrow = "↑" if comparison.greater_is_better else "↓"
    spec = tasks.find(comparison.task)
    header = ["run", "family", "checkpoint", f"{comparison.metric or 'main metric'} {arrow}", "trainable params",
              "train time", "peak memory", "Pareto-best"]
    rows = []
    for i in comparison.members:
        run = runs[i]
        family = run.family or DASH
        if spec and run.family == spec.recommended:
            family += " (recommended)"
        ranked = run.eval_final and run.main_value is not None
        metric = format_value(run.main_value) if ranked else (run.status if run.status != "complete" else None) or DASH
        axes = [short for _, short, _ in COSTS if i in comparison.pareto[short]]
        pareto = ("yes: " + ", ".join(axes) if axes else "no") if ranked else DASH
        rows.append([run.label, family, run.checkpoint or DASH, metric, format_count(run.trainable_params),
                     format_seconds(run.train_seconds), format_memory(run.peak_memory_mb), pareto])
    return header, rows


def render_markdown(runs: list[RunSummary], plots: list[str], study: dict | None = None) -> str:
    rows = summary_rows(runs)
    footnotes, body = [], []
    for run, row in zip(runs, rows):
        refs = []
        for note in run.notes:
            footnotes.append(f"{run.label}: {note}")
            refs.append(f"[{len(footnotes)}]")
        body.append([*list(row.values())[:-1], " ".join(refs)])
    parts = ["# hftoolkit comparison report", "",
             f"{len(runs)} run(s). {BEST} marks the best run of each task by its main metric "
             "(↑ higher is better, ↓ lower is better); runs without a finished metrics.json are not ranked.",
             "", _markdown_table(list(rows[0].keys()), body), ""]
    if footnotes:
        parts += ["Notes:", ""] + [f"[{i}] {note}" for i, note in enumerate(footnotes, 1)] + [""]
    if study is not None:  # (a search's sweep folder: report_study.py)
        from hftoolkit.runs import report_study

        parts += report_study.markdown(study, _markdown_table)
    for task, header, table in _eval_tables(runs):
        parts += [f"## Eval metrics: {task}", "", _markdown_table(header, table), ""]
    for comparison in same_task_comparisons(runs):
        header, table = same_task_table(runs, comparison)
        parts += [f"## {comparison.title}", "", comparison.advice, "", _markdown_table(header, table), "",
                  PARETO_NOTE.format(metric=comparison.metric), ""]
        if comparison.figure in plots:
            parts += [f"![{comparison.title}]({comparison.figure})", ""]
    table = benchmark_table(runs)
    if table is not None:
        parts += ["## Benchmarks", "", BENCHMARK_NOTE, "", _markdown_table(*table), ""]
        if BENCHMARK_PLOT[0] in plots:
            parts += [f"![{BENCHMARK_PLOT[1]}]({BENCHMARK_PLOT[0]})", ""]
    table = exports_table(runs)
    if table is not None:
        parts += ["## Exports", "", EXPORTS_NOTE, "", _markdown_table(*table), ""]
    if PREFERENCE_PLOT[0] in plots:
        parts += [f"## {PREFERENCE_PLOT[1]}", "", PREFERENCE_NOTE, "", f"![{PREFERENCE_PLOT[1]}]({PREFERENCE_PLOT[0]})",
                  ""]
    if REWARDS_PLOT[0] in plots:
        parts += [f"## {REWARDS_PLOT[1]}", "", REWARDS_NOTE, "", f"![{REWARDS_PLOT[1]}]({REWARDS_PLOT[0]})", ""]
    for filename, title in PLOTS:
        if filename in plots:
            parts += [f"## {title}", "", f"![{title}]({filename})", ""]
    return "\n".join(parts)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0} td.cell{white-space:nowrap} tr.best td{background:#fff6d5}
tr.baseline td{background:#eef3f8;font-style:italic}
td.notes{font-size:12px;color:#555;min-width:13em;max-width:28em}
img{max-width:100%;display:block;margin:1em 0}"""


def render_html(runs: list[RunSummary], out: Path, plots: list[str], study: dict | None = None) -> str:
    """One self-contained page: inline CSS, images as base64 data URIs, nothing fetched."""
    esc = html.escape
    rows = summary_rows(runs)
    best = best_per_task(runs)
    head = "".join(f"<th>{esc(k)}</th>" for k in rows[0])
    body = "".join(
        f'<tr class="run{" best" if i in best else ""}{"" if run.trained else " baseline"}">'
        + "".join(_cell(k, v) for k, v in row.items() if k != "notes")
        + f'<td class="notes">{"<br>".join(esc(note) for note in run.notes)}</td></tr>'
        for i, (run, row) in enumerate(zip(runs, rows)))
    parts = [f"<h2>Runs</h2><p>{len(runs)} run(s). {BEST} marks the best run of each task by its main metric "
             "(↑ higher is better, ↓ lower is better); runs without a finished metrics.json are not ranked.</p>",
             f'<table id="runs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>']
    if study is not None:
        from hftoolkit.runs import report_study

        parts.append(report_study.html_section(study, out, _image, _html_table))
    for task, header, table in _eval_tables(runs):
        parts.append(f"<h2>Eval metrics: {esc(task)}</h2>" + _html_table(header, table))
    for comparison in same_task_comparisons(runs):
        header, table = same_task_table(runs, comparison)
        parts.append(f'<section class="same-task"><h2>{esc(comparison.title)}</h2><p>{esc(comparison.advice)}</p>'
                     + _html_table(header, table) + f"<p>{esc(PARETO_NOTE.format(metric=comparison.metric))}</p>")
        if comparison.figure in plots:
            parts.append(_image(out, comparison.figure, comparison.title))
        parts.append("</section>")
    table = benchmark_table(runs)
    if table is not None:
        header, rows_ = table
        parts.append(f'<section id="benchmarks"><h2>Benchmarks</h2><p>{esc(BENCHMARK_NOTE)}</p>'
                     + _html_table(header, rows_)
                     + (_image(out, *BENCHMARK_PLOT) if BENCHMARK_PLOT[0] in plots else "") + "</section>")
    table = exports_table(runs)
    if table is not None:
        header, rows_ = table
        parts.append(f'<section id="exports"><h2>Exports</h2><p>{esc(EXPORTS_NOTE)}</p>'
                     + _html_table(header, rows_) + "</section>")
    if PREFERENCE_PLOT[0] in plots:
        parts.append(f'<section id="preference"><h2>{esc(PREFERENCE_PLOT[1])}</h2><p>{esc(PREFERENCE_NOTE)}</p>'
                     + _image(out, *PREFERENCE_PLOT) + "</section>")
    if REWARDS_PLOT[0] in plots:
        parts.append(f'<section id="rewards"><h2>{esc(REWARDS_PLOT[1])}</h2><p>{esc(REWARDS_NOTE)}</p>'
                     + _image(out, *REWARDS_PLOT) + "</section>")
    for filename, title in PLOTS:
        if filename in plots:
            parts.append(f"<h2>{esc(title)}</h2>" + _image(out, filename, title))
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<link rel="icon" href="data:,"><title>hftoolkit comparison report</title>'
            f"<style>{_CSS}</style></head><body><h1>hftoolkit comparison report</h1>"
            + "".join(parts) + "</body></html>\n")


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    esc = html.escape
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


# A run table cell longer than this is shortened in the page (paths to their last folders), whole on hover.
CELL_LENGTH = 40


def _cell(column: str, value: str) -> str:
    from hftoolkit.base.text_width import short_path

    esc = html.escape
    if len(value) <= CELL_LENGTH or column in ("main metric", "run"):  # (a run's label tells it from the others)
        return f'<td class="cell">{esc(value)}</td>'
    return f'<td class="cell" title="{esc(value)}">{esc(short_path(value, CELL_LENGTH))}</td>'


def _image(out: Path, filename: str, title: str) -> str:
    data = base64.b64encode((out / filename).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'


def write_report(run_dirs: list[Path], out: Path) -> Path:
    """Write report.md, report.html and the PNG plots for run_dirs into out; return report.md."""
    if not run_dirs:
        raise ReportError("no run directories were given; pass at least one, such as runs/<name>.")
    runs = _order([load_run(path) for path in run_dirs])
    _label(runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from hftoolkit.runs import report_plots

    plots = report_plots.write_plots(runs, out)
    for comparison in same_task_comparisons(runs):
        report_plots.plot_same_task(runs, comparison.members, comparison.pareto, out / comparison.figure)
        plots.append(comparison.figure)
    if any(run.benchmarks for run in runs):
        report_plots.plot_benchmarks(runs, out / BENCHMARK_PLOT[0])
        plots.append(BENCHMARK_PLOT[0])
    if any(run.margin_curve for run in runs):
        report_plots.plot_preference(runs, out / PREFERENCE_PLOT[0])
        plots.append(PREFERENCE_PLOT[0])
    if any(run.rl_curves for run in runs):
        report_plots.plot_rewards(runs, out / REWARDS_PLOT[0])
        plots.append(REWARDS_PLOT[0])
    from hftoolkit.runs.report_study import read_study

    study = read_study(out)  # a search's study.json, beside its trials
    from hftoolkit.runs.rundir import write_text_atomic  # (secrets masked: a report is attached and shared)

    write_text_atomic(out / "report.html", render_html(runs, out, plots, study))
    return write_text_atomic(out / "report.md", render_markdown(runs, plots, study))
