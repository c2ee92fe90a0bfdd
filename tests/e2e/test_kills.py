"""A killed or stopped run stops whole: the kill matrix, on CPU processes.

Each strategy trains one run through a chain of interruptions, one at each checkpoint (a test hook pauses the
writing process once checkpoint k is committed, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE=k), each followed by `train --resume`:
- SIGTERM to `hftoolkit train` (what `timeout` or a scheduler sends) and SIGINT to its process group (Ctrl-C):
  exit status 143 or 130, one line naming the step and the --resume command, no traceback, manifest "stopped";
- SIGKILL of the launcher's process group, of the top process alone, and of one training process.
After each: no process of the run is alive 10 s later, every checkpoint left is complete, and `runs` never says
"running". The last --resume must end equal, to the bit, to the same run left uninterrupted (trained meanwhile,
while the first interruption's run waits at its pause).

DDP and two machines on loopback are here; FSDP and ZeRO-3 run the same chain (tests/helpers/kills.py) in
tests/e2e/test_fsdp.py and tests/e2e/test_zero.py, against the uninterrupted runs those files train anyway.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import RECIPES
from tests.helpers.kills import (
    KILLS,
    Launch,
    assert_all_gone,
    assert_same_run,
    finish,
    kill_chain,
    launch,
    sets_args,
    wait_until_paused,
)
from tests.helpers.launches import BOUND_S, SAME_BATCHES
from tests.helpers.processes import start_in_group

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

ENCODER = RECIPES / "encoder-classification.yaml"

# DDP takes five interruptions: six steps, a checkpoint each.
DDP_SETS = (*SAME_BATCHES, "training.max_steps=6", "data.max_train_samples=96", "training.save_steps=1",
            "data.max_eval_samples=8", "eval.max_predictions=2")
DDP_EVENTS = ["SIGTERM", "SIGINT", *KILLS]


def test_ddp_interrupted_every_way_stops_whole_and_resumes_to_the_uninterrupted_run(tmp_path, no_dropout):
    args = [str(ENCODER), *sets_args(f"model.checkpoint={no_dropout['bert']}", *DDP_SETS)]

    def reference():
        codes = finish(launch(tmp_path, "uninterrupted", [*args, "--output", str(tmp_path / "uninterrupted")]))
        assert codes == [0], (tmp_path / "uninterrupted-machine0.log").read_text()[-3000:]

    seconds = kill_chain(tmp_path, args, tmp_path / "run", DDP_EVENTS, reference=reference)
    assert_same_run(tmp_path / "run", tmp_path / "uninterrupted")
    print(f"DDP: seconds until no process was left: {seconds}")


TWO_MACHINE_SETS = (*SAME_BATCHES, "training.save_steps=1", "data.max_eval_samples=8", "eval.max_predictions=2")


def test_two_machines_killed_every_way_stop_whole_and_resume_to_the_uninterrupted_run(tmp_path, no_dropout):
    """Two machines on loopback sharing the run directory; machine 0 (the writer) takes each kill, and machine 1,
    waiting on it, must notice and end too."""
    args = [str(ENCODER), *sets_args(f"model.checkpoint={no_dropout['bert']}", *TWO_MACHINE_SETS)]

    def reference():
        codes = finish(launch(tmp_path, "uninterrupted", [*args, "--output", str(tmp_path / "uninterrupted")], 2))
        assert codes == [0, 0], (tmp_path / "uninterrupted-machine0.log").read_text()[-3000:]

    seconds = kill_chain(tmp_path, args, tmp_path / "run", list(KILLS), machines=2, reference=reference)
    assert_same_run(tmp_path / "run", tmp_path / "uninterrupted")
    print(f"two machines: seconds until no process was left: {seconds}")


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


def test_a_refusal_the_processes_find_is_said_once_without_the_launchers_traceback(tmp_path):
    """A problem only the training processes find (preflight's), raised by both: the console shows it once, and
    nothing of torchrun's ChildFailedError."""
    result = subprocess.run([sys.executable, "-m", "hftoolkit", "train", str(ENCODER), "--num-processes", "2",
                             "--output", str(tmp_path / "run"), "--set", "data.packing=true"],
                            capture_output=True, text=True, timeout=BOUND_S, stdin=subprocess.DEVNULL)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "data.packing" in errors[0], output[-3000:]
    assert "Traceback" not in output and "ChildFailedError" not in output, output[-3000:]
    assert not (tmp_path / "run").exists()


def test_under_accelerate_launch_started_by_hand_the_workers_end_with_the_launcher(tmp_path, no_dropout):
    """`accelerate launch -m hftoolkit train ...`, the launcher SIGKILLed at a pause: its training processes, which
    torchrun put in sessions of their own, end with it."""
    args = [str(ENCODER), "--output", str(tmp_path / "run"),
            *sets_args(f"model.checkpoint={no_dropout['bert']}", *DDP_SETS)]
    log = tmp_path / "by-hand.log"
    with log.open("wb") as out:
        launcher = start_in_group(
            [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu",
             "--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no", "--dynamo_backend", "no",
             "-m", "hftoolkit", "train", *args], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true",
                 "HFTOOLKIT_TEST_PAUSE_AFTER_SAVE": "1"})
    run = Launch([launcher], [log])
    wait_until_paused(run)
    tree = run.tree()
    assert len(run.workers()) == 2
    launcher.send_signal(signal.SIGKILL)
    seconds = assert_all_gone(tree, "SIGKILL of accelerate launch")
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["status"] == "stopped"
    print(f"by hand: the training processes ended {seconds:.1f} s after their launcher")


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
