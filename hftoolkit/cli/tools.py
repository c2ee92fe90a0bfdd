"""The commands beside a run's life cycle: `init-model` (a tiny random checkpoint for offline runs), `doctor`
(what this machine offers) and `parity` (the from-scratch reference layers against the libraries)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def init_model(
    arch: Annotated[str, typer.Argument(metavar="ARCH", help="bert, gpt2, t5, bart or vit.")],
    out: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to create.")],
):
    """Write a tiny random checkpoint with a locally trained tokenizer (for offline smoke runs)."""
    from hftoolkit.sources.tiny import init_model as build

    typer.echo(f"wrote {build(arch, out)}")


def doctor():
    """Versions, the optional features installed or not, CUDA and bitsandbytes backend, offline or not, free disk
    (imports no torch)."""
    from hftoolkit.cli.doctor import report

    for key, value in report():
        typer.echo(f"{key:<22}{value}")


def parity(
    only: Annotated[str | None, typer.Option(metavar="COMPONENT", help="Run only the rows of this component.")
                    ] = None,
    worked_examples: Annotated[bool, typer.Option("--worked-examples", help="Also recompute the course's worked "
                                                                            "examples.")] = False,
):
    """Prove the from-scratch reference layers equal transformers, peft and torch (tiny random configs)."""
    from hftoolkit.reference.parity import main as run_parity

    raise typer.Exit(run_parity(only=only, worked_examples=worked_examples))
