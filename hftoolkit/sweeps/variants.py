"""The runs of a sweep or bench (variants): each validated and its folder judged before anything trains
(`prepare`), then trained one by one, a failure recorded and the next one going on (`run_variants`). Re-running
picks up where the last run stopped (`_decide`). Light at import: torch and transformers are imported by the
training itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.memory import reset_peak_memory
from hftoolkit.base.run_layout import CHECKPOINTS, METRICS, RECIPE
from hftoolkit.config.recipe import Recipe, RecipeError, load_recipe, recipe_to_yaml, replaced

# Keys a run fills in while it trains (label names found in the data, a hub checkpoint's family): a saved
# recipe that has them where the sweep's recipe leaves them empty is still the same recipe.
FILLED_BY_RUN = ("data.label_names", "model.family")


@dataclass
class Variant:
    """One run of a sweep: its folder name, recipe file, --set overrides, and what a (re-)run does with it."""

    name: str
    recipe_path: Path
    overrides: list[str]
    grid: dict[str, str] = field(default_factory=dict)  # grid key -> its value's text (errors name it --grid)
    recipe: Recipe | None = None
    run_dir: Path | None = None
    action: str = "train"  # train, skip (complete), resume (from a checkpoint), restart (from step 0)


@dataclass
class Outcome:
    variant: Variant
    status: str  # complete, skipped, failed (a search trial: also pruned)
    seconds: float = 0.0
    metric: str | None = None  # "accuracy=0.91"
    error: str | None = None
    value: float | None = None  # a search trial's objective


@dataclass
class SweepResult:
    folder: Path
    report: Path
    outcomes: list[Outcome]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]


# ---------------------------------------------------------------- before anything trains


def prepare(variants: list[Variant], out: Path, overwrite: bool = False, num_processes: int | None = None,
            by_recipe_name: bool = False) -> Path:
    """Validate every variant's recipe, then decide what this run does with each variant's folder.

    The folders are out/<variant name>, or out/<recipe name>/<variant name> with by_recipe_name (a sweep of
    one recipe); returns the folder that holds them. Raises RecipeError listing every problem of every
    variant (a problem shared by all is listed once), then, once the recipes are valid, of every folder.
    """
    from hftoolkit.job.hardware import library_problems
    from hftoolkit.training.strategies import launch_strategy

    found: dict[str, list[str]] = {}  # variant name -> its recipe's problems
    folders = []  # problems of the variants' folders (each line names its folder)
    for variant in variants:
        problems = found.setdefault(variant.name, [])
        grid_items = {f"{k}={v}" for k, v in variant.grid.items()}
        try:
            variant.recipe = load_recipe(variant.recipe_path, variant.overrides)
            launch_strategy(variant.recipe, num_processes, None, source=str(variant.recipe_path))
        except RecipeError as err:
            for problem in err.problems:  # load_recipe names an override `--set k=v`; a grid value came from --grid
                item = next((i for i in grid_items if problem.startswith(f"--set {i}: ")), None)
                problems.append(problem.replace("--set", "--grid", 1) if item else problem)
        else:
            problems += library_problems(variant.recipe)  # (an optional library the variant needs, not installed)
    shared = set.intersection(*(set(p) for p in found.values())) if len(found) > 1 else set()
    lines = list(dict.fromkeys(p for problems in found.values() for p in problems if p in shared))
    lines += [f"variant {name}: {p}" for name, problems in found.items() for p in problems if p not in shared]
    if lines:
        raise RecipeError(lines)
    folder = Path(out) / variants[0].recipe.name if by_recipe_name else Path(out)
    for variant in variants:
        variant.recipe = replaced(variant.recipe, {"name": variant.name})  # the run's name, as reports show it
        variant.run_dir = folder / variant.name
        problem = _decide(variant, overwrite)
        if problem:
            folders.append(f"{variant.run_dir}: {problem}")
    if folders:
        raise RecipeError(folders)
    return folder


def _decide(variant: Variant, overwrite: bool) -> str | None:
    """Set variant.action from what its folder holds; return a problem, or None.

    A complete run is skipped; a running (killed) or failed one resumes from its newest complete checkpoint
    (training.save_steps; without one it starts again from step 0); a missing one trains."""
    from hftoolkit.runs.rundir import RunDirectory
    from hftoolkit.training.checkpoints import latest_checkpoint

    run = RunDirectory(variant.run_dir)
    if overwrite or not run.path.is_dir() or not any(run.path.iterdir()):
        variant.action = "train"
        return None
    manifest = _manifest(run)
    if manifest is None:
        return "holds files but no readable manifest.json, so it is not a run directory: " \
               "move it away, choose another --output, or pass --overwrite"
    status = manifest.get("status")
    if status == "complete" and (run / METRICS).is_file():
        variant.action = "skip"
    elif latest_checkpoint(run / CHECKPOINTS) is not None:
        variant.action = "resume"
    else:  # killed or failed before its first checkpoint: nothing to continue from
        variant.action = "restart"
        return None
    changed = _changed(run, variant.recipe)
    if changed:
        what = "a complete run" if variant.action == "skip" else "a checkpoint"
        return (f"holds {what} of another recipe ({', '.join(changed[:5])}): re-run with the same --set and "
                "--grid values, choose another --output, or pass --overwrite")
    return None


def _manifest(run) -> dict | None:
    try:
        manifest = run.manifest()
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) and manifest else None


def _changed(run, recipe: Recipe) -> list[str]:
    """Recipe keys that differ between the run's recipe.yaml and this one, but for those a resume may change."""
    from operator import attrgetter

    from hftoolkit.training.checkpoints import RESUMABLE_CHANGES, changed_keys

    saved = run / RECIPE
    if not saved.is_file():
        return []
    unfilled = {key for key in FILLED_BY_RUN if attrgetter(key)(recipe) is None}
    return [key for key in changed_keys(saved.read_text(encoding="utf-8"), recipe_to_yaml(recipe))
            if not key.startswith(RESUMABLE_CHANGES) and key not in unfilled]


# ---------------------------------------------------------------- training


def run_variants(variants: list[Variant], command: list[str], num_processes: int | None = None,
                 echo: Callable[[str], None] = print, verbosity=None) -> list[Outcome]:
    """Train (or skip, or resume) each prepared variant in order; a failure is recorded and the next one goes on.

    A progress line per variant: `k/n <variant> <main metric>=<value> <time>`, or the error's first line.
    verbosity (console.Verbosity) is each training's, as train's -q and -v set it.
    """
    from hftoolkit.base.ranks import is_main_process

    if any(v.action != "skip" for v in variants):
        _import_training(any(v.recipe.model.quantization != "none" for v in variants))
    outcomes = []
    for index, variant in enumerate(variants, 1):
        started = time.perf_counter()
        if variant.action == "skip":
            outcome = Outcome(variant, "skipped", metric=_metric_text(variant.run_dir))
        else:
            try:
                _train_variant(variant, command, num_processes, verbosity)
                outcome = Outcome(variant, "complete", metric=_metric_text(variant.run_dir))
            except Exception as err:  # one variant's failure, whatever it is, must not stop the others
                message = str(err).strip() or type(err).__name__
                if not isinstance(err, UserError):
                    message = f"{type(err).__name__}: {message}"
                if is_main_process():
                    _record_failure(variant, command, message)
                outcome = Outcome(variant, "failed", error=message.splitlines()[0])
        outcome.seconds = time.perf_counter() - started
        outcomes.append(outcome)
        echo(progress_line(index, len(variants), outcome))
    return outcomes


def _import_training(quantized: bool) -> None:
    """The training stack, imported before the first variant's clock starts, so each time shown is the variant's own
    (bitsandbytes kept hidden as loading.load_task_model keeps it when nothing is quantized)."""
    from hftoolkit.patches.peft_0_21 import bitsandbytes_hidden

    with bitsandbytes_hidden(needed=quantized):
        import accelerate  # noqa: F401
        import transformers.trainer  # noqa: F401

        import hftoolkit.workflows.train  # noqa: F401


def progress_line(index: int, total: int, outcome: Outcome) -> str:
    from hftoolkit.runs.summary import format_seconds

    head = f"{index}/{total} {outcome.variant.name}"
    if outcome.status == "failed":
        return f"{head} failed: {outcome.error} {format_seconds(outcome.seconds)}"
    if outcome.status == "skipped":
        return f"{head} {outcome.metric or ''} skipped (complete)".replace("  ", " ")
    resumed = " (resumed)" if outcome.variant.action == "resume" else ""
    return f"{head} {outcome.metric or ''} {format_seconds(outcome.seconds)}{resumed}".replace("  ", " ")


def _metric_text(run_dir: Path) -> str | None:
    from hftoolkit.runs.summary import format_value, load_run

    run = load_run(run_dir, read_history=False)
    return f"{run.main_metric}={format_value(run.main_value)}" if run.main_metric else None


def _train_variant(variant: Variant, command: list[str], num_processes: int | None, verbosity=None) -> None:
    """In this process, or (with --num-processes or a recipe's accelerate config) as `hftoolkit train` relaunched
    under accelerate, as `hftoolkit train --num-processes N` would start it."""
    from hftoolkit.base.console import Verbosity
    from hftoolkit.training.relaunch import relaunch
    from hftoolkit.training.strategies import launch_strategy

    resume, overwrite = variant.action == "resume", variant.action in ("train", "restart")
    strategy = launch_strategy(variant.recipe, num_processes, None, source=str(variant.recipe_path))
    if strategy.launch.relaunch:
        argv = ["train", str(variant.recipe_path), "--output", str(variant.run_dir)]
        for item in [*variant.overrides, f"name={variant.name}"]:  # (the name prepare gave the recipe)
            argv += ["--set", item]
        argv.append("--resume" if resume else "--overwrite")
        argv += {Verbosity.QUIET: ["--quiet"], Verbosity.VERBOSE: ["--verbose"]}.get(verbosity, [])
        status = relaunch(strategy.launch, argv, variant.run_dir)
        if status != 0:
            error = (_manifest_of(variant.run_dir).get("error") or "").strip()
            raise UserError(error or f"hftoolkit train exited with status {status}")
        return
    from hftoolkit.workflows.train import train

    reset_peak_memory()
    train(variant.recipe.model_copy(deep=True), variant.run_dir, command=command, overwrite=overwrite, resume=resume,
          verbosity=verbosity, strategy=strategy)


def _manifest_of(run_dir: Path) -> dict:
    from hftoolkit.runs.rundir import RunDirectory

    return _manifest(RunDirectory(run_dir)) or {}


def _record_failure(variant: Variant, command: list[str], message: str) -> None:
    """Make sure the variant's folder says "failed" with the error, so the report lists it as failed.

    `train` removes a run directory when bad input is found before training starts (a missing checkpoint
    folder, unreadable data); here the variant still gets one: its recipe and a failed manifest.
    """
    from hftoolkit.runs.rundir import RunDirectory

    run = RunDirectory(variant.run_dir)
    manifest = _manifest(run) if run.path.is_dir() else None
    if manifest is not None:
        if manifest.get("status") != "failed":
            run.update_manifest(status="failed", error=message)
        return
    if run.path.is_dir() and any(run.path.iterdir()):
        return  # not ours to write into (prepare refused such a folder unless --overwrite)
    run.start(recipe_to_yaml(variant.recipe), command, variant.recipe.training.seed)
    run.finish("failed", error=message)

