"""A run killed with SIGKILL where a test hook pauses it, and the checks that a resumed run trained as the
uninterrupted one: `hftoolkit train` started as a process with test hooks in its environment, killed with its whole
tree once paused, and the per-step losses and final adapter weights compared."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.processes import kill_tree, start_in_group

TOLERANCE = 1e-6


def start_training(recipe, run, sets, **hooks) -> subprocess.Popen:
    """`hftoolkit train` in its own process (so it can be SIGKILLed), with test hooks in its environment."""
    args = [sys.executable, "-m", "hftoolkit", "train", str(recipe), "--output", str(run)]
    for s in sets:
        args += ["--set", s]
    with open(run.parent / f"{run.name}.log", "wb") as log:
        return start_in_group(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **hooks})


def kill_when_paused(process: subprocess.Popen, log: Path | None = None, timeout: float = 300) -> None:
    """SIGKILL the process and its whole tree once a test hook says it is paused (checkpoints.test_pause prints the
    line to `log`, by default the one start_training writes); fail with the log if it ends or never gets there."""
    from hftoolkit.training.checkpoints import PAUSED

    log = log or Path(process.args[process.args.index("--output") + 1] + ".log")
    deadline = time.monotonic() + timeout
    try:
        while PAUSED not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"training never reached its test pause (exit {process.poll()}):\n"
                            + log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
    finally:
        kill_tree(process)


@contextlib.contextmanager
def killed_on_error(process: subprocess.Popen):
    try:
        yield
    except BaseException:
        kill_tree(process)
        raise


def losses(run) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def adapter(run):
    from safetensors.torch import load_file

    return load_file(run / "adapter" / "adapter_model.safetensors")


def assert_same_training(reference, resumed, steps: int) -> tuple[float, float]:
    """Same per-step losses and final adapter weights (within TOLERANCE); returns the largest differences."""
    ref_losses, res_losses = losses(reference), losses(resumed)
    assert sorted(ref_losses) == sorted(res_losses) == list(range(1, steps + 1))
    loss_diff = max(abs(ref_losses[s] - res_losses[s]) for s in ref_losses)
    ref_weights, res_weights = adapter(reference), adapter(resumed)
    assert ref_weights.keys() == res_weights.keys()
    weight_diff = max(float((ref_weights[k] - res_weights[k]).abs().max()) for k in ref_weights)
    print(f"max |loss diff| {loss_diff:.3g}, max |adapter weight diff| {weight_diff:.3g}")
    assert loss_diff <= TOLERANCE and weight_diff <= TOLERANCE, (loss_diff, weight_diff)
    return loss_diff, weight_diff
