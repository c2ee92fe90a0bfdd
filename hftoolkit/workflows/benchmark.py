"""`eval --benchmark`: lm-evaluation-harness tasks on a finished run's model as trained, or on a recipe's
untrained base (the baseline), and after training when the recipe's eval.benchmarks asks.

Results go into metrics.json under `benchmarks` (one record per task), and the harness's per-row samples into
benchmark-samples.jsonl beside it, so a report can set a run beside its base and a user can read each answer.
"""

from __future__ import annotations

from pathlib import Path

from hftoolkit.base import console
from hftoolkit.base.run_layout import METRICS
from hftoolkit.config.families import static_family
from hftoolkit.config.recipe import Recipe, replaced
from hftoolkit.evaluation.harness import (
    BenchmarkOptions,
    check_benchmarkable,
    check_tasks,
    harness_version,
    run_benchmarks,
    task_manager,
)
from hftoolkit.runs.rundir import RunDirectory

SAMPLES_FILE = "benchmark-samples.jsonl"


def options_from_recipe(recipe: Recipe) -> BenchmarkOptions | None:
    """The recipe's eval.benchmarks as options, or None when it asks for none."""
    b = recipe.eval.benchmarks
    if b is None or not b.tasks:
        return None
    return BenchmarkOptions(tuple(b.tasks), b.num_fewshot, b.limit, b.batch_size, b.path)


def prepare(family: str | None, task: str, options: BenchmarkOptions, where: str):
    """Everything checked before a weight loads: the harness installed, the model able, the task names known.
    Returns the harness's task index."""
    harness_version()
    check_benchmarkable(family, task, where)
    manager = task_manager(options.path, options.tasks)
    check_tasks(manager, options.tasks)
    return manager


def benchmark_loaded(job, model, processor, options: BenchmarkOptions, manager, run: RunDirectory | None) -> dict:
    """Run the tasks on a loaded model; with `run`, metrics.json gains them and the samples are written."""
    console.phase(f"benchmarks: {', '.join(options.tasks)}"
                  + (f" (limit {options.limit} rows each)" if options.limit else ""))
    model.eval()
    records, samples = run_benchmarks(model, processor, job.family, options, manager)
    for name, record in records.items():
        if record["value"] is not None:
            console.note(f"{name}: {record['metric']} {record['value']:.4f}"
                         + (f" ± {record['stderr']:.4f}" if isinstance(record["stderr"], float) else ""))
    if run is not None:
        metrics = run.metrics()
        metrics["benchmarks"] = {**metrics.get("benchmarks", {}), **records}
        run.write_json(METRICS, metrics)
        run.write_jsonl(SAMPLES_FILE, samples)
    return records


def benchmark_run(run_dir: Path, options: BenchmarkOptions) -> dict:
    """The run's model as trained (its adapter on its base, its quantization) on the tasks; returns metrics.json.

    A run whose status is not yet "complete" (killed or failed after its weights were saved, during its eval
    pass or its eval.benchmarks) is completed: its eval split scored first where that never finished, then the
    benchmarks, so one command leaves it whole."""
    from hftoolkit.runs.rundir import open_run
    from hftoolkit.workflows.evaluate import reevaluate
    from hftoolkit.workflows.trained import load_trained

    opened = open_run(run_dir)  # (a run killed before its weights were saved is refused here, in one line)
    run, recipe = opened.directory, opened.recipe
    manifest = run.manifest()
    resolved = manifest.get("resolved") or {}
    family = resolved.get("family") or static_family(recipe.model.checkpoint, recipe.model.family)
    if family is None:  # (a run written before manifest.json said its family: checked once its config is read)
        harness_version()
        manager = task_manager(options.path, options.tasks)
        check_tasks(manager, options.tasks)
    else:
        manager = prepare(family, recipe.task, options, str(run_dir))
    complete = manifest.get("status") == "complete"
    if not complete:
        if run.metrics().get("eval") is None:  # its eval pass never finished: scored first
            console.phase(f"{run_dir} is not complete ({manifest.get('status')}): scoring its eval split first")
            reevaluate(run_dir)
    job, _form, model, processor = load_trained(opened)
    check_benchmarkable(job.family, job.task, str(run_dir))
    benchmark_loaded(job, model, processor, options, manager, run)
    if run.manifest().get("status") != "complete":
        run.finish("complete")
    return run.metrics()


def check_recipe(recipe: Recipe, options: BenchmarkOptions) -> None:
    """What can be refused from the recipe alone, before anything loads: the harness missing, an encoder or a
    classification task, an unknown task name."""
    harness_version()
    static = static_family(recipe.model.checkpoint, recipe.model.family)
    if static is not None:
        check_benchmarkable(static, recipe.task, recipe.model.checkpoint)
    check_tasks(task_manager(options.path, options.tasks), options.tasks)


def benchmark_recipe(recipe: Recipe, options: BenchmarkOptions, output: Path | None = None, overwrite: bool = False,
                     command: list[str] = ()) -> dict:
    """The recipe's base checkpoint, untrained, with no adapter and unquantized (as `eval RECIPE` scores it),
    on the tasks; returns what `eval` shows, the records under "benchmarks". With `output`, it is also scored on
    its eval split and kept as a baseline run directory (as `eval RECIPE --output` keeps one), whose
    metrics.json gains the records, so a report sets it beside the tuned runs."""
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.workflows.evaluate import evaluate_recipe

    check_recipe(recipe, options)  # before the eval pass: a refusal costs nothing
    metrics = (evaluate_recipe(recipe, None, output, overwrite, command) if output is not None else
               {"name": f"{recipe.name}-untrained", "task": recipe.task, "checkpoint": recipe.model.checkpoint})
    base = replaced(recipe, {"lora.enabled": False, "model.quantization": "none"})
    job = resolve_job(base, data=False)  # config and tokenizer: the family of a hub checkpoint, no weights
    manager = prepare(job.family, base.task, options, base.model.checkpoint)
    model, processor = formulation(job).load_model(job)
    run = RunDirectory(output) if output is not None else None
    return {**metrics, "benchmarks": benchmark_loaded(job, model, processor, options, manager, run)}
