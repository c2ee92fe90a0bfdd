"""A search's plan: what one trial needs (the recipe planned at the costliest corner of the space: each range at
its HIGH, every combination of the choices) and how many trials this machine runs at once, as `sweep --workers`
would split it (GPUs by the trial's processes, else CPU cores and RAM)."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from hftoolkit.base.console import gib

# Combinations of choices planned at most: past this, the choices' first values stand for the rest.
MAX_COMBINATIONS = 16


@dataclass(frozen=True)
class TrialPlan:
    overrides: tuple[str, ...]  # the --set items of the costliest trial
    peak: int  # bytes per process
    processes: int
    at_once: int  # trials this machine runs at once
    limit: str  # what bounds at_once, in words


def costliest_overrides(space) -> list[list[str]]:
    """The trials to plan: each range at its HIGH, with every combination of the choices (up to MAX_COMBINATIONS)."""
    fixed = [p.override(p.high) for p in space.params if p.kind != "choice"]
    choices = [[p.override(v) for v in p.choices] for p in space.params if p.kind == "choice"]
    combos = list(itertools.islice(itertools.product(*choices), MAX_COMBINATIONS)) if choices else [()]
    return [[*fixed, *combo] for combo in combos]


def trials_at_once(peak: int, processes: int, device, gpus: int, cores: int | None = None) -> tuple[int, str]:
    """How many trials of `processes` processes, each process peaking at `peak` bytes, fit at once."""
    if device.kind == "cuda":
        if peak > device.memory:
            return 0, f"a process needs more than one GPU's {gib(device.memory)}"
        return gpus // processes, f"{gpus} GPU(s), {processes} per trial"
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    by_cores = cores // processes
    by_memory = int(device.memory // max(1, peak * processes))
    if by_memory < by_cores:
        return by_memory, f"{gib(device.memory)} of RAM, {gib(peak * processes, 2)} per trial"
    return by_cores, f"{cores} CPU core(s), at least one per process"
