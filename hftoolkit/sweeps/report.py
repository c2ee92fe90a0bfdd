"""What a finished (or stopped) search leaves beside its trials: study.json (the study as the report shows it),
best.yaml (the best trial's recipe, ready to train in full), Optuna's own plots, and the sweep report with its study
section (runs/report_study.py renders it)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from hftoolkit.base.run_layout import MANIFEST
from hftoolkit.runs.rundir import write_text_atomic
from hftoolkit.sweeps import study as ss
from hftoolkit.sweeps.trial import Search

BEST_RECIPE = "best.yaml"
# Optuna's plots (optuna.visualization.matplotlib), each file with its title.
STUDY_PLOTS = {"history": ("study-history.png", "Optimisation history"),
               "importances": ("study-importances.png", "Parameter importances (Optuna's fANOVA)"),
               "slice": ("study-slice.png", "Slice plot: each parameter against the objective")}


def write_search_report(search: Search) -> Path:
    """study.json, best.yaml, the plots and report.md/.html in the sweep folder; returns report.md."""
    from hftoolkit.runs.report import write_report
    from hftoolkit.runs.report_study import STUDY_RECORD

    folder = Path(search.folder)
    study = _load(search)
    record = study_record(search, study)
    record["plots"] = write_study_plots(study, folder)
    record["best_recipe"] = write_best_recipe(search, record.get("best"), folder)
    write_text_atomic(folder / STUDY_RECORD, json.dumps(record, indent=2) + "\n")  # (secrets masked, as in every file)
    runs = sorted(p for p in folder.glob("trial-*") if (p / MANIFEST).is_file())
    if not runs:
        return folder / STUDY_RECORD
    return write_report(runs, folder)


def _load(search: Search):
    import optuna

    with ss.quiet_optuna():
        return optuna.load_study(study_name=search.study, storage=ss.driver_url(search.url))


def study_record(search: Search, study) -> dict:
    """The study as the report shows it: every counted trial with its state, values, time and the compute a pruned
    one saved (its remaining steps at the pace it trained), the best trial, and Optuna's parameter importances."""
    rows = []
    for trial in ss.counted(study.get_trials(deepcopy=False)):
        attrs = trial.user_attrs
        name = attrs.get("run", ss.run_name(trial))
        row = {"number": trial.number, "run": name, "state": trial.state.name.lower(), "value": trial.value,
               "params": trial.params, "seconds": attrs.get("seconds"), "train_seconds": attrs.get("train_seconds"),
               "error": attrs.get("error")}
        if trial.state.name == "PRUNED":
            manifest = _manifest(Path(search.folder) / name)
            step, planned = manifest.get("pruned_at_step"), manifest.get("planned_steps")
            row.update(pruned_at_step=step, planned_steps=planned)
            if step and planned and row["seconds"]:
                row["saved_seconds"] = round(row["seconds"] * (planned - step) / step, 3)
        rows.append(row)
    complete = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    best = None
    if complete:
        pick = max if search.goal.direction == "maximize" else min
        top = pick(complete, key=lambda r: r["value"])
        best = {"run": top["run"], "number": top["number"], "value": top["value"], "params": top["params"]}
    importances, note = None, None
    if len(complete) >= 2 and len(search.params) >= 1:
        try:
            import optuna

            with ss.quiet_optuna(), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # (every trial alike: importances equal, said so)
                importances = {k: round(float(v), 4) for k, v in
                               optuna.importance.get_param_importances(study).items()}
        except (ValueError, RuntimeError) as err:  # (too few trials, or every trial alike)
            note = f"no importances: {str(err).splitlines()[0]}"
    else:
        note = "no importances: they need two complete trials or more"
    return {"study": search.study, "storage": ss.shown(search.url), "sampler": search.sampler,
            "pruner": search.pruner, "objective": {"metric": search.goal.metric, "direction": search.goal.direction},
            "trials": search.trials, "space": search.space.specs(), "best": best, "rows": rows,
            "importances": importances, "importances_note": note,
            "train_seconds": round(sum(r["seconds"] or 0 for r in rows), 3),
            "saved_seconds": round(sum(r.get("saved_seconds") or 0 for r in rows), 3)}


def _manifest(run: Path) -> dict:
    try:
        return json.loads((run / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_best_recipe(search: Search, best: dict | None, folder: Path) -> str | None:
    """best.yaml: the sweep's recipe with the best trial's values, named <recipe>-best, for `hftoolkit train`."""
    if best is None:
        return None
    from hftoolkit.config.recipe import load_recipe, recipe_to_yaml, replaced

    recipe = load_recipe(search.recipe_path, [*search.sets, *search.space.overrides(best["params"])])
    recipe = replaced(recipe, {"name": f"{recipe.name}-best"})
    said = ", ".join(f"{k}={v}" for k, v in best["params"].items())
    write_text_atomic(folder / BEST_RECIPE,  # (secrets masked, as in every file)
                      f"# hftoolkit train {folder / BEST_RECIPE}\n# The best trial of study {search.study} "
                      f"({best['run']}, {search.goal.metric}={best['value']:.4g}): {said}\n" + recipe_to_yaml(recipe))
    return BEST_RECIPE


def write_study_plots(study, folder: Path) -> list[str]:
    """Optuna's matplotlib plots of the study that it can draw (each needs complete trials): their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from optuna.visualization import matplotlib as plots

    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    drawn = []
    makers = {"history": plots.plot_optimization_history, "slice": plots.plot_slice}
    if len(complete) >= 2:
        makers["importances"] = plots.plot_param_importances
    if not complete:
        return drawn
    for key, make in makers.items():
        filename = STUDY_PLOTS[key][0]
        try:
            with ss.quiet_optuna(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = make(study)
                figure = np.ravel(axes)[0].figure
                figure.set_size_inches(max(6.4, figure.get_size_inches()[0]), 4.2)
                figure.tight_layout()
            figure.savefig(folder / filename, dpi=110)
            plt.close(figure)
            drawn.append(filename)
        except (ValueError, RuntimeError):
            continue  # (a plot Optuna can't draw for this study: the section says what there is)
    return drawn
