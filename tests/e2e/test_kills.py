"""A killed or stopped run stops whole: the kill matrix, on CPU processes.

Each strategy trains one run through a chain of interruptions, one at each checkpoint (a test hook pauses the
writing process once checkpoint k is committed, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE=k), each followed by `train --resume`:
- SIGTERM to `hftoolkit train` (what `timeout` or a scheduler sends) and SIGINT to its process group (Ctrl-C):
  exit status 143 or 130, one line naming the step and the --resume command, no traceback, manifest "stopped";
- SIGKILL of the launcher of a run started by hand (`accelerate launch -m hftoolkit train`, whose training
  processes torchrun put in sessions of their own), of `hftoolkit train` alone, and of one training process.
After each: no process of the run is alive 10 s later, every checkpoint left is complete, and `runs` never says
"running". The last --resume must end equal, to the bit, to the same run left uninterrupted (trained meanwhile,
while the first interruption's run waits at its pause, or already, by tests/e2e/test_distributed.py).

The matrix keeps the cases that differ (how each interruption reaches the processes is the same under any
strategy). DDP takes the stop signals and the SIGKILLs of a launcher: by hand, and `hftoolkit train` alone (a SIGKILL
of its whole process group, it and its launcher, leaves the training processes as the one by hand does: their
launcher dead, the parent-death signal theirs to act on). FSDP and ZeRO-3 (tests/e2e/test_fsdp.py,
tests/e2e/test_zero.py) take the SIGKILL of one training process, rank 1 of a launch on one machine as DDP's would
be, to resume from their sharded checkpoints; two machines on loopback (tests/e2e/test_multinode.py) take it on
machine 0, which the other machine must notice; each against the uninterrupted run its file trains anyway.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import RECIPES
from tests.helpers.kills import assert_same_run, kill_chain, sets_args
from tests.helpers.launches import BOUND_S, ENCODER_DDP_SETS, encoder_on_two_processes

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

ENCODER = RECIPES / "encoder-classification.yaml"

# DDP takes four interruptions, after checkpoints 1 to 4 of six (ENCODER_DDP_SETS); the SIGKILL of one training
# process is FSDP's, ZeRO-3's and two machines' (the module docstring).
DDP_EVENTS = ["SIGTERM", "SIGINT", "by-hand", "top-process"]


def test_ddp_interrupted_every_way_stops_whole_and_resumes_to_the_uninterrupted_run(tmp_path, tmp_path_factory,
                                                                                   no_dropout):
    args = [str(ENCODER), *sets_args(f"model.checkpoint={no_dropout['bert']}", *ENCODER_DDP_SETS)]
    uninterrupted = []

    def reference():  # the run tests/e2e/test_distributed.py holds to one process's (trained there, or here)
        uninterrupted.append(encoder_on_two_processes(tmp_path_factory, no_dropout["bert"])[0])

    seconds = kill_chain(tmp_path, args, tmp_path / "run", DDP_EVENTS, reference=reference)
    assert_same_run(tmp_path / "run", uninterrupted[0])
    print(f"DDP: seconds until no process was left: {seconds}")


def test_a_refusal_under_a_launch_is_one_line_said_before_any_process_starts(tmp_path, no_dropout):
    """--resume of a complete run, under the ZeRO-3 config on 2 processes: the run folder's state is checked before
    the launch, so the console shows the one line and nothing of DeepSpeed, torchrun or accelerate."""
    import yaml

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    recipe = yaml.safe_load(ENCODER.read_text())
    recipe["training"]["precision"] = "fp32"  # (what DeepSpeed on CPU processes trains with)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (run / "manifest.json").write_text(json.dumps({"status": "complete"}))
    result = subprocess.run([sys.executable, "-m", "hftoolkit", "train", "--resume", str(run), "--accelerate-config",
                             str(RECIPES / "accelerate" / "deepspeed-zero3.yaml"), "--num-processes", "2"],
                            capture_output=True, text=True, timeout=BOUND_S, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == [f"Error: --resume: run {run} is already complete, so there is nothing to resume; pass "
                     "--overwrite to train it again or choose another --output"], lines


def test_what_the_processes_find_wrong_ends_the_run_in_one_error_without_the_launchers_traceback(tmp_path):
    """Problems only the training processes find, on the main process inside main_process_first (where the other
    process waits for it): a data file that is not there (reading the data) and preflight's refusal of
    data.packing for a classifier. The run ends instead of hanging (within BOUND_S), says both problems at once, in
    one error and once (nothing of torchrun's ChildFailedError nor a traceback), and leaves no run directory."""
    missing = tmp_path / "missing.csv"
    result = subprocess.run([sys.executable, "-m", "hftoolkit", "train", str(ENCODER), "--num-processes", "2",
                             "--output", str(tmp_path / "run"), "--set", f"data.train={missing}",
                             "--set", "data.packing=true"],
                            capture_output=True, text=True, timeout=BOUND_S, stdin=subprocess.DEVNULL)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert len([line for line in output.splitlines() if line.startswith("Error:")]) == 1, output[-3000:]
    assert output.count(f"data file {missing} not found") == 1, output[-3000:]
    assert output.count("data.packing: packing whole examples into rows is for") == 1, output[-3000:]
    assert "Traceback" not in output and "ChildFailedError" not in output, output[-3000:]
    assert not (tmp_path / "run").exists(), "bad input found before training leaves no run directory"


def test_a_resume_under_another_sharding_is_refused_in_one_line(tmp_path):
    """An FSDP run's checkpoints resumed as plain DDP (the accelerate config forgotten): named before the launch."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "recipe.yaml").write_text(ENCODER.read_text())
    config = RECIPES / "accelerate" / "fsdp.yaml"
    (run / "manifest.json").write_text(json.dumps({"status": "stopped", "distributed": {"type": "FSDP"},
                                                   "command": f"hftoolkit train x.yaml --accelerate-config {config}"}))
    result = subprocess.run([sys.executable, "-m", "hftoolkit", "train", "--resume", str(run), "--num-processes", "2"],
                            capture_output=True, text=True, timeout=BOUND_S, stdin=subprocess.DEVNULL)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, lines
    assert "trained under FSDP" in lines[0] and f"--accelerate-config {config}" in lines[0], lines
