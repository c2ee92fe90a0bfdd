"""The commands that train: `train` (one recipe), `sweep` (a grid of its values) and `bench` (the course's
comparison). Each imports its workflow inside its body, so `--help` stays light."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import RECIPE
from hftoolkit.cli import stdout
from hftoolkit.cli.options import (
    AccelerateConfigOption,
    JsonOption,
    NumMachinesOption,
    NumProcessesOption,
    QuietOption,
    SetOption,
    VerboseOption,
    tcp_port,
)


def train(
    recipe: Annotated[Path, typer.Argument(metavar="RECIPE", help="Recipe YAML file, or a shipped recipe's name "
                                                                  "(`hftoolkit recipes`); with --resume, a run "
                                                                  "directory.")],
    set_: SetOption = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "Run directory (default output.dir/name)."))] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty run directory.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run from its newest complete checkpoint.")
                      ] = False,
    num_processes: NumProcessesOption = None,
    accelerate_config: AccelerateConfigOption = None,
    num_machines: NumMachinesOption = None,
    skip_memory_check: Annotated[bool, typer.Option("--skip-memory-check", help=(
        "Train even when the plan (hftoolkit plan) says the run needs more memory than this machine has."))] = False,
    machine_rank: Annotated[int | None, typer.Option(
        "--machine-rank", min=0, metavar="R", help="This machine's index among --num-machines (0: the main "
                                                   "machine, which --main-process-ip names).")] = None,
    main_process_ip: Annotated[str | None, typer.Option(
        "--main-process-ip", metavar="IP", help="Machine 0's address as every machine reaches it.")] = None,
    main_process_port: Annotated[int | None, typer.Option(
        "--main-process-port", min=1, metavar="PORT", callback=tcp_port,
        help="A free port on machine 0 (up to 65535), the same on every machine (default 29500).")] = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Fine-tune a model as the recipe says and write a run directory."""
    from hftoolkit.base import console
    from hftoolkit.config.recipe import RecipeError, load_recipe
    from hftoolkit.config.shipped import origin
    from hftoolkit.job.hardware import library_problems

    verbosity = console.verbosity_from_flags(verbose, quiet)
    recipe, output = _recipe_and_output(recipe, output, resume, overwrite)
    parsed = load_recipe(recipe, set_ or [])
    run_dir = output or parsed.run_dir
    if lacking := library_problems(parsed):  # (an optional library: refused before the launch, any load or write)
        raise RecipeError(lacking)
    from hftoolkit.training import relaunch
    from hftoolkit.training.strategies import Machines, launch_strategy

    machines = Machines(num_machines, machine_rank, main_process_ip, main_process_port)
    strategy = launch_strategy(parsed, num_processes, accelerate_config, source=str(recipe), machines=machines)
    plan = strategy.launch
    from hftoolkit.workflows.train import check_run_folder
    from hftoolkit.workflows.train import train as run_training

    if plan.relaunch:  # N processes, each running this command without the launch options
        if plan.machine_rank == 0 or parsed.training.save_on_each_node:  # (a machine that writes the run folder:
            check_run_folder(run_dir, overwrite, resume, strategy.sharding)  # refused in one line, before any launch)
        raise typer.Exit(relaunch.relaunch(plan, sys.argv[1:], run_dir))
    from hftoolkit.base.ranks import is_main_process

    metrics = run_training(parsed, run_dir, command=relaunch.command_line(), overwrite=overwrite, resume=resume,
                           verbosity=verbosity, strategy=strategy, memory_check=not skip_memory_check,
                           recipe_file=origin(recipe))
    if is_main_process():
        stdout.show_result(metrics, run_dir, as_json, verbosity)
    relaunch.end_processes()


def _recipe_and_output(recipe: Path, output: Path | None, resume: bool, overwrite: bool) -> tuple[Path, Path | None]:
    """The recipe file and --output of `train`: with `--resume RUN_DIR`, the run's own resolved recipe; a shipped
    recipe's name, its file in the package (config/shipped.py)."""
    from hftoolkit.config.shipped import find_recipe
    from hftoolkit.runs.rundir import meant_run_folder, run_folder_problem

    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other: pass one of them")
    if resume:  # RECIPE is a run folder, or a recipe file with --output
        problem = run_folder_problem(recipe) if recipe.is_dir() else meant_run_folder(recipe)
        if problem:
            raise UserError(problem)
    if resume and recipe.is_dir():
        return recipe / RECIPE, output or recipe
    return find_recipe(recipe), output


def sweep(
    recipe: Annotated[Path, typer.Argument(metavar="RECIPE", help="Recipe YAML file.")],
    grid: Annotated[list[str] | None, typer.Option(
        "--grid", metavar="KEY=V1,V2", help="A recipe key and its values (repeatable: the cross product is "
                                            "trained). Values are parsed as YAML, like --set; a comma inside "
                                            "[...] does not split. With --search: a choice among the values.")] = None,
    set_: SetOption = None,
    output: Annotated[Path, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "Folder for the sweeps: the runs go to DIR/NAME/VARIANT/, the report to DIR/NAME/."))] = Path("sweeps"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Train every variant again, even complete ones.")
                         ] = False,
    num_processes: Annotated[int | None, typer.Option(
        "--num-processes", min=1, metavar="N", help="Train each variant on N processes, as train --num-processes "
                                                    "does.")] = None,
    search: Annotated[bool, typer.Option("--search", help=(
        "An Optuna study instead of the whole grid: trials sampled from --param ranges (or --space FILE), "
        "hopeless ones pruned at the evals of eval.every. Needs hftoolkit[search]."))] = False,
    param: Annotated[list[str] | None, typer.Option(
        "--param", metavar="KEY=SPACE", help="A searched key (repeatable): float:LOW:HIGH[:log], "
                                             "int:LOW:HIGH[:log] or choice:V1,V2,...")] = None,
    space: Annotated[Path | None, typer.Option("--space", metavar="FILE", help=(
        "A search file (YAML): `params:` mapping each KEY to its SPACE, and optionally trials, sampler, pruner, "
        "objective; the options given here win."))] = None,
    trials: Annotated[int | None, typer.Option("--trials", min=1, metavar="N", help=(
        "Trials in the study, over all its workers (default 20; grid: the whole grid)."))] = None,
    sampler: Annotated[str | None, typer.Option("--sampler", metavar="NAME", help=(
        "tpe (default), random or grid."))] = None,
    pruner: Annotated[str | None, typer.Option("--pruner", metavar="NAME", help=(
        "median, halving or none (default median where eval.every is set, else none)."))] = None,
    objective: Annotated[str | None, typer.Option("--objective", metavar="METRIC:DIRECTION", help=(
        "The eval metric the study optimises, and maximize or minimize (default the task's main metric)."))] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, metavar="K", help=(
        "Trials at once on this machine, each worker with its share of the GPUs (or CPU cores)."))] = 1,
    storage: Annotated[str | None, typer.Option("--storage", metavar="URL", help=(
        "The study's database (default DIR/NAME/study.db, SQLite); the same PostgreSQL URL on several machines "
        "makes one study of their workers."))] = None,
    study: Annotated[str | None, typer.Option("--study", metavar="NAME", help=(
        "The study's name in its database (default the recipe's name)."))] = None,
    startup_trials: Annotated[int | None, typer.Option("--startup-trials", min=0, metavar="N", help=(
        "Trials before the sampler and the median pruner learn from the others (default Optuna's: 10 and 5)."))
                              ] = None,
    heartbeat: Annotated[int, typer.Option("--heartbeat", min=1, metavar="SECONDS", help=(
        "How often a worker tells the study its trial is alive; a trial silent three times as long is taken as "
        "killed and run again from its last checkpoint."))] = 20,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Train every combination of the grid values and compare them in one report. Re-running the same command
    skips complete variants, resumes killed ones from their checkpoints and retries failed ones. With --search, an
    Optuna study over --param ranges instead, its trials on --workers processes and on every machine that runs the
    same command with the same --storage."""
    from hftoolkit.base import console
    from hftoolkit.base.ranks import is_main_process
    from hftoolkit.training import relaunch

    verbosity = console.verbosity_from_flags(verbose, quiet)
    searching = {"--param": param, "--space": space, "--trials": trials, "--sampler": sampler, "--pruner": pruner,
                 "--objective": objective, "--workers": workers != 1, "--storage": storage, "--study": study,
                 "--startup-trials": startup_trials is not None, "--heartbeat": heartbeat != 20}
    if not search:
        given = [name for name, value in searching.items() if value]
        if given:
            raise UserError(f"{given[0]}: a search option, and this is a grid sweep: add --search")
    if search:
        import importlib.util

        from hftoolkit.base.extras import missing_line

        if importlib.util.find_spec("optuna") is None:
            raise UserError(missing_line("search", "sweep --search", ["Optuna"]))
        if overwrite:
            raise UserError("--overwrite: a search keeps its study and trials: choose another --output or --study "
                            "to start a new one")
        from hftoolkit.sweeps.search import search as run_search

        items = [*(param or []), *(f"{k}=choice:{v}" for k, _, v in (g.partition("=") for g in grid or []))]
        result = run_search(recipe, items, set_ or [], output, space_file=space, trials=trials, sampler=sampler,
                            pruner=pruner, objective=objective, workers=workers, storage=storage, study=study,
                            heartbeat=heartbeat, startup_trials=startup_trials, num_processes=num_processes,
                            command=relaunch.command_line(), echo=console.phase, verbosity=verbosity)
        _say_report(result.report, verbosity)
        relaunch.end_processes()
        return
    from hftoolkit.sweeps.sweep import sweep as run_sweep

    result = run_sweep(recipe, grid or [], set_ or [], output, overwrite=overwrite, num_processes=num_processes,
                       command=relaunch.command_line(), echo=console.phase, verbosity=verbosity)
    if is_main_process():
        _say_report(result.report, verbosity)
    relaunch.end_processes()
    if result.failed:
        console.error(f"{len(result.failed)} of {len(result.outcomes)} variants failed: run the same command again "
                      "to retry them")
        raise typer.Exit(1)


def bench(
    families: Annotated[list[str] | None, typer.Option(
        "--families", metavar="FAMILY", help="Only the runs of this family (repeatable): encoder, decoder, "
                                             "seq2seq, vision (default all).")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "Folder for the runs and the report."))] = Path("bench"),
    set_: SetOption = None,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """The course's comparison, offline: sentiment classification with an encoder, a decoder and an
    encoder-decoder, translation with T5, BART and a decoder, and image classification with ViT; one report."""
    from hftoolkit.base import console
    from hftoolkit.config.shipped import SHIPPED
    from hftoolkit.runs.report import load_run, summary_rows
    from hftoolkit.sweeps.across_families import bench as run_bench

    verbosity = console.verbosity_from_flags(verbose, quiet)
    result = run_bench(families, output, SHIPPED, set_ or [], echo=console.phase, verbosity=verbosity)
    if verbosity > console.Verbosity.QUIET:
        stdout.print_rows(summary_rows([load_run(o.variant.run_dir) for o in result.outcomes]))
    _say_report(result.report, verbosity)
    if result.failed:
        console.error(f"{len(result.failed)} of {len(result.outcomes)} runs failed")
        raise typer.Exit(1)


def _say_report(report: Path, verbosity) -> None:
    from hftoolkit.base.console import Verbosity

    typer.echo(str(report) if verbosity == Verbosity.QUIET else f"report: {report} and {report.with_suffix('.html')}")
