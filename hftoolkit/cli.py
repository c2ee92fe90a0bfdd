"""The command line. Heavy imports (torch, transformers) live inside command bodies,
so `--help`, `validate`, `recipes` and `doctor` stay fast."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from hftoolkit.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Fine-tune and evaluate pretrained transformers from one YAML recipe.")
# The shipped recipes sit beside the package in a checkout (editable install), or in the
# working directory (the Docker image copies them to /workspace/recipes).
RECIPES_DIR = next((p for p in (Path(__file__).resolve().parent.parent / "recipes", Path.cwd() / "recipes")
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


SetOption = Annotated[list[str] | None, typer.Option("--set", help="Override a recipe key: a.b.c=value.")]


@app.command()
def train(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file (or, with --resume, a run directory).")],
    set_: SetOption = None,
    output: Annotated[Path | None, typer.Option("--output", help="Run directory (default output.dir/name).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty run directory.")] = False,
    resume: Annotated[bool, typer.Option(help="Continue the run from its newest complete checkpoint.")] = False,
    num_processes: Annotated[int | None, typer.Option(
        "--num-processes", min=1, help="Train on N processes (one per GPU; gloo on a CPU), started through "
                                       "accelerate launch. training.batch_size is split over them.")] = None,
    accelerate_config: Annotated[Path | None, typer.Option(
        "--accelerate-config", help="An accelerate launch config (see recipes/accelerate/); "
                                    "overrides the recipe's training.accelerate_config.")] = None,
):
    """Fine-tune a model as the recipe says and write a run directory."""
    from hftoolkit.recipe import load_recipe

    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other: pass one of them")
    if resume and recipe.is_dir():  # `train --resume RUN_DIR`: the run's own resolved recipe
        if not (recipe / "recipe.yaml").is_file():
            raise UserError(f"--resume: {recipe} has no recipe.yaml, so it is not a run directory: "
                            "pass a folder written by hftoolkit train, or the recipe file with --output")
        output, recipe = output or recipe, recipe / "recipe.yaml"
    parsed = load_recipe(recipe, set_ or [])
    run_dir = output or parsed.run_dir
    from hftoolkit import launch

    plan = launch.plan_launch(parsed, num_processes, accelerate_config, source=str(recipe))
    if plan.relaunch:  # N processes, each running this command without the launch options
        raise typer.Exit(launch.relaunch(plan, sys.argv[1:]))
    from hftoolkit.train import train as run_training

    metrics = run_training(parsed, run_dir, command=launch.command_line(), overwrite=overwrite, resume=resume)
    if launch.is_main_process():
        _print_metrics(metrics, run_dir)
    launch.end_processes()


@app.command("eval")
def eval_(
    target: Annotated[Path, typer.Argument(metavar="RUN_DIR|RECIPE", help="A run directory written by train, or a "
                                           "recipe file: its base checkpoint, untrained (the baseline).")],
    split: Annotated[str | None, typer.Option("--split", help="Score this split of the hub data set instead of "
                                              "the eval split, e.g. test.")] = None,
    set_: SetOption = None,
    output: Annotated[Path | None, typer.Option("--output", help="With a recipe: keep the scores as a run "
                                                "directory (no weights) that runs and compare read.")] = None,
    overwrite: Annotated[bool, typer.Option(help="With --output: replace a non-empty directory.")] = False,
):
    """Score a trained run again (metrics.json updated), or a recipe's base checkpoint with no training and no
    adapter; --split scores another split (a run directory keeps it under metrics.json's "splits")."""
    from hftoolkit import evaluation

    if target.is_dir():
        if set_ or output:
            raise UserError(f"{'--set' if set_ else '--output'}: applies to a recipe, and {target} is a run "
                            "directory: its recipe is the one it trained with")
        if split is None:
            _print_metrics(evaluation.reevaluate(target), target)
            return
        metrics = evaluation.reevaluate_split(target, split)
        _print_metrics({**metrics, "name": f"{metrics['name']} on {split}", "eval": metrics["splits"][split]}, target)
        return
    from hftoolkit.launch import command_line
    from hftoolkit.recipe import load_recipe

    metrics = evaluation.evaluate_recipe(load_recipe(target, set_ or []), split, output, overwrite, command_line())
    shown = metrics["name"] + (f" on {metrics['split']}" if metrics["split"] else "")
    _print_metrics({**metrics, "name": shown}, output or "none written (--output DIR keeps these scores)")


@app.command()
def predict(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by train.")],
    input_: Annotated[str, typer.Option("--input", help="A text, or a file: .txt (one input a line) or an image.")],
    strategy: Annotated[str | None, typer.Option(help="Decoding: greedy, sample or beam.")] = None,
    num_beams: Annotated[int | None, typer.Option(help="Beams for beam search.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Tokens to generate.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    top_k: Annotated[int | None, typer.Option(help="Sample from the k most likely tokens.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Sample from the nucleus of mass p.")] = None,
):
    """Predict with a trained run: label and probability, or generated text, per input."""
    from hftoolkit.evaluation import predict as run_predict

    overrides = dict(strategy=strategy, num_beams=num_beams, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p)
    for row in run_predict(run_dir, input_, {k: v for k, v in overrides.items() if v is not None}):
        typer.echo("\t".join(str(v) for v in row.values()))


@app.command()
def validate(
    recipes: Annotated[list[Path], typer.Argument(help="Recipe YAML files.")],
    set_: SetOption = None,
    data: Annotated[bool, typer.Option("--data", help="Also load each recipe's data, model config and tokenizer "
                                                      "(no weights) and run the preflight checks training runs.")
                    ] = False,
):
    """Check recipes without loading any model; lists every problem at once."""
    from hftoolkit.launch import plan_launch
    from hftoolkit.recipe import RecipeError, load_recipe

    problems = []
    for path in recipes:
        try:
            parsed = load_recipe(path, set_ or [])
            if parsed.training.accelerate_config:  # the launcher config it names, checked against it
                plan_launch(parsed, None, None, source=str(path))
            notes = []
            if data:
                from hftoolkit.preflight import prepare

                try:
                    notes = prepare(parsed)[1].notes
                except RecipeError as err:  # (preflight's lines name recipe keys; say which recipe)
                    raise RecipeError([f"{path}: {line}" for line in err.problems]) from None
            typer.echo(f"ok: {path}")
            for line in ([parsed.advice] if parsed.advice else []) + notes:
                typer.echo(f"note: {line}")
        except RecipeError as err:
            problems += err.problems
    if problems:
        raise RecipeError(problems)


@app.command("recipes")
def list_recipes():
    """List the shipped recipes with a one-line description each."""
    import yaml

    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        typer.echo(f"{path.relative_to(RECIPES_DIR.parent)}\t{description.splitlines()[0] if description else ''}")


@app.command("init-model")
def init_model(
    arch: Annotated[str, typer.Argument(help="bert, gpt2, t5, bart or vit.")],
    out: Annotated[Path, typer.Argument(help="Folder to create.")],
):
    """Write a tiny random checkpoint with a locally trained tokenizer (for offline smoke runs)."""
    from hftoolkit.tiny import init_model as build

    typer.echo(f"wrote {build(arch, out)}")


@app.command()
def doctor():
    """Versions, CUDA and bitsandbytes backend, offline or not, free disk (imports no torch)."""
    from hftoolkit.doctor import report

    for key, value in report():
        typer.echo(f"{key:<22}{value}")


@app.command("runs")
def list_run_dirs(
    root: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to search, sweeps included.")] = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as one JSON array.")] = False,
):
    """List run directories newest first: status, task, checkpoint, main metric, train time, date."""
    from hftoolkit.runs import list_runs, print_runs

    found = list_runs(root)
    if as_json:
        import json

        typer.echo(json.dumps(found, indent=2, ensure_ascii=False))
    else:
        print_runs(found, root)


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories written by train.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for report.md, report.html and the plots.")] = Path(
        "report"),
):
    """Compare runs across architectures: report.md, a self-contained report.html and PNG plots."""
    from hftoolkit.report import ReportError, load_run, summary_rows, write_report

    try:
        path = write_report(run_dirs, out)
        rows = summary_rows([load_run(p) for p in run_dirs])
    except ReportError as err:
        raise UserError(str(err)) from None
    _print_rows(rows)
    typer.echo(f"report: {path} and {path.with_suffix('.html')}")


@app.command()
def merge(
    run_dir: Annotated[Path, typer.Argument(help="A LoRA run directory written by train.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for the merged checkpoint.")],
    dtype: Annotated[str, typer.Option(help="Saved dtype: float32, bfloat16 or float16.")] = "float32",
):
    """Fold the LoRA adapter into the base weights; the result loads with the Auto classes, no peft."""
    from hftoolkit.export import merge_run

    typer.echo(f"merged checkpoint: {merge_run(run_dir, out, dtype)}")


@app.command()
def push(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by train.")],
    repo_id: Annotated[str, typer.Option("--repo-id", help="The model repository: namespace/name.")],
    private: Annotated[bool, typer.Option(help="Create the repository private (refused if it exists public).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the files and print the card; upload nothing.")
                       ] = False,
    license_: Annotated[str | None, typer.Option("--license", help="The card's license, a Hub license id "
                                                                    "(apache-2.0, mit, ...).")] = None,
):
    """Publish a finished run to the Hugging Face Hub: weights, tokenizer, recipe, metrics and a model card.
    The token comes from HF_TOKEN or `hf auth login`."""
    from hftoolkit.publish import push as publish

    files, card = publish(run_dir, repo_id, private=private, dry_run=dry_run, license=license_)
    typer.echo(f"{'would upload' if dry_run else 'uploaded'} to {repo_id}:")
    for name in files:
        typer.echo(f"  {name}")
    if dry_run:
        typer.echo(f"\n{card}", nl=False)


@app.command()
def sweep(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    grid: Annotated[list[str] | None, typer.Option(
        "--grid", help="A recipe key and its values: a.b.c=v1,v2 (repeatable: the cross product is trained). "
                       "Values are parsed as YAML, like --set; a comma inside [...] does not split.")] = None,
    set_: SetOption = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for the sweeps: the runs go to OUT/<name>/<variant>/, "
                                                    "the report to OUT/<name>/.")] = Path("sweeps"),
    overwrite: Annotated[bool, typer.Option(help="Train every variant again, even complete ones.")] = False,
    num_processes: Annotated[int | None, typer.Option(
        "--num-processes", min=1, help="Train each variant on N processes, as train --num-processes does.")] = None,
):
    """Train every combination of the grid values and compare them in one report. Re-running the same command
    skips complete variants, resumes killed ones from their checkpoints and retries failed ones."""
    from hftoolkit import launch
    from hftoolkit.sweep import sweep as run_sweep

    main = launch.is_main_process()
    result = run_sweep(recipe, grid or [], set_ or [], out, overwrite=overwrite, num_processes=num_processes,
                       command=launch.command_line(), echo=typer.echo if main else (lambda line: None))
    if main:
        typer.echo(f"report: {result.report} and {result.report.with_suffix('.html')}")
    launch.end_processes()
    if result.failed:
        if main:
            typer.echo(f"{len(result.failed)} of {len(result.outcomes)} variants failed: run the same command "
                       "again to retry them", err=True)
        raise typer.Exit(1)


@app.command()
def bench(
    families: Annotated[list[str] | None, typer.Option(
        "--families", help="Only the runs of these families: encoder, decoder, seq2seq, vision (default all).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for the runs and the report.")] = Path("bench"),
    set_: SetOption = None,
):
    """The course's comparison, offline: sentiment classification with an encoder, a decoder and an
    encoder-decoder, translation with T5, BART and a decoder, and image classification with ViT; one report."""
    from hftoolkit.bench import bench as run_bench
    from hftoolkit.report import load_run, summary_rows

    result = run_bench(families, out, RECIPES_DIR, set_ or [], echo=typer.echo)
    _print_rows(summary_rows([load_run(o.variant.run_dir) for o in result.outcomes]))
    typer.echo(f"report: {result.report} and {result.report.with_suffix('.html')}")
    if result.failed:
        typer.echo(f"{len(result.failed)} of {len(result.outcomes)} runs failed", err=True)
        raise typer.Exit(1)


@app.command()
def parity(
    only: Annotated[str | None, typer.Option(help="Run only the rows of this component.")] = None,
    worked_examples: Annotated[bool, typer.Option(help="Also recompute the course's worked examples.")] = False,
):
    """Prove the from-scratch reference layers equal transformers, peft and torch (tiny random configs)."""
    from hftoolkit.reference.parity import main as run_parity

    raise typer.Exit(run_parity(only=only, worked_examples=worked_examples))


# The report's columns that fit a terminal; report.md and report.html have them all.
TERMINAL_COLUMNS = ("run", "family", "task", "quant", "LoRA r", "main metric", "trainable / total", "train time")


def _print_rows(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    columns = [c for c in TERMINAL_COLUMNS if rows and c in rows[0]]
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    Console().print(table)


def _print_metrics(metrics: dict, run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{metrics['name']} ({metrics['task']}, {metrics['checkpoint']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics["eval"].items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        table.add_row(key + (" *" if key == metrics["main_metric"] else ""), shown)
    for key in ("setup_seconds", "train_seconds", "eval_seconds", "samples_per_second", "tokens_per_second",
                "padding_fraction", "matmul_fraction",
                "peak_memory_mb", "trainable_params", "total_params"):
        if metrics.get(key) is not None:
            table.add_row(key, f"{metrics[key]:,}" if isinstance(metrics[key], int) else f"{metrics[key]}")
    Console().print(table)
    typer.echo(f"run directory: {run_dir}")


def main() -> None:
    """The console script. Once every exit handler has run, the process ends without the interpreter's
    teardown: freeing the modules torch, transformers and datasets import takes over a second, after the
    results are written (README, Performance); the handlers that flush logs and remove temporary files still run."""
    status = [0]
    atexit.register(_end_now, status)  # registered first, so it runs after every library's handler
    try:
        app()
    except SystemExit as done:
        status[0] = done.code if isinstance(done.code, int) else int(done.code is not None)
        raise
    except KeyboardInterrupt:
        status[0] = 130
        raise
    except BaseException:  # a crash: Python prints the traceback, the exit status says it failed
        status[0] = 1
        raise


def _end_now(status: list[int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status[0])
