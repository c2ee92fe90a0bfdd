"""The command line. Heavy imports (torch, transformers) live inside command bodies,
so `--help`, `validate`, `recipes` and `doctor` stay fast."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from hftoolkit.cli import stdout
from hftoolkit.cli.helpformat import Command
from hftoolkit.cli.options import (
    AccelerateConfigOption,
    JsonOption,
    NumMachinesOption,
    NumProcessesOption,
    QuietOption,
    SetOption,
    VerboseOption,
)
from hftoolkit.cli.plan import plan
from hftoolkit.errors import UserError
from hftoolkit.processes import under_launcher

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Fine-tune and evaluate pretrained transformers from one YAML recipe.")
# The shipped recipes sit beside the package in a checkout (editable install), or in the
# working directory (the Docker image copies them to /workspace/recipes).
RECIPES_DIR = next((p for p in (Path(__file__).resolve().parents[2] / "recipes", Path.cwd() / "recipes")
                    if p.is_dir()), Path("recipes"))

# Printed by --version beside hftoolkit's own (read from the installed metadata: no import of them).
VERSION_PACKAGES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes")


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    from hftoolkit import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    typer.echo(f"hftoolkit {__version__} ({', '.join(f'{p} {installed(p)}' for p in VERSION_PACKAGES)})")
    raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="Print the versions of hftoolkit and its engines.")] = False):
    """Fine-tune and evaluate pretrained transformers from one YAML recipe."""


@app.command()
def train(
    recipe: Annotated[Path, typer.Argument(metavar="RECIPE", help="Recipe YAML file (or, with --resume, a run "
                                                                  "directory).")],
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
        "--main-process-port", min=1, metavar="PORT", help="A free port on machine 0, the same on every "
                                                                      "machine (default 29500).")] = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Fine-tune a model as the recipe says and write a run directory."""
    from hftoolkit import console
    from hftoolkit.config.recipe import load_recipe

    verbosity = console.verbosity_from_flags(verbose, quiet)
    recipe, output = _recipe_and_output(recipe, output, resume, overwrite)
    parsed = load_recipe(recipe, set_ or [])
    run_dir = output or parsed.run_dir
    from hftoolkit.training import distributed
    from hftoolkit.training.strategies import Machines, plan_launch, strategy_for

    machines = Machines(num_machines, machine_rank, main_process_ip, main_process_port)
    plan = plan_launch(parsed, num_processes, accelerate_config, source=str(recipe), machines=machines)
    from hftoolkit.workflows.train import check_run_folder
    from hftoolkit.workflows.train import train as run_training

    if plan.relaunch:  # N processes, each running this command without the launch options
        if plan.machine_rank == 0 or parsed.training.save_on_each_node:  # (a machine that writes the run folder)
            # refused in one line, before any launch
            check_run_folder(run_dir, overwrite, resume, strategy_for(plan).sharding)
        raise typer.Exit(distributed.relaunch(plan, sys.argv[1:], run_dir))
    from hftoolkit.processes import is_main_process

    metrics = run_training(parsed, run_dir, command=distributed.command_line(), overwrite=overwrite, resume=resume,
                           verbosity=verbosity, launch=plan, memory_check=not skip_memory_check)
    if is_main_process():
        stdout.show_result(metrics, run_dir, as_json, verbosity)
    distributed.end_processes()


def _recipe_and_output(recipe: Path, output: Path | None, resume: bool, overwrite: bool) -> tuple[Path, Path | None]:
    """The recipe file and --output of `train`: with `--resume RUN_DIR`, the run's own resolved recipe."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other: pass one of them")
    if resume and recipe.is_dir():
        if not (recipe / "recipe.yaml").is_file():
            raise UserError(f"--resume: {recipe} has no recipe.yaml, so it is not a run directory: "
                            "pass a folder written by hftoolkit train, or the recipe file with --output")
        return recipe / "recipe.yaml", output or recipe
    return recipe, output


@app.command("eval")
def eval_(
    target: Annotated[Path, typer.Argument(metavar="RUN_DIR|RECIPE", help="A run directory written by train, or a "
                                           "recipe file: its base checkpoint, untrained (the baseline).")],
    split: Annotated[str | None, typer.Option("--split", metavar="NAME", help="Score this split of the hub data "
                                              "set instead of the eval split, e.g. test.")] = None,
    set_: SetOption = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "With a recipe: keep the scores as a run directory (no weights) that runs and compare read."))] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="With --output: replace a non-empty directory.")
                         ] = False,
    benchmark: Annotated[str | None, typer.Option("--benchmark", metavar="TASKS", help=(
        "Run lm-evaluation-harness tasks or groups (comma-separated, e.g. arc_easy or the shipped "
        "hftoolkit_everyday_mc,hftoolkit_sums_gen) on the model instead; needs hftoolkit[benchmarks]."))] = None,
    num_fewshot: Annotated[int | None, typer.Option("--num-fewshot", min=0, metavar="N", help=(
        "With --benchmark: examples in each prompt (default: each task's own)."))] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, metavar="N", help=(
        "With --benchmark: score only the first N rows of each task."))] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, metavar="N", help=(
        "With --benchmark: rows per forward pass."))] = 8,
    benchmark_path: Annotated[Path | None, typer.Option("--benchmark-path", metavar="DIR", help=(
        "With --benchmark: a folder of the harness's task YAML files to add to its tasks."))] = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Score a trained run again (metrics.json updated), or a recipe's base checkpoint with no training and no
    adapter; --split scores another split (a run directory keeps it under metrics.json's "splits");
    --benchmark runs lm-evaluation-harness tasks (metrics.json's "benchmarks")."""
    from hftoolkit import console
    from hftoolkit.workflows import evaluate as evaluation

    verbosity = console.verbosity_from_flags(verbose, quiet)
    options = _benchmark_options(benchmark, num_fewshot, limit, batch_size, benchmark_path, split)
    if target.is_dir():
        if set_ or output:
            raise UserError(f"{'--set' if set_ else '--output'}: applies to a recipe, and {target} is a run "
                            "directory: its recipe is the one it trained with")
        metrics, shown = _eval_run(target, split, options, verbosity)
        stdout.show_result(metrics, target, as_json, verbosity, shown)
        return
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training.distributed import command_line

    parsed = load_recipe(target, set_ or [])
    with console.capture(verbosity=verbosity):  # (evaluate_recipe attaches --output's train.log)
        if options is not None:
            from hftoolkit.workflows.benchmark import benchmark_recipe

            metrics = benchmark_recipe(parsed, options, output, overwrite, command_line())
        else:
            metrics = evaluation.evaluate_recipe(parsed, split, output, overwrite, command_line())
    shown = ({**metrics, "eval": None} if options is not None else
             {**metrics, "name": metrics["name"] + (f" on {metrics['split']}" if metrics["split"] else "")})
    stdout.show_result(metrics, output, as_json, verbosity, shown)


def _eval_run(target: Path, split: str | None, options, verbosity) -> tuple[dict, dict]:
    """`eval RUN_DIR`: (metrics.json, what the results table shows) once its eval split is scored again, another
    split, or benchmarks."""
    from hftoolkit import console
    from hftoolkit.runs.rundir import RunDirectory
    from hftoolkit.workflows import evaluate as evaluation

    is_run = (target / "recipe.yaml").is_file()
    log = target / "train.log" if is_run else None  # (a run's log goes on)
    with RunDirectory(target).held("eval", f"hftoolkit eval {target}") if is_run else contextlib.nullcontext(), \
            console.capture(log, verbosity, explain_loading=False):  # the run's head comes with its weights
        if options is not None:
            from hftoolkit.workflows.benchmark import benchmark_run

            metrics = benchmark_run(target, options)
            return metrics, {**metrics, "eval": None}
        if split is None:
            metrics = evaluation.reevaluate(target)
            return metrics, metrics
        metrics = evaluation.reevaluate_split(target, split)
    return metrics, {**metrics, "name": f"{metrics['name']} on {split}", "eval": metrics["splits"][split]}


def _benchmark_options(benchmark: str | None, num_fewshot, limit, batch_size: int, path: Path | None, split):
    """`eval`'s benchmark options, or None without --benchmark (whose companions then make no sense alone)."""
    if benchmark is None:
        if num_fewshot is not None or limit is not None or path is not None:
            raise UserError("--num-fewshot, --limit and --benchmark-path apply to --benchmark: name the tasks with "
                            "--benchmark TASKS")
        return None
    from hftoolkit.evaluation.benchmarks import BenchmarkOptions, parse_tasks

    if split is not None:
        raise UserError("--split and --benchmark: a benchmark scores its own data, not a split of the run's: "
                        "pass one of them")
    return BenchmarkOptions(parse_tasks(benchmark), num_fewshot, limit, batch_size, str(path) if path else None)


@app.command()
def predict(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory written by train.")],
    input_: Annotated[str | None, typer.Option("--input", "-i", metavar="TEXT|FILE|-", help=(
        "A text; a file: csv, tsv, jsonl, json or parquet (the run's text column, or --column; an id, idx or "
        "index column is kept), .txt (one input a line), or an image; or - to read standard input, one input "
        "(or image path) a line. A run trained on sentence pairs takes each input as two texts with a tab "
        "between them. An input that looks like a path is read as a file or refused, never predicted on."))] = None,
    split: Annotated[str | None, typer.Option("--split", metavar="NAME", help=(
        "Predict on a split of the run's hub data set, labels hidden or not (GLUE's test): one row per "
        "example, its index and predicted label, as a leaderboard submission wants (TSV with a header)."))] = None,
    column: Annotated[str | None, typer.Option("--column", metavar="NAME", help=(
        "The input table's text column (default: the run's data.text_column)."))] = None,
    pair_column: Annotated[str | None, typer.Option("--pair-column", metavar="NAME", help=(
        "The input table's second text, for a run trained on sentence pairs (default: its "
        "data.text_pair_column)."))] = None,
    format_: Annotated[Literal["tsv", "jsonl", "csv"], typer.Option("--format", metavar="FORMAT", help=(
        "tsv: the input and the prediction's fields, tab-separated, one row an input; jsonl: one JSON "
        "object a line; csv: RFC 4180 CSV with a header row."))] = "tsv",
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE", help=(
        "Write the rows to FILE (atomically) instead of standard output."))] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, metavar="N", help=(
        "Inputs per forward pass (default: the run's eval.batch_size)."))] = None,
    strategy: Annotated[str | None, typer.Option(metavar="NAME", help="Decoding: greedy, sample or beam.")] = None,
    num_beams: Annotated[int | None, typer.Option(metavar="N", help="Beams for beam search.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(metavar="N", help="Tokens to generate.")] = None,
    temperature: Annotated[float | None, typer.Option(metavar="T", help="Sampling temperature.")] = None,
    top_k: Annotated[int | None, typer.Option(metavar="K", help="Sample from the k most likely tokens.")] = None,
    top_p: Annotated[float | None, typer.Option(metavar="P", help="Sample from the nucleus of mass p.")] = None,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Predict with a trained run: label and probability, or generated text, per input."""
    from hftoolkit import console
    from hftoolkit.workflows.predict import predict as run_predict

    verbosity = console.verbosity_from_flags(verbose, quiet)
    overrides = dict(strategy=strategy, num_beams=num_beams, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p)
    if (input_ is None) == (split is None):
        raise UserError("predict: pass --input (a text, a file or -) or --split NAME (a split of the run's hub "
                        "data set), one of the two")
    if split is not None and (column or pair_column):
        raise UserError("--column: --split reads the run's own columns: drop --column and --pair-column")
    with console.capture(verbosity=verbosity, explain_loading=False):  # the run's head comes with its weights
        records = run_predict(run_dir, input_, {k: v for k, v in overrides.items() if v is not None}, batch_size,
                              column=column, pair_column=pair_column, split=split)
    text = stdout.predict_text(records, format_, submission=split is not None)
    if output is None:
        typer.echo(text, nl=False)
        return
    from hftoolkit.runs.rundir import write_atomic

    write_atomic(output, text.encode("utf-8"))
    if verbosity == console.Verbosity.QUIET:
        typer.echo(str(output))
    else:
        console.phase(f"{len(records):,} predictions written to {output}")


@app.command()
def validate(
    recipes: Annotated[list[Path], typer.Argument(metavar="RECIPE", help="Recipe YAML files.")],
    set_: SetOption = None,
    data: Annotated[bool, typer.Option("--data", help="Also load each recipe's data, model config and tokenizer "
                                                      "(no weights) and run the preflight checks training runs.")
                    ] = False,
    verbose: VerboseOption = False,
):
    """Check recipes without loading any model; lists every problem at once."""
    from hftoolkit import console
    from hftoolkit.config import tasks
    from hftoolkit.config.families import static_family
    from hftoolkit.config.recipe import RecipeError, load_recipe
    from hftoolkit.evaluation.benchmarks import harness_task_file
    from hftoolkit.training.strategies import plan_launch
    from hftoolkit.training.strategies.launch import launch_config_file

    problems = []
    for path in recipes:
        try:
            try:
                parsed = load_recipe(path, set_ or [])
            except RecipeError as err:  # a file of another kind is named in one line, not read as a bad recipe
                other = harness_task_file(path) or launch_config_file(path)
                raise RecipeError([other]) if other else err from None
            if parsed.training.accelerate_config:  # the launcher config it names, checked against it
                plan_launch(parsed, None, None, source=str(path))
            notes, family = [], static_family(parsed.model.checkpoint, parsed.model.family)
            if data:
                from hftoolkit.job.resolve import resolve_job

                try:
                    with console.capture(verbosity=console.verbosity_from_flags(verbose, False)):
                        job = resolve_job(parsed)
                    notes, family = job.findings.notes, job.family
                except RecipeError as err:  # (preflight's lines name recipe keys; say which recipe)
                    raise RecipeError([f"{path}: {line}" for line in err.problems]) from None
            typer.echo(f"ok: {path}")
            advice = tasks.advice(parsed.task, family)
            for line in ([advice] if advice else []) + notes:
                typer.echo(f"note: {line}")
        except RecipeError as err:
            problems += err.problems
    if problems:
        raise RecipeError(problems)


@app.command("recipes")
def list_recipes():
    """List the shipped recipes with a one-line description each."""
    import yaml

    from hftoolkit.evaluation.benchmarks import harness_task_file

    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        if harness_task_file(path):  # (not a recipe, and its `!function` tag is no YAML safe_load reads)
            continue
        description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        typer.echo(f"{path.relative_to(RECIPES_DIR.parent)}\t{description.splitlines()[0] if description else ''}")


@app.command("init-model")
def init_model(
    arch: Annotated[str, typer.Argument(metavar="ARCH", help="bert, gpt2, t5, bart or vit.")],
    out: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to create.")],
):
    """Write a tiny random checkpoint with a locally trained tokenizer (for offline smoke runs)."""
    from hftoolkit.sources.tiny import init_model as build

    typer.echo(f"wrote {build(arch, out)}")


@app.command()
def doctor():
    """Versions, CUDA and bitsandbytes backend, offline or not, free disk (imports no torch)."""
    from hftoolkit.cli.doctor import report

    for key, value in report():
        typer.echo(f"{key:<22}{value}")


@app.command("runs")
def list_run_dirs(
    root: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to search, sweeps included.")] = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as one JSON array.")] = False,
):
    """List run directories newest first: status, task, checkpoint, main metric, train time, date."""
    from hftoolkit.runs.listing import list_runs, print_runs

    found = list_runs(root)
    if as_json:
        import json

        typer.echo(json.dumps(found, indent=2, ensure_ascii=False))
    else:
        print_runs(found, root)


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="Run directories written by train.")],
    output: Annotated[Path, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "Folder for report.md, report.html and the plots."))] = Path("report"),
):
    """Compare runs across architectures: report.md, a self-contained report.html and PNG plots."""
    from hftoolkit.runs.report import ReportError, load_run, summary_rows, write_report

    try:
        path = write_report(run_dirs, output)
        rows = summary_rows([load_run(p) for p in run_dirs])
    except ReportError as err:
        raise UserError(str(err)) from None
    stdout.print_rows(rows)
    typer.echo(f"report: {path} and {path.with_suffix('.html')}")


@app.command()
def merge(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A LoRA run directory written by train.")],
    output: Annotated[Path, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "Folder for the merged checkpoint."))],
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="Saved dtype: float32, bfloat16 or float16.")
                     ] = "float32",
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Fold the LoRA adapter into the base weights; the result loads with the Auto classes, no peft."""
    from hftoolkit import console
    from hftoolkit.workflows.merge import merge_run

    verbosity = console.verbosity_from_flags(verbose, quiet)
    with console.capture(verbosity=verbosity, explain_loading=False):  # the run's head comes with its adapter
        merged = merge_run(run_dir, output, dtype)
    typer.echo(str(merged) if verbosity == console.Verbosity.QUIET else f"merged checkpoint: {merged}")


@app.command()
def push(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory written by train.")],
    repo_id: Annotated[str, typer.Option("--repo-id", metavar="NAMESPACE/NAME", help="The model repository.")],
    private: Annotated[bool, typer.Option("--private", help="Create the repository private (refused if it exists "
                                                            "public).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the files and print the card; upload nothing.")
                       ] = False,
    license_: Annotated[str | None, typer.Option("--license", metavar="ID", help="The card's license, a Hub license id "
                                                                    "(apache-2.0, mit, ...).")] = None,
):
    """Publish a finished run to the Hugging Face Hub: weights, tokenizer, recipe, metrics and a model card.
    The token comes from HF_TOKEN or `hf auth login`."""
    from hftoolkit.runs.publish import push as publish

    files, card = publish(run_dir, repo_id, private=private, dry_run=dry_run, license=license_)
    typer.echo(f"{'would upload' if dry_run else 'uploaded'} to {repo_id}:")
    for name in files:
        typer.echo(f"  {name}")
    if dry_run:
        typer.echo(f"\n{card}", nl=False)


@app.command()
def sweep(
    recipe: Annotated[Path, typer.Argument(metavar="RECIPE", help="Recipe YAML file.")],
    grid: Annotated[list[str] | None, typer.Option(
        "--grid", metavar="KEY=V1,V2", help="A recipe key and its values (repeatable: the cross product is "
                                            "trained). Values are parsed as YAML, like --set; a comma inside "
                                            "[...] does not split.")] = None,
    set_: SetOption = None,
    output: Annotated[Path, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "Folder for the sweeps: the runs go to DIR/NAME/VARIANT/, the report to DIR/NAME/."))] = Path("sweeps"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Train every variant again, even complete ones.")
                         ] = False,
    num_processes: Annotated[int | None, typer.Option(
        "--num-processes", min=1, metavar="N", help="Train each variant on N processes, as train --num-processes "
                                                    "does.")] = None,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Train every combination of the grid values and compare them in one report. Re-running the same command
    skips complete variants, resumes killed ones from their checkpoints and retries failed ones."""
    from hftoolkit import console
    from hftoolkit.processes import is_main_process
    from hftoolkit.training import distributed
    from hftoolkit.workflows.sweep import sweep as run_sweep

    verbosity = console.verbosity_from_flags(verbose, quiet)
    result = run_sweep(recipe, grid or [], set_ or [], output, overwrite=overwrite, num_processes=num_processes,
                       command=distributed.command_line(), echo=console.phase, verbosity=verbosity)
    if is_main_process():
        _say_report(result.report, verbosity)
    distributed.end_processes()
    if result.failed:
        console.error(f"{len(result.failed)} of {len(result.outcomes)} variants failed: run the same command again "
                      "to retry them")
        raise typer.Exit(1)


@app.command()
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
    from hftoolkit import console
    from hftoolkit.runs.report import load_run, summary_rows
    from hftoolkit.workflows.bench import bench as run_bench

    verbosity = console.verbosity_from_flags(verbose, quiet)
    result = run_bench(families, output, RECIPES_DIR, set_ or [], echo=console.phase, verbosity=verbosity)
    if verbosity > console.Verbosity.QUIET:
        stdout.print_rows(summary_rows([load_run(o.variant.run_dir) for o in result.outcomes]))
    _say_report(result.report, verbosity)
    if result.failed:
        console.error(f"{len(result.failed)} of {len(result.outcomes)} runs failed")
        raise typer.Exit(1)


def _say_report(report: Path, verbosity) -> None:
    from hftoolkit.console import Verbosity

    typer.echo(str(report) if verbosity == Verbosity.QUIET else f"report: {report} and {report.with_suffix('.html')}")


@app.command()
def parity(
    only: Annotated[str | None, typer.Option(metavar="COMPONENT", help="Run only the rows of this component.")
                    ] = None,
    worked_examples: Annotated[bool, typer.Option("--worked-examples", help="Also recompute the course's worked "
                                                                            "examples.")] = False,
):
    """Prove the from-scratch reference layers equal transformers, peft and torch (tiny random configs)."""
    from hftoolkit.reference.parity import main as run_parity

    raise typer.Exit(run_parity(only=only, worked_examples=worked_examples))


app.command("plan")(plan)

# Every command's help reads as conventional tools' do (set here, once every command is registered).
for _info in app.registered_commands:
    _info.cls = Command


def main() -> None:
    """The console script. A stop signal (Ctrl-C, SIGTERM, a closed terminal) ends a command in one line with exit
    status 128 + the signal; a process started by a launcher ends with it (processes.die_with_parent). Once every
    exit handler has run, the process ends without the interpreter's teardown: freeing the modules torch,
    transformers and datasets import takes over a second, after the results are written (README, Performance);
    the handlers that flush logs and remove temporary files still run."""
    from hftoolkit.processes import Stopped, die_with_parent, is_main_process, record_reason, stop_on_signals

    status = [0]
    atexit.register(_end_now, status)  # registered first, so it runs after every library's handler
    stop_on_signals()
    if under_launcher():
        die_with_parent()
    try:
        app()
    except SystemExit as done:
        status[0] = done.code if isinstance(done.code, int) else int(done.code is not None)
        raise
    except Stopped as stop:  # asked for: no traceback
        status[0] = stop.exit_code
        if not stop.said and is_main_process():
            print(f"stopped by {stop.name}", file=sys.stderr)
    except BaseException as crash:  # a crash: Python prints the traceback, the exit status says it failed
        status[0] = 1
        record_reason(f"{type(crash).__name__}: {crash}")  # (under a relaunch: the line the launch ends with)
        raise


def _end_now(status: list[int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status[0])
