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
def eval_(run_dir: Annotated[Path, typer.Argument(help="A run directory written by train.")]):
    """Evaluate a trained run again on its eval split and update its metrics.json."""
    from hftoolkit.evaluation import reevaluate

    _print_metrics(reevaluate(run_dir), run_dir)


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
            typer.echo(f"ok: {path}")
            if parsed.advice:
                typer.echo(f"note: {parsed.advice}")
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
def bench(
    families: Annotated[list[str] | None, typer.Option("--families", help="Families to train (default all).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for the runs and the report.")] = Path("bench"),
    set_: SetOption = None,
):
    """Train each family's smoke recipe (offline) and write the cross-architecture comparison report."""
    from hftoolkit.bench import SMOKE_RECIPES
    from hftoolkit.bench import bench as run_bench
    from hftoolkit.report import load_run, summary_rows

    path, runs = run_bench(families or list(SMOKE_RECIPES), out, RECIPES_DIR, set_ or [])
    _print_rows(summary_rows([load_run(p) for p in runs]))
    typer.echo(f"report: {path} and {path.with_suffix('.html')}")


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
    teardown: freeing the modules torch, transformers and datasets import takes 1.4 s here, after
    the results are written (the handlers that flush logs and remove temporary files still run)."""
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
