"""Which process this is, read from the environment a launcher (torchrun, accelerate, mpirun) sets, without
importing torch: light commands and the console ask it before anything heavy is loaded. The one reader of the rank
variables: the launch (training/strategies/launch.py) and the failure reasons (lifecycle.py) ask here."""

from __future__ import annotations

import os

# This process's global rank, and the number of processes, as torchrun names them (and so `accelerate launch` for
# several processes), then mpirun (Open MPI, then MPICH's PMI).
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# Set by torchrun (and so by `accelerate launch` for several processes) and by mpirun.
LAUNCHER_VARIABLES = ("WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


# `accelerate launch` with a single process sets no rank but always sets this one.
ACCELERATE_LAUNCHED = "ACCELERATE_MIXED_PRECISION"


def under_launcher() -> bool:
    return any(v in os.environ for v in LAUNCHER_VARIABLES) or ACCELERATE_LAUNCHED in os.environ


def _first(names: tuple[str, ...], default: int) -> int:
    """The first of `names` that is set (and not empty), as a number; `default` where none is."""
    return next((int(os.environ[name]) for name in names if os.environ.get(name)), default)


def rank() -> int:
    """This process's global rank (0 without a launcher)."""
    return _first(RANK_VARIABLES, 0)


def world_size() -> int:
    """How many processes the launch started, on every machine together (1 without a launcher)."""
    return _first(WORLD_SIZE_VARIABLES, 1)


def local_world_size() -> int:
    """How many of them run on this machine (torchrun's LOCAL_WORLD_SIZE; all of them where it is not set)."""
    return _first(("LOCAL_WORLD_SIZE",), world_size())


def machine_rank() -> int:
    """This machine's rank among the launch's machines (torchrun's GROUP_RANK; 0 where it is not set)."""
    return _first(("GROUP_RANK",), 0)


def is_main_process() -> bool:
    """Rank 0 (or no launcher), read from the environment: no torch import needed."""
    return rank() == 0
