"""Which process this is, read from the environment a launcher (torchrun, accelerate, mpirun) sets, without
importing torch: light commands and the console ask it before anything heavy is loaded."""

from __future__ import annotations

import os

# Set by torchrun (and so by `accelerate launch` for several processes) and by mpirun.
LAUNCHER_VARIABLES = ("WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


# `accelerate launch` with a single process sets no rank but always sets this one.
ACCELERATE_LAUNCHED = "ACCELERATE_MIXED_PRECISION"


def under_launcher() -> bool:
    return any(v in os.environ for v in LAUNCHER_VARIABLES) or ACCELERATE_LAUNCHED in os.environ


def is_main_process() -> bool:
    """Rank 0 (or no launcher), read from the environment: no torch import needed."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name]) == 0
    return True
