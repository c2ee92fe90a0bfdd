"""What a run directory says about its run, read tolerantly, and how its values are shown.

Imports no torch or transformers. A run that is incomplete, written by an older version, missing fields or
holding malformed JSON lines is read with what is known and a note; only a path that is not a run directory at
all raises `ReportError`. Used by the comparison report, its plots and `hftoolkit runs`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hftoolkit.base.run_layout import HISTORY, MANIFEST, METRICS, RECIPE
from hftoolkit.config import tasks
from hftoolkit.runs.record import FIELDS as METRICS_FIELDS
from hftoolkit.runs.rundir import RunDirectory, run_folder_problem

RUN_FILES = (MANIFEST, METRICS, HISTORY)
DASH = "–"
BEST = "★"
# Used only when metrics.json does not name the main metric (older or unfinished runs).
# Trainer's bookkeeping in eval records, not quality metrics.
EVAL_BOOKKEEPING = {"runtime", "samples_per_second", "steps_per_second", "epoch", "step"}

class ReportError(ValueError):
    """A report input that is not a run directory; the message names the path and the fix."""


@dataclass
class RunSummary:
    """What one run directory says about its run; None wherever the directory does not say."""

    path: Path
    name: str
    status: str | None = None
    started: str | None = None  # manifest.json's start time (ISO 8601)
    error: str | None = None  # the first line of a failed run's error
    family: str | None = None
    task: str | None = None
    checkpoint: str | None = None
    quantization: str | None = None
    lora_rank: int | None = None
    lora_known: bool = False  # False: no lora_rank field at all; True with None: no LoRA
    main_metric: str | None = None
    greater_is_better: bool = True
    eval: dict[str, float] = field(default_factory=dict)
    eval_final: bool = False  # eval came from a finished metrics.json, so the run is ranked
    train_seconds: float | None = None
    eval_seconds: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    peak_memory_mb: float | None = None
    planned_peak_mb: float | None = None  # what `hftoolkit plan` predicted for the main process (manifest.json)
    trainable_params: int | None = None
    total_params: int | None = None
    hftoolkit_version: str | None = None
    loss_curve: list[tuple[float, float]] = field(default_factory=list)  # (step, training loss)
    margin_curve: list[tuple[float, float]] = field(default_factory=list)  # preference: (step, reward margin)
    # grpo: what the sampled answers measured per step, by curve ("reward", "reward <name>" for each reward,
    # "answer length", "kl"): (step, mean, spread or None)
    rl_curves: dict[str, list[tuple[float, float, float | None]]] = field(default_factory=dict)
    trained: bool = True  # False: a recipe's untrained base (`eval RECIPE --output`), the baseline
    benchmarks: dict[str, dict] = field(default_factory=dict)  # metrics.json's benchmarks: task -> record
    exports: list[dict] = field(default_factory=list)  # manifest.json's exports: format, quantization, path, check
    notes: list[str] = field(default_factory=list)
    label: str = ""  # unique display name among the runs of one report

    @property
    def main_value(self) -> float | None:
        """The eval value of the main metric, or None when unknown or not finite."""
        return self.eval.get(self.main_metric) if self.main_metric else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    number = _num(value)
    return int(number) if number is not None and number == int(number) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _read_json(path: Path, notes: list[str]) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        notes.append(f"{path.name} is unreadable or not valid JSON ({exc}); ignored")
        return None
    if not isinstance(data, dict):
        notes.append(f"{path.name} does not hold a JSON object; ignored")
        return None
    return data


def _read_log_history(path: Path, notes: list[str]) -> list[dict]:
    if not path.is_file():
        return []
    lines, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            entry = None
        if isinstance(entry, dict):
            lines.append(entry)
        else:
            bad.append(number)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        notes.append(f"skipped {len(bad)} malformed line(s) in log_history.jsonl (line {shown})")
    return lines


def recipe_settings(path: Path) -> dict[str, Any]:
    """A run directory's recipe.yaml as dotted keys (`preference.method` -> "orpo"; a list is one value); {} where
    it has none, or none that reads as a mapping."""
    try:
        import yaml

        data = yaml.safe_load((Path(path) / RECIPE).read_text(encoding="utf-8"))
    except Exception:  # a label's source only: any failure means "recipe says nothing"
        return {}
    flat: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    if isinstance(data, dict):
        walk(data, "")
    return flat


def _read_recipe(path: Path) -> dict:
    """Best effort: name, task, checkpoint, quantization, LoRA rank from recipe.yaml."""
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # a fallback only: any failure means "recipe says nothing"
        return {}
    if not isinstance(data, dict):
        return {}
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    lora = data.get("lora") if isinstance(data.get("lora"), dict) else {}
    family = model.get("family") or data.get("family") or family_of_checkpoint(model.get("checkpoint") if isinstance(
        model.get("checkpoint"), str) else None)
    return {"name": data.get("name"), "family": family, "task": data.get("task"),
            "checkpoint": model.get("checkpoint"),
            "quantization": model.get("quantization"),
            "lora_rank": lora.get("r") if lora.get("enabled", True) else None}


def _eval_metrics(raw: dict) -> dict[str, float]:
    """Finite numeric metrics, eval_ prefix dropped, Trainer bookkeeping left out."""
    named = {str(key).removeprefix("eval_"): _num(value) for key, value in raw.items()}
    return {key: value for key, value in named.items() if value is not None and key not in EVAL_BOOKKEEPING}


def _current_version() -> str | None:
    try:
        from hftoolkit import __version__
    except ImportError:
        return None
    return __version__


def load_run(path: Path | str, read_history: bool = True) -> RunSummary:
    """Read one run directory into a RunSummary; raises ReportError if it is not one.

    Reads only what a run directory holds: manifest.json, metrics.json, log_history.jsonl and, as a last resort
    for name, task and checkpoint, recipe.yaml.

    read_history=False skips log_history.jsonl (the loss curve, the bulk of a long run's files) unless the
    eval must come from it: listing many runs needs only their results.
    """
    path = Path(path)
    problem = run_folder_problem(path, needs=RUN_FILES)
    if problem:
        raise ReportError(problem)
    notes: list[str] = []
    manifest = _read_json(path / MANIFEST, notes)
    metrics = _read_json(path / METRICS, notes)
    finished = metrics is not None and isinstance(metrics.get("eval"), dict)
    history = _read_log_history(path / HISTORY, notes) if read_history or not finished else []
    recipe = _read_recipe(path / RECIPE) if metrics is None or not metrics.get("task") else {}
    source = {**{k: v for k, v in recipe.items() if v is not None}, **(metrics or {})}

    run = RunSummary(path=path, name=_str(source.get("name")) or path.name)
    run.status = _str((manifest or {}).get("status"))
    if run.status == "running" and RunDirectory(path).holder() is None:
        run.status = "interrupted"  # its writer ended without a word (killed, its machine lost)
    run.started = _str((manifest or {}).get("started"))
    error = (_str((manifest or {}).get("error")) or "").strip()
    run.error = error.splitlines()[0] if run.status == "failed" and error else None
    for attr in ("family", "task", "checkpoint", "quantization", "main_metric"):
        setattr(run, attr, _str(source.get(attr)))
    run.lora_rank = _int(source.get("lora_rank"))
    run.lora_known = "lora_rank" in source and (source["lora_rank"] is None or run.lora_rank is not None)
    for attr in ("train_seconds", "eval_seconds", "samples_per_second", "tokens_per_second", "peak_memory_mb"):
        setattr(run, attr, _num(source.get(attr)))
    plan = (manifest or {}).get("plan")
    run.planned_peak_mb = _num(plan.get("planned_peak_mb")) if isinstance(plan, dict) else None
    run.trainable_params = _int(source.get("trainable_params"))
    run.total_params = _int(source.get("total_params"))
    run.trained = source.get("trained") is not False
    run.benchmarks = {k: v for k, v in (source.get("benchmarks") or {}).items()
                      if isinstance(v, dict) and _num(v.get("value")) is not None}
    run.exports = [e for e in (manifest or {}).get("exports") or [] if isinstance(e, dict) and _str(e.get("format"))]
    run.hftoolkit_version = _str(source.get("hftoolkit_version")) or _str((manifest or {}).get("hftoolkit_version"))
    _note_files(run, manifest, metrics, notes)
    _read_eval(run, metrics, history, notes)
    for entry in history:
        step, loss, margin = (_num(entry.get(key)) for key in ("step", "loss", "reward_margin"))
        if step is not None and loss is not None:
            run.loss_curve.append((step, loss))
        if step is not None and margin is not None:
            run.margin_curve.append((step, margin))
        if step is not None:
            _read_rl_step(run, step, entry)
    run.notes = notes
    return run


def _read_rl_step(run: RunSummary, step: float, entry: dict) -> None:
    """A grpo step's sampled answers, as TRL logs them: the summed reward and each reward's mean and spread, the
    answers' mean length, the KL to the reference."""
    found = {"reward": ("reward", "reward_std"), "answer length": ("completions/mean_length", None), "kl": ("kl", None)}
    found.update({f"reward {key.split('/')[1]}": (key, key.removesuffix("/mean") + "/std") for key in entry
                  if key.startswith("rewards/") and key.endswith("/mean")})
    if "reward" not in entry:  # (only a grpo step logs "reward")
        return
    for curve, (mean_key, spread_key) in found.items():
        mean = _num(entry.get(mean_key))
        if mean is not None:
            spread = _num(entry.get(spread_key)) if spread_key else None
            run.rl_curves.setdefault(curve, []).append((step, mean, spread))


def export_name(export: dict) -> str:
    """`gguf q8_0`, `onnx`: what an export is, in a table cell."""
    return " ".join(str(export[k]) for k in ("format", "quantization") if export.get(k))


def _note_files(run: RunSummary, manifest: dict | None, metrics: dict | None, notes: list[str]) -> None:
    """Notes on what the run's files lack or hold that a reader should know."""
    if manifest is None and not any(MANIFEST in n for n in notes):
        notes.append("no manifest.json")
    if run.status in ("running", "interrupted", "stopped", "failed", "trained, eval failed"):
        error_lines = (_str((manifest or {}).get("error")) or "").strip().splitlines()
        notes.append(f"status {run.status}" + (f": {error_lines[-1][:160]}" if error_lines else ""))
    if run.status == "pruned":  # a search trial its study stopped early: kept, never finished
        notes.append(f"pruned by its study: {_str((manifest or {}).get('pruned')) or 'at an eval'}")
    elif metrics is None:
        if not any(METRICS in n for n in notes):
            notes.append("no metrics.json: run did not finish" if run.status != "complete"
                         else "no metrics.json although manifest.json says complete")
    else:
        missing = [key for key in METRICS_FIELDS if key not in metrics]
        if missing:
            notes.append(f"metrics.json lacks {', '.join(missing)}")
        unusable = [key for key in METRICS_FIELDS if key != "name" and metrics.get(key) is not None
                    and (not isinstance(metrics[key], dict) if key == "eval" else getattr(run, key) is None)]
        if unusable:
            notes.append(f"metrics.json has unusable values for {', '.join(unusable)}; shown as {DASH}")
    current = _current_version()
    if run.hftoolkit_version and current and run.hftoolkit_version != current:
        notes.append(f"written by hftoolkit {run.hftoolkit_version} (this is {current})")


def _read_eval(run: RunSummary, metrics: dict | None, history: list[dict], notes: list[str]) -> None:
    """The run's eval metrics (metrics.json's, else the last eval logged) and its main metric."""
    if metrics is not None and isinstance(metrics.get("eval"), dict):
        run.eval = _eval_metrics(metrics["eval"])
        run.eval_final = True
    else:
        last_eval = next((e for e in reversed(history) if any(str(k).startswith("eval_") for k in e)), None)
        if last_eval is not None:
            run.eval = _eval_metrics({k: v for k, v in last_eval.items() if str(k).startswith("eval_")})
            notes.append(f"eval from log_history.jsonl (step {last_eval.get('step', '?')}); not ranked")
    spec = tasks.find(run.task)
    if run.main_metric is None and spec is not None:
        run.main_metric = spec.main_metric
        if metrics is not None:
            notes.append(f"main metric {run.main_metric} assumed from task {run.task}")
    if run.main_metric == "perplexity" and "perplexity" not in run.eval and "loss" in run.eval:
        run.eval["perplexity"] = math.exp(min(run.eval["loss"], 700.0))
        notes.append("perplexity computed as exp(eval loss)")
    gib = (metrics or {}).get("greater_is_better")
    run.greater_is_better = gib if isinstance(gib, bool) else run.main_metric not in _lower_is_better()
    if run.main_metric and run.eval and run.main_value is None:
        notes.append(f"eval has no {run.main_metric}")


def best_per_task(runs: list[RunSummary]) -> set[int]:
    """Indices of the best ranked run(s) of each (task, main metric); ties are all marked."""
    groups: dict[tuple, list[int]] = {}
    for index, run in enumerate(runs):
        if run.eval_final and run.main_value is not None and run.trained:  # a baseline is the reference, not a rival
            groups.setdefault((run.task, run.main_metric), []).append(index)
    best: set[int] = set()
    for indices in groups.values():
        pick = max if runs[indices[0]].greater_is_better else min
        target = pick(runs[i].main_value for i in indices)
        best.update(i for i in indices if runs[i].main_value == target)
    return best


# The costs a same-task comparison weighs the main metric against: (RunSummary attribute, short name, axis title).
COSTS = (("trainable_params", "params", "trainable parameters"), ("train_seconds", "time", "train time (s)"),
         ("peak_memory_mb", "memory", "peak memory (MB)"))


def same_task_groups(runs: list[RunSummary]) -> list[tuple[str | None, str | None, list[int]]]:
    """(task, main metric, run indices) for every task with two runs or more, in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for index, run in enumerate(runs):
        groups.setdefault((run.task, run.main_metric), []).append(index)
    return [(task, metric, members) for (task, metric), members in groups.items() if len(members) >= 2]


def pareto_best(runs: list[RunSummary], members: list[int], cost: str) -> set[int]:
    """The ranked runs among members that no other one beats on both the main metric and `cost`.

    A run is beaten when another reaches a main metric as good or better (respecting greater_is_better)
    at a cost as low or lower, and is strictly better on one of the two. Runs without a finished main
    metric or without that cost take no part.
    """
    known = [i for i in members if runs[i].eval_final and runs[i].main_value is not None
             and getattr(runs[i], cost) is not None]
    sign = 1 if runs[members[0]].greater_is_better else -1

    def beats(j: int, i: int) -> bool:
        metric_j, metric_i = sign * runs[j].main_value, sign * runs[i].main_value
        cost_j, cost_i = getattr(runs[j], cost), getattr(runs[i], cost)
        return metric_j >= metric_i and cost_j <= cost_i and (metric_j > metric_i or cost_j < cost_i)

    return {i for i in known if not any(beats(j, i) for j in known if j != i)}


def family_of_checkpoint(checkpoint: str | None) -> str | None:
    """The family of an init: checkpoint, for a run that recorded none (a run records the family it resolved)."""
    from hftoolkit.config.families import static_family

    return static_family(checkpoint) if checkpoint else None


def format_value(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_count(value: int | None) -> str:
    if value is None:
        return DASH
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return str(value)


def format_seconds(value: float | None) -> str:
    if value is None:
        return DASH
    if value < 60:
        return f"{value:.1f} s"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes}m {seconds:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


def format_memory(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value / 1024:.2f} GB" if value >= 1024 else f"{value:.0f} MB"


def memory_cell(run: RunSummary) -> str:
    """The measured peak, with the planned one beside it where the run recorded a plan."""
    measured = format_memory(run.peak_memory_mb)
    return measured if run.planned_peak_mb is None else f"{measured} (plan {format_memory(run.planned_peak_mb)})"


def params_cell(run: RunSummary) -> str:
    text = f"{format_count(run.trainable_params)} / {format_count(run.total_params)}"
    if run.trainable_params is not None and run.total_params:
        percent = 100 * run.trainable_params / run.total_params
        text += f" ({percent:.0f}%)" if percent >= 10 else f" ({percent:.2g}%)"
    return text


def lora_cell(run: RunSummary) -> str:
    if run.lora_rank is not None:
        return str(run.lora_rank)
    return "none" if run.lora_known else DASH


def _lower_is_better() -> set[str]:
    return {task.main_metric for task in tasks.TASKS if not task.greater_is_better} | {"loss"}
