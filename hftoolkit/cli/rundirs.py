"""The commands that read or hand on finished run directories: `runs` (list them), `compare` (one report),
`merge` (fold the LoRA adapter in), `export` (GGUF, Ollama, ONNX) and `push` (publish to the Hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hftoolkit.base.errors import UserError
from hftoolkit.cli import stdout
from hftoolkit.cli.options import QuietOption, VerboseOption
from hftoolkit.exports import formats_help


def list_run_dirs(
    root: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to search, sweeps included.")] = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as one JSON array.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help=(
        "Show every column, one line a run however wide that makes it (a pager such as less -S shows it whole); "
        "by default the columns that don't fit the terminal are left out and named under the table."))] = False,
):
    """List run directories newest first: status, task, checkpoint, main metric, train time, date."""
    from hftoolkit.runs.listing import list_runs, print_runs

    found = list_runs(root)
    if as_json:
        import json

        typer.echo(json.dumps(found, indent=2, ensure_ascii=False))
    else:
        print_runs(found, root, wide=wide)


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
    from hftoolkit.base import console
    from hftoolkit.workflows.merge import merge_run

    verbosity = console.verbosity_from_flags(verbose, quiet)
    with console.capture(verbosity=verbosity, explain_loading=False):  # the run's head comes with its adapter
        merged = merge_run(run_dir, output, dtype)
    if verbosity == console.Verbosity.QUIET:
        typer.echo(str(merged))
    else:
        typer.echo(f"merged checkpoint written to {merged}: {stdout.files_in(merged)}")


def export(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory written by train (or a folder "
                                            "merge wrote).")],
    format_: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help=formats_help())],
    output: Annotated[Path, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "A new (or empty) folder for the export; it appears whole or not at all."))],
    quantization: Annotated[str | None, typer.Option("--quantization", "-q", metavar="TYPE", help=(
        "GGUF weights: f32, f16 (default), bf16 or q8_0."))] = None,
    verbose: VerboseOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", help=(  # (-q is --quantization here)
        "Print only errors and the path written."))] = False,
):
    """Export a run for another runtime, LoRA merged in; the file is read back, run on a few eval inputs beside
    the run, and the difference printed: an export beyond its format's tolerance fails and leaves nothing."""
    from hftoolkit.base import console
    from hftoolkit.training.relaunch import command_line
    from hftoolkit.workflows.export import export_run

    verbosity = console.verbosity_from_flags(verbose, quiet)
    with console.capture(verbosity=verbosity, explain_loading=False):  # the run's head comes with its weights
        done = export_run(run_dir, output, format_, quantization, " ".join(command_line()))
    if verbosity == console.Verbosity.QUIET:
        typer.echo(str(done.folder))
        return
    typer.echo(f"exported {done.record['format']}{f' ({q})' if (q := done.record['quantization']) else ''} to "
               f"{done.folder}: {stdout.files_in(done.folder)}")
    typer.echo(done.line)


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
