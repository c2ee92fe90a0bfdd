"""The comparison report's PNG plots, drawn with matplotlib's object API on the Agg canvas.

matplotlib is imported inside the functions (never pyplot, so no global figure state and no
backend switch in the caller's process). Every plot is always written; a plot without data
says so on its canvas, and a run missing a value shows an empty bar labelled with a dash.
"""

from __future__ import annotations

from pathlib import Path

from hftoolkit.runs.summary import COSTS, DASH, RunSummary, best_per_task, format_count, format_seconds, lora_cell

LOG_SPAN = 10.0  # log y for losses spanning more than one decade


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _colors(count: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(count)]


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _save(figure, path: Path) -> None:
    figure.savefig(path, format="png", metadata={"Software": None})


def _no_data(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="0.4")
    axes.set_xticks([])
    axes.set_yticks([])


def _barh(axes, labels: list[str], values: list[float | None], fmt, colors=None, highlight=(), faint=()):
    """Horizontal bars, one per label; a None value is an empty bar with a dash beside it.

    Bars at indices in highlight get a black edge (best run); in faint, a hatched pale fill (interim).
    """
    positions = list(range(len(labels)))[::-1]  # first run on top
    heights = [v if v is not None else 0.0 for v in values]
    bars = axes.barh(positions, heights, color=colors, height=0.6)
    for index, (bar, value) in enumerate(zip(bars, values)):
        if index in highlight:
            bar.set_edgecolor("black")
            bar.set_linewidth(1.5)
        if index in faint:
            bar.set_alpha(0.45)
            bar.set_hatch("//")
        text = fmt(value) if value is not None else DASH
        axes.annotate(text, (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                      xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    axes.set_yticks(positions, labels, fontsize=8)
    axes.set_ylim(-0.6, len(labels) - 0.4)
    if any(v is not None and v > 0 for v in values):
        axes.set_xlim(0, 1.25 * max(v for v in values if v is not None))


def plot_loss(runs: list[RunSummary], path: Path) -> None:
    """Training loss against step, every run overlaid."""
    figure = _figure(9.5, 4.8)
    axes = figure.add_subplot()
    curves = [(run, run.loss_curve, color) for run, color in zip(runs, _colors(len(runs))) if run.loss_curve]
    styles = ["-", "--", ":", "-."]
    for index, (run, curve, color) in enumerate(curves):
        steps, losses = zip(*sorted(curve))
        axes.plot(steps, losses, styles[(index // 10) % 4], color=color, label=run.label,
                  marker="o" if len(steps) < 3 else None, linewidth=1.5)
    if not curves:
        _no_data(axes, "no training loss logged in any run")
    else:
        losses = [loss for _, curve, _ in curves for _, loss in curve]
        if min(losses) > 0 and max(losses) / min(losses) > LOG_SPAN:
            axes.set_yscale("log")
        axes.set_xlabel("step")
        axes.set_ylabel("training loss" + (" (log scale)" if axes.get_yscale() == "log" else ""))
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    missing = [run.label for run in runs if not run.loss_curve]
    if curves and missing:
        figure.text(0.01, 0.005, "no loss logged: " + ", ".join(missing), fontsize=7, color="0.4")
    axes.set_title("Training loss")
    _save(figure, path)


def plot_eval(runs: list[RunSummary], best: set[int], path: Path) -> None:
    """Eval main metric per run, one subplot per (task, metric): different tasks never share an axis."""
    groups: dict[tuple, list[int]] = {}
    for index, run in enumerate(runs):
        groups.setdefault((run.task, run.main_metric), []).append(index)
    columns = min(len(groups), 2)
    rows = -(-len(groups) // columns)
    tallest = max(len(members) for members in groups.values())
    figure = _figure(6 * columns, max(2.2, 0.45 * tallest + 1.3) * rows)
    colors = _colors(len(runs))  # one colour per run, the same in every plot
    for position, ((task, metric), members) in enumerate(groups.items(), 1):
        axes = figure.add_subplot(rows, columns, position)
        labels = [runs[i].label + (" ★" if i in best else "")
                  + (" (interim)" if runs[i].main_value is not None and not runs[i].eval_final else "")
                  for i in members]
        values = [runs[i].main_value for i in members]
        _barh(axes, labels, values, _fmt, [colors[i] for i in members],
              highlight={n for n, i in enumerate(members) if i in best},
              faint={n for n, i in enumerate(members) if not runs[i].eval_final})
        direction = "higher" if runs[members[0]].greater_is_better else "lower"
        axes.set_title(f"{task or 'unknown task'}: {metric or 'no main metric'} ({direction} is better)",
                       fontsize=10)
        axes.grid(True, axis="x", alpha=0.3)
    _save(figure, path)


def plot_params(runs: list[RunSummary], path: Path) -> None:
    """Trainable against total parameters on log axes, each point labelled with run and LoRA rank."""
    figure = _figure(8, 5)
    axes = figure.add_subplot()
    known = [(run, color) for run, color in zip(runs, _colors(len(runs)))
             if run.trainable_params and run.total_params]
    points: dict[tuple[int, int], list[str]] = {}  # runs at the same point share one label
    for run, color in known:
        axes.scatter(run.total_params, run.trainable_params, color=color, s=40, zorder=3)
        points.setdefault((run.total_params, run.trainable_params), []).append(
            f"{run.label} (r={lora_cell(run)})")
    offsets = label_offsets(list(points))
    for ((total, trainable), names), (dx, dy) in zip(points.items(), offsets):
        axes.annotate("\n".join(names), (total, trainable), xytext=(dx, dy), textcoords="offset points",
                      fontsize=8, va="center",
                      arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5} if dy else None)
    if not known:
        _no_data(axes, "no parameter counts in any run")
    else:
        axes.set_xscale("log")
        axes.set_yscale("log")
        low = min(min(r.trainable_params, r.total_params) for r, _ in known) / 3
        high = max(r.total_params for r, _ in known) * 3
        axes.plot([low, high], [low, high], ":", color="0.5", label="all parameters trainable")
        axes.set_xlim(low, high)
        axes.set_ylim(low, high)
        axes.set_xlabel("total parameters (log)")
        axes.set_ylabel("trainable parameters (log)")
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(fontsize=8, loc="upper left")
    missing = [run.label for run in runs if not (run.trainable_params and run.total_params)]
    if known and missing:
        figure.text(0.01, 0.005, "no parameter counts: " + ", ".join(missing), fontsize=7, color="0.4")
    axes.set_title("Trainable vs total parameters")
    _save(figure, path)


LABEL_STEP = 11  # points between the labels of neighbouring points: one line of 8-point text and a gap
NEAR = 0.25  # decades on both log axes within which two points' labels would overlap


def label_offsets(points: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """(dx, dy) in points for each point's label: beside the point, and where points lie near one another on the
    log axes, their labels stacked apart (above and below in turn), so overlapping runs stay legible."""
    import math

    logs = [(math.log10(max(x, 1)), math.log10(max(y, 1))) for x, y in points]
    offsets = []
    for i, (lx, ly) in enumerate(logs):
        near = sum(abs(lx - ox) < NEAR and abs(ly - oy) < NEAR for ox, oy in logs[:i])
        shift = (near + 1) // 2 * LABEL_STEP * (1 if near % 2 else -1)
        offsets.append((6, shift))
    return offsets


def plot_resources(runs: list[RunSummary], path: Path) -> None:
    """Peak memory, samples/s, tokens/s and wall time (train and eval) per run, as bars."""
    figure = _figure(12, max(3.5, 0.35 * len(runs) + 1.5) * 2)
    labels = [run.label for run in runs]
    colors = _colors(len(runs))
    panels = (
        ("peak memory (MB)", [run.peak_memory_mb for run in runs], lambda v: f"{v:,.0f}"),
        ("throughput (samples/s)", [run.samples_per_second for run in runs], _fmt),
        ("throughput (tokens/s)", [run.tokens_per_second for run in runs], _fmt),
    )
    for position, (title, values, fmt) in enumerate(panels, 1):
        axes = figure.add_subplot(2, 2, position)
        _barh(axes, labels, values, fmt, colors)
        axes.set_title(title, fontsize=10)
        axes.grid(True, axis="x", alpha=0.3)
    axes = figure.add_subplot(2, 2, 4)
    train = [run.train_seconds for run in runs]
    _barh(axes, labels, [None if t is None else t + (run.eval_seconds or 0) for t, run in zip(train, runs)],
          format_seconds, colors)
    evals = [run.eval_seconds if t is not None and run.eval_seconds else 0.0 for t, run in zip(train, runs)]
    axes.barh(list(range(len(runs)))[::-1], evals, left=[t or 0.0 for t in train], height=0.6,
              color="0.8", label="eval part")
    axes.legend(fontsize=7, loc="lower right")
    axes.set_title("wall time: train + eval", fontsize=10)
    axes.grid(True, axis="x", alpha=0.3)
    _save(figure, path)


def plot_same_task(runs: list[RunSummary], members: list[int], pareto: dict[str, set[int]], path: Path) -> None:
    """One task's main metric against trainable parameters, train time and peak memory: three panels, the
    Pareto-best runs of each ringed and joined by their front; one colour per run, as in the other plots."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    first = runs[members[0]]
    greater = first.greater_is_better
    metric = f"{first.main_metric or 'main metric'} ({'higher' if greater else 'lower'} is better)"
    ranked = [i for i in members if runs[i].eval_final and runs[i].main_value is not None]
    colors = _colors(len(runs))
    figure = _figure(15, 4.6)
    for position, (attr, short, title) in enumerate(COSTS, 1):
        axes = figure.add_subplot(1, 3, position)
        shown = [i for i in ranked if getattr(runs[i], attr) is not None]
        if not shown:
            _no_data(axes, f"no run has both {first.main_metric or 'a main metric'} and {title}")
            axes.set_title(f"{first.main_metric or 'main metric'} vs {title}", fontsize=10)
            continue
        for i in shown:
            best = i in pareto[short]
            axes.scatter(getattr(runs[i], attr), runs[i].main_value, color=colors[i], zorder=3,
                         s=90 if best else 45, edgecolors="black" if best else "none", linewidths=1.5)
        front = sorted((getattr(runs[i], attr), runs[i].main_value) for i in shown if i in pareto[short])
        if len(front) > 1:
            axes.step(*zip(*front), where="post", color="0.4", linestyle="--", linewidth=1, zorder=2)
        costs = [getattr(runs[i], attr) for i in shown]
        if attr == "trainable_params" and min(costs) > 0 and max(costs) / min(costs) > LOG_SPAN:
            axes.set_xscale("log")
        else:
            axes.xaxis.set_major_locator(MaxNLocator(nbins=5))
        if attr == "trainable_params":
            axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_count(round(value))))
        axes.set_xlabel(title + (" (log scale)" if axes.get_xscale() == "log" else ""))
        axes.set_ylabel(metric)
        axes.set_title(f"{first.main_metric or 'main metric'} vs {title}", fontsize=10)
        axes.grid(True, alpha=0.3)
        axes.margins(0.15)
        missing = [runs[i].label for i in ranked if i not in shown]
        if missing:
            axes.text(0.01, 0.01, f"no {title}: " + ", ".join(missing), transform=axes.transAxes, fontsize=7,
                      color="0.4")
    handles = [Line2D([], [], marker="o", linestyle="", color=colors[i], label=runs[i].label) for i in ranked]
    handles += [Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor="black",
                       markeredgewidth=1.5, markersize=9, label="Pareto-best"),
                Line2D([], [], color="0.4", linestyle="--", label="Pareto front")]
    figure.legend(handles=handles, loc="outside right upper", fontsize=8)
    unranked = [runs[i].label for i in members if i not in ranked]
    if unranked:
        figure.text(0.01, 0.005, "not shown (no finished main metric): " + ", ".join(unranked), fontsize=7,
                    color="0.4")
    figure.suptitle(f"{first.task or 'unknown task'}: {metric}", fontsize=11)
    _save(figure, path)


def plot_benchmarks(runs: list[RunSummary], path: Path) -> None:
    """One panel per benchmark task: a bar per run with its stderr; an untrained base hatched, its value a
    dashed line across the panel, so each tuned run reads against it."""
    members = [run for run in runs if run.benchmarks]
    tasks = list(dict.fromkeys(task for run in members for task in run.benchmarks))
    figure = _figure(4.0 * len(tasks) + 1.0, 0.45 * len(members) + 1.6)
    colors = _colors(len(members))
    for axes, task in zip(figure.subplots(1, len(tasks), squeeze=False)[0], tasks):
        shown = [(i, run) for i, run in enumerate(members) if task in run.benchmarks]
        positions = list(range(len(shown)))[::-1]
        values = [run.benchmarks[task]["value"] for _, run in shown]
        errors = [run.benchmarks[task].get("stderr") if isinstance(run.benchmarks[task].get("stderr"), float)
                  else 0.0 for _, run in shown]
        bars = axes.barh(positions, values, xerr=errors, color=[colors[i] for i, _ in shown], height=0.6,
                         capsize=3)
        for bar, (_, run), value, error in zip(bars, shown, values, errors):
            if not run.trained:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
                axes.axvline(value, color="0.3", linestyle="--", linewidth=1)
            axes.text(value + error, bar.get_y() + bar.get_height() * 0.8, f" {value:.3f}", va="center", fontsize=8)
        axes.set_yticks(positions, [run.label + ("" if run.trained else " (base)") for _, run in shown],
                        fontsize=8)
        axes.set_title(task, fontsize=9)
        axes.set_xlabel(str(shown[0][1].benchmarks[task].get("metric")))
        axes.set_xlim(0, max(1.0, max(v + e for v, e in zip(values, errors)) * 1.1))
    _save(figure, path)


def plot_preference(runs: list[RunSummary], path: Path) -> None:
    """Preference and reward runs: the training loss and the chosen-minus-rejected reward margin against step, side by
    side."""
    members = [run for run in runs if run.margin_curve]
    figure = _figure(11.0, 4.2)
    panels = figure.subplots(1, 2)
    for axes, curve_of, label in ((panels[0], "loss_curve", "training loss"),
                                  (panels[1], "margin_curve", "reward margin (chosen - rejected)")):
        for run, color in zip(members, _colors(len(members))):
            steps, values = zip(*sorted(getattr(run, curve_of)))
            axes.plot(steps, values, color=color, label=run.label, marker="o" if len(steps) < 3 else None)
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    panels[1].axhline(0, color="0.5", linewidth=0.8)
    panels[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle("Preference and reward models: loss and reward margin")
    _save(figure, path)


def plot_rewards(runs: list[RunSummary], path: Path) -> None:
    """grpo runs: each reward's mean over the step's sampled answers (the band: one spread either side), the answers'
    mean length and the KL to the reference, against step."""
    members = [run for run in runs if run.rl_curves]
    lines = sum(1 + sum(name.startswith("reward ") for name in run.rl_curves) for run in members)
    figure = _figure(14.0, 4.2 + 0.09 * lines)
    panels = figure.subplots(1, 3)
    colors = _colors(len(members))
    for run, color in zip(members, colors):
        rewards = sorted(name for name in run.rl_curves if name.startswith("reward "))
        for name, style in zip(["reward", *rewards], ["-", "--", ":", "-.", (0, (1, 3))] * 4):
            steps, means, spreads = zip(*sorted(run.rl_curves.get(name, [])), strict=True) if name in run.rl_curves \
                else ((), (), ())
            if not steps:
                continue
            label = f"{run.label}: {'sum' if name == 'reward' else name.removeprefix('reward ')}"
            panels[0].plot(steps, means, color=color, linestyle=style, label=label,
                           marker="o" if len(steps) < 3 else None)
            if all(s is not None for s in spreads):
                panels[0].fill_between(steps, [m - s for m, s in zip(means, spreads)],
                                       [m + s for m, s in zip(means, spreads)], color=color, alpha=0.08)
        for axes, name in ((panels[1], "answer length"), (panels[2], "kl")):
            if name in run.rl_curves:
                steps, means, _ = zip(*sorted(run.rl_curves[name]), strict=True)
                axes.plot(steps, means, color=color, label=run.label, marker="o" if len(steps) < 3 else None)
    for axes, label in zip(panels, ("reward of the sampled answers", "answer length (tokens)", "KL to the reference")):
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    if not any("kl" in run.rl_curves for run in members):
        _no_data(panels[2], "no KL term (rl.beta 0)")
    figure.legend(*panels[0].get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncol=2)
    figure.suptitle("Online RL: rewards, answer length and KL per step")
    _save(figure, path)


def write_plots(runs: list[RunSummary], out: Path) -> list[str]:
    """Draw every plot into out; return the file names written."""
    plot_loss(runs, out / "loss.png")
    plot_eval(runs, best_per_task(runs), out / "eval.png")
    plot_params(runs, out / "params.png")
    plot_resources(runs, out / "resources.png")
    return ["loss.png", "eval.png", "params.png", "resources.png"]
