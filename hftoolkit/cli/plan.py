"""`hftoolkit plan RECIPE`: the run's memory per process, itemized, and its time, for the launch it names and for
every other strategy beside it, on this machine or a GPU named from the table. Reads the model's config only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from hftoolkit.base.console import gib
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
    from hftoolkit.training.strategies.launch import Machines, check_machines, plan_from_options

    if gpu is not None and gpu_memory is not None:
        raise UserError("--gpu and --gpu-memory both name the device: pass one of them")
    device = device_named(gpu) if gpu is not None else device_with_memory(gpu_memory) if gpu_memory is not None \
        else this_machine()
    parsed = load_recipe(recipe, set_ or [])
    _check_precision(parsed, device)
    launch = plan_from_options(parsed, accelerate_config, num_processes,
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


def _check_precision(recipe, device) -> None:
    """training.precision against the device planned on, as `train` checks it on this machine (job/hardware.py):
    refused in the same line, or the same warning (on standard error) where it trains slowly."""
    from hftoolkit.base import console
    from hftoolkit.config.recipe import RecipeError
    from hftoolkit.job.hardware import precision_problems, precision_warning

    cuda = device.kind == "cuda"
    refused = precision_problems(recipe.training.precision, cuda)
    if refused:
        raise RecipeError(refused)
    if slow := precision_warning(recipe.training.precision, cuda):
        console.warn(slow)


def plan_search(recipe: Path, sets: list[str], params: list[str], launch, device, as_json: bool) -> None:
    """The costliest trial of the space, shown as `plan` shows a run, then how many such trials fit at once."""
    from hftoolkit.base import console
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.planning.plan import plan_recipe
    from hftoolkit.planning.sweep import TrialPlan, costliest_overrides, trials_at_once
    from hftoolkit.sweeps.search import _visible_gpus
    from hftoolkit.sweeps.space import parse_space

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
    typer.echo(f"a trial at the costliest corner of the space ({', '.join(overrides)}) peaks at "
               f"{gib(peak, 2, unit=False)} GiB per process on {processes} process(es); this machine runs {at_once} "
               f"such trial(s) at once ({limit}): sweep --search --workers {max(1, at_once)}")


def show(planned) -> None:
    """The launch's strategy itemized, then every strategy in one table, what its time covers, then the strategy
    that fits at the lowest cost per run."""
    from rich.console import Console
    from rich.table import Table

    from hftoolkit.runs.summary import format_count

    console, chosen, shape = Console(), planned.chosen, planned.shape
    console.print(f"{planned.recipe}: {planned.checkpoint}, {format_count(shape.get('parameters', 0))} parameters "
                  f"({format_count(shape.get('trainable', 0))} trained), {planned.precision}, on "
                  f"{planned.device.name}")
    if chosen.memory is not None:
        items = Table(title=f"{_on(chosen)}: memory per process")
        items.add_column("item")
        items.add_column("GiB", justify="right")
        for item, count in chosen.memory.items.items():
            items.add_row(item, gib(count, 2, unit=False))
        items.add_row("peak", gib(chosen.memory.peak, 2, unit=False))
        console.print(items)
    if chosen.time is not None and chosen.time.items:
        step = Table(title=f"{_on(chosen)}: a step's time")
        step.add_column("item")
        step.add_column("time", justify="right")
        for item, seconds in chosen.time.items.items():
            step.add_row(item, duration(seconds))
        step.add_row("step", duration(chosen.time.step_seconds))
        console.print(step)
    table = Table(title="every strategy")
    for column in ("strategy", "processes", "peak GiB / process", "fits", "step", "training"):
        table.add_column(column, justify="left" if column in ("strategy", "fits") else "right")
    for row in planned.strategies:
        if row.not_possible:
            keys = ", ".join(dict.fromkeys(p.split(":", 1)[0] for p in row.not_possible))
            table.add_row(row.label, str(row.processes), "-", f"not possible ({keys})", "-", "-")
            continue
        fits = {True: "yes", False: "no", None: "?"}[row.memory.fits]
        # (auto steps down where a strategy can't run the device's pick: DeepSpeed's CPU processes train in fp32)
        label = row.label if row.precision == planned.precision else f"{row.label} ({row.precision})"
        table.add_row(label, str(row.processes), gib(row.memory.peak, 2, unit=False), fits,
                      duration(row.time.step_seconds), duration(row.time.train_seconds))
    console.print(table)
    console.print(covers(planned), soft_wrap=True)
    for row in planned.strategies:
        for problem in row.not_possible:
            console.print(f"{row.label} is not possible: {problem}", soft_wrap=True)
    console.print(pick_line(planned), soft_wrap=True)


# What the pick minimises, as the text and the JSON ("lowest_cost_fit") name it.
PICK = "lowest cost per run"


def pick_line(planned) -> str:
    """The strategy that fits at the lowest cost per run, and the cost it was picked by."""
    best = planned.lowest_cost_fit
    if best is None:
        return ("no strategy fits this device: set training.gradient_checkpointing, 4-bit weights with LoRA, or a "
                "smaller training.batch_size, and plan again")
    gpu = planned.device.kind == "cuda"
    held = f"{best.devices} GPU{'s' * (best.devices != 1)}" if gpu else \
        f"{best.devices} machine{'s' * (best.devices != 1)}"
    if best.device_seconds is None:
        return f"{PICK} that fits: {_on(best)} (the fewest GPUs: this GPU's speed is unknown, so no time is planned)"
    if best.time.train_seconds is None:
        return f"{PICK} that fits: {_on(best)} ({held} for {duration(best.device_seconds / best.devices)} a step)"
    start = f" and {duration(best.launch_seconds)} to start its processes" if best.launch_seconds else ""
    return f"{PICK} that fits: {_on(best)} ({held} for {duration(best.time.train_seconds)} of training{start})"


def covers(planned) -> str:
    """What the times count, in one line."""
    at = {"data": "the padded length of the data's batches", "images": "its images' size"}.get(
        planned.lengths_from, "the recipe's data.max_length (its data or tokenizer is not at hand here)")
    said = (f"time: a step at {at}; training: the Trainer's start and its steps, as metrics.json's train_seconds "
            "counts them (not the loading and tokenizing before, nor the evaluation after)")
    if planned.device.kind == "cuda":
        said += (f"; on a GPU each step's products at its peak x {planned.device.utilisation:.0%} utilisation, a "
                 "floor for a small model, whose steps wait on the host and on kernel launches")
    return said


def _on(row) -> str:
    return row.label if row.processes == 1 else f"{row.label} on {row.processes} processes"


def duration(seconds: float | None) -> str:
    """A planned duration with two digits at least, however short: 0.42 ms, 37 µs, 12 ms, 5.1 s, 2m 03s; 0 for none."""
    from hftoolkit.runs.summary import format_seconds

    if seconds is None:
        return "-"
    if seconds == 0:  # (an item the step does not have: no collectives on one process)
        return "0"
    if seconds >= 1:
        return format_seconds(seconds)
    if seconds >= 1e-4:
        value, unit = seconds * 1e3, "ms"
    elif seconds >= 1e-6:
        value, unit = seconds * 1e6, "µs"
    else:
        return "<1 µs"
    return f"{value:.0f} {unit}" if value >= 10 else f"{value:.2g} {unit}"
