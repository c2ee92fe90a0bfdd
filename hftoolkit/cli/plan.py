"""`hftoolkit plan RECIPE`: the run's memory per process, itemized, and its time, for the launch it names and for
every other strategy beside it, on this machine or a GPU named from the table. Reads the model's config only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from hftoolkit.cli.options import AccelerateConfigOption, NumMachinesOption, NumProcessesOption, SetOption


def plan(
    recipe: Annotated[Path, typer.Argument(metavar="RECIPE", help="Recipe YAML file.")],
    set_: SetOption = None,
    num_processes: NumProcessesOption = None,
    accelerate_config: AccelerateConfigOption = None,
    num_machines: NumMachinesOption = None,
    gpu: Annotated[str | None, typer.Option("--gpu", metavar="NAME", help=(
        "Plan for a GPU from the table (t4, l4, a10g, a100-40gb, a100-80gb, h100-80gb, h200, ...): its memory and "
        "its bf16/fp16 peak, one per process."))] = None,
    gpu_memory: Annotated[float | None, typer.Option("--gpu-memory", metavar="GIB", help=(
        "Plan for a GPU with this much memory per process (GiB)."))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object on standard output.")
                       ] = False,
    param: Annotated[list[str] | None, typer.Option("--param", metavar="KEY=SPACE", help=(
        "A search's space, as sweep --search takes it (repeatable): plan its costliest trial, and how many trials "
        "this machine runs at once."))] = None,
):
    """Plan a run's memory and time before launching it: per process, itemized, for every strategy."""
    from hftoolkit.base import console
    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.devices import device_named, device_with_memory, this_machine
    from hftoolkit.planning.plan import plan_recipe
    from hftoolkit.training.strategies.launch import Machines, check_machines, plan_from_config

    if gpu is not None and gpu_memory is not None:
        raise UserError("--gpu and --gpu-memory both name the device: pass one of them")
    device = device_named(gpu) if gpu is not None else device_with_memory(gpu_memory) if gpu_memory is not None \
        else this_machine()
    parsed = load_recipe(recipe, set_ or [])
    config = accelerate_config or (Path(parsed.training.accelerate_config)
                                   if parsed.training.accelerate_config else None)
    launch = plan_from_config(config, num_processes, "--accelerate-config" if config else "--num-processes",
                              Machines(num_machines=num_machines, main_process_ip="(planned)"))
    problems = check_machines(launch)
    if problems:
        raise UserError(problems[0])
    if param:
        return plan_search(recipe, set_ or [], param, launch, device, as_json)
    with console.capture(explain_loading=False):  # the libraries' lines (DeepSpeed's on stdout) kept off the plan
        planned = plan_recipe(parsed, launch, device)
    if as_json:
        typer.echo(json.dumps(planned.as_dict(), indent=2))
    else:
        show(planned)


def plan_search(recipe: Path, sets: list[str], params: list[str], launch, device, as_json: bool) -> None:
    """The costliest trial of the space, shown as `plan` shows a run, then how many such trials fit at once."""
    from hftoolkit.base import console
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.planning.plan import plan_recipe
    from hftoolkit.planning.sweep import TrialPlan, costliest_overrides, trials_at_once
    from hftoolkit.workflows.search import _visible_gpus
    from hftoolkit.workflows.search_space import parse_space

    space = parse_space(params, recipe, sets)
    worst = None
    with console.capture(explain_loading=False):
        for overrides in costliest_overrides(space):
            planned = plan_recipe(load_recipe(recipe, [*sets, *overrides]), launch, device)
            peak = planned.chosen.memory.peak if planned.chosen.memory is not None else 0
            if worst is None or peak > worst[2]:
                worst = (overrides, planned, peak)
    overrides, planned, peak = worst
    processes = planned.chosen.processes
    at_once, limit = trials_at_once(peak, processes, device, len(_visible_gpus()))
    trial = TrialPlan(tuple(overrides), peak, processes, at_once, limit)
    if as_json:
        typer.echo(json.dumps({"trial": vars(trial) | {"overrides": list(trial.overrides)},
                               "plan": planned.as_dict()}, indent=2))
        return
    show(planned)
    typer.echo(f"a trial at the costliest corner of the space ({', '.join(overrides)}) peaks at {_gib(peak)} GiB "
               f"per process on {processes} process(es); this machine runs {at_once} such trial(s) at once ({limit}): "
               f"sweep --search --workers {max(1, at_once)}")


def show(planned) -> None:
    """The launch's strategy itemized, then every strategy in one table, then the cheapest that fits."""
    from rich.console import Console
    from rich.table import Table

    console, chosen, shape = Console(), planned.chosen, planned.shape
    console.print(f"{planned.recipe}: {planned.checkpoint}, {shape.get('parameters', 0) / 1e6:,.1f}M parameters "
                  f"({shape.get('trainable', 0) / 1e6:,.2f}M trained), {planned.precision}, on {planned.device.name}")
    if chosen.memory is not None:
        items = Table(title=f"{_on(chosen)}: memory per process")
        items.add_column("item")
        items.add_column("GiB", justify="right")
        for item, count in chosen.memory.items.items():
            items.add_row(item, _gib(count))
        items.add_row("peak", _gib(chosen.memory.peak))
        console.print(items)
    if chosen.time is not None and chosen.time.items:
        step = Table(title=f"{_on(chosen)}: a step's time")
        step.add_column("item")
        step.add_column("ms", justify="right")
        for item, seconds in chosen.time.items.items():
            step.add_row(item, f"{seconds * 1000:,.1f}")
        step.add_row("step", f"{chosen.time.step_seconds * 1000:,.1f}")
        console.print(step)
    table = Table(title="every strategy")
    for column in ("strategy", "processes", "peak GiB / process", "fits", "step", "run"):
        table.add_column(column, justify="left" if column in ("strategy", "fits") else "right")
    for row in planned.strategies:
        if row.not_possible:
            keys = ", ".join(dict.fromkeys(p.split(":", 1)[0] for p in row.not_possible))
            table.add_row(row.label, str(row.processes), "-", f"not possible ({keys})", "-", "-")
            continue
        fits = {True: "yes", False: "no", None: "?"}[row.memory.fits]
        # (auto steps down where a strategy can't run the device's pick: DeepSpeed's CPU processes train in fp32)
        label = row.label if row.precision == planned.precision else f"{row.label} ({row.precision})"
        table.add_row(label, str(row.processes), _gib(row.memory.peak), fits, _seconds(row.time.step_seconds),
                      _seconds(row.time.train_seconds))
    console.print(table)
    for row in planned.strategies:
        for problem in row.not_possible:
            console.print(f"{row.label} is not possible: {problem}", soft_wrap=True)
    best = planned.cheapest_fit
    console.print(f"cheapest that fits: {_on(best)}" if best else "no strategy fits this device: set "
                  "training.gradient_checkpointing, 4-bit weights with LoRA, or a smaller training.batch_size, and "
                  "plan again")


def _on(row) -> str:
    return row.label if row.processes == 1 else f"{row.label} on {row.processes} processes"


def _gib(count: float | None) -> str:
    return "-" if count is None else f"{count / 2**30:,.2f}"


def _seconds(value: float | None) -> str:
    from hftoolkit.runs.summary import format_seconds

    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else format_seconds(value)
