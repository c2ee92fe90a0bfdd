"""Options several commands share, typed once: the recipe's overrides, the output's form, and the launch options
`train` and `plan` both take."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SetOption = Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE",
                                                     help="Override a recipe key: a.b.c=value.")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help=(
    "Show the libraries' own logs and warnings too (train, eval and sweep always keep them in the run "
    "directory's train.log)."))]
JsonOption = Annotated[bool, typer.Option("--json", help=(
    "Print metrics.json's content as one JSON object on standard output, and nothing else there (the toolkit's "
    "lines go to standard error)."))]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print only errors and the path written.")]

NumProcessesOption = Annotated[int | None, typer.Option(
    "--num-processes", min=1, metavar="N", help="Train on N processes (one per GPU; gloo on a CPU), started "
                                                "through accelerate launch. training.batch_size is split over "
                                                "them.")]
AccelerateConfigOption = Annotated[Path | None, typer.Option(
    "--accelerate-config", metavar="FILE", help="An accelerate launch config (see recipes/accelerate/); "
                                                "overrides the recipe's training.accelerate_config.")]
NumMachinesOption = Annotated[int | None, typer.Option(
    "--num-machines", min=1, metavar="M", help="Train on M machines, each running this same command with its "
                                               "own --machine-rank; --num-processes then counts the processes "
                                               "of all machines together.")]


def tcp_port(value: int | None) -> int | None:
    """An option's callback: a port above 65535 refused (the range in the option's min and help says the floor;
    click's full range would print as "0<=x<=65535" in --help)."""
    if value is not None and value > 65535:
        raise typer.BadParameter(f"{value} is above 65535, the highest TCP port")
    return value
