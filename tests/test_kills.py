"""A killed or stopped run stops whole: the kill matrix, on CPU processes.

Each strategy trains one run through a chain of interruptions, one at each checkpoint (a test hook pauses the
writing process once checkpoint k is committed, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE=k), each followed by `train --resume`:
- SIGTERM to `hftoolkit train` (what `timeout` or a scheduler sends) and SIGINT to its process group (Ctrl-C):
  exit status 143 or 130, one line naming the step and the --resume command, no traceback, manifest "stopped";
- SIGKILL of the launcher's process group, of the top process alone, and of one training process.
After each: no process of the run is alive 10 s later, every checkpoint left is complete, and `runs` never says
"running". The last --resume must end equal, to the bit, to the same run left uninterrupted (trained meanwhile,
while the first interruption's run waits at its pause).

DDP and two machines on loopback are here; FSDP and ZeRO-3 run the same chain in tests/test_fsdp.py and
tests/test_zero.py, against the uninterrupted runs those files train anyway.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from hftoolkit.training.checkpoints import PAUSED, complete_checkpoints
from tests.conftest import RECIPES, run_cli
from tests.processes import kill_tree, start_in_group
from tests.test_distributed import BOUND_S, SAME_BATCHES, no_dropout, step_losses
from tests.test_multinode import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]
__all__ = ["no_dropout"]  # (a fixture, imported to be shared)

ENCODER = RECIPES / "encoder-classification.yaml"
GONE_WITHIN_S = 10  # after an interruption, no process of the run may be alive this long after
# How each interruption is dealt, and to which process of machine 0 (the writer's machine).
SIGNALS = {"SIGTERM": (signal.SIGTERM, 143), "SIGINT": (signal.SIGINT, 130)}
KILLS = ("launcher-group", "top-process", "one-worker")


@dataclass
class Launch:
    """One `hftoolkit train` per machine, each in a session of its own (as a terminal would start it)."""

    machines: list[subprocess.Popen]
    logs: list[Path]

    def output(self, machine: int = 0) -> str:
        return self.logs[machine].read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        """Every process of the run: each machine's top process and its descendants."""
        found = []
        for machine in self.machines:
            try:
                top = psutil.Process(machine.pid)
                found += [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return found

    def workers(self) -> dict[int, psutil.Process]:
        """rank -> training process (the processes whose environment torchrun gave a RANK)."""
        found = {}
        for process in self.tree():
            try:
                rank = process.environ().get("RANK")
                if rank is not None and "hftoolkit.training.launcher" not in process.cmdline():
                    found[int(rank)] = process
            except psutil.Error:
                pass
        return found


def launch(root: Path, name: str, args: list[str], machines: int = 1, pause: int | None = None) -> Launch:
    """`hftoolkit train ARGS` (on `machines` machines of one process each, meeting on loopback)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pause is not None:
        env["HFTOOLKIT_TEST_PAUSE_AFTER_SAVE"] = str(pause)
    port = str(free_port())
    started, logs = [], []
    for rank in range(machines):
        spread = ["--num-processes", "2"] if machines == 1 else [
            "--num-processes", "2", "--num-machines", "2", "--machine-rank", str(rank), "--main-process-ip",
            "127.0.0.1", "--main-process-port", port]
        log = root / f"{name}-machine{rank}.log"
        with log.open("wb") as out:
            started.append(start_in_group([sys.executable, "-m", "hftoolkit", "train", *args, *spread], stdout=out,
                                          stderr=subprocess.STDOUT, env=env))
        logs.append(log)
    return Launch(started, logs)


def wait_until_paused(run: Launch) -> None:
    deadline = time.monotonic() + BOUND_S
    while PAUSED not in run.output():
        ended = [m.returncode for m in run.machines if m.poll() is not None]
        if ended or time.monotonic() > deadline:
            pytest.fail(f"the run never reached its test pause (exits {ended}):\n{run.output()[-3000:]}")
        time.sleep(0.2)


def finish(run: Launch) -> list[int]:
    codes = []
    for machine, log in zip(run.machines, run.logs):
        try:
            codes.append(machine.wait(timeout=BOUND_S))
        except subprocess.TimeoutExpired:
            for m in run.machines:
                kill_tree(m)
            output = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"still running after {BOUND_S} s (a process hangs):\n{output}")
    return codes


def interrupt(run: Launch, how: str) -> None:
    """Deal interruption `how` to machine 0: a stop signal, or a SIGKILL of its launcher's group, of its top
    process alone, or of one training process (rank 1 on one machine; machine 0's own on two)."""
    top = run.machines[0]
    if how == "SIGTERM":
        top.send_signal(signal.SIGTERM)
    elif how == "SIGINT":
        os.killpg(top.pid, signal.SIGINT)  # as Ctrl-C reaches the terminal's foreground group
    elif how == "launcher-group":
        os.killpg(top.pid, signal.SIGKILL)
    elif how == "top-process":
        top.send_signal(signal.SIGKILL)
    else:
        workers = run.workers()
        victim = workers[0] if len(run.machines) > 1 else workers[max(workers)]
        victim.send_signal(signal.SIGKILL)


def assert_all_gone(tree: list[psutil.Process], how: str) -> float:
    """Every process of `tree` ends within GONE_WITHIN_S; returns the seconds it took."""
    started = time.monotonic()
    while True:
        alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return time.monotonic() - started
        if time.monotonic() - started > GONE_WITHIN_S:
            described = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive]
            for process in alive:
                kill_tree(process.pid)
            pytest.fail(f"{how}: {len(alive)} process(es) of the run still alive after {GONE_WITHIN_S} s: {described}")
        time.sleep(0.1)


def assert_checkpoints_complete(run_dir: Path, newest: int) -> None:
    """Each checkpoint-N folder left is complete (a staging folder may remain: resume removes it), the newest N."""
    folders = sorted(p for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith("."))
    assert folders == complete_checkpoints(run_dir / "checkpoints"), f"an incomplete checkpoint: {folders}"
    assert folders and folders[-1].name == f"checkpoint-{newest}", folders


def assert_stopped_in_one_line(run: Launch, how: str) -> None:
    """Exit 143 or 130, one line after the pause, no traceback, manifest "stopped" with the step."""
    expected = SIGNALS[how][1]
    codes = finish(run)
    said = run.output().split(PAUSED, 1)[1].splitlines()[1:]
    said = [line for line in said if line.strip()]
    assert codes[0] == expected, (codes, run.output()[-3000:])
    assert len(said) == 1 and said[0].startswith(f"error: stopped by {how} at step "), said
    assert "--resume" in said[0] and "Traceback" not in run.output(), run.output()[-3000:]


def kill_chain(root: Path, args: list[str], run_dir: Path, events: list[str], spread: tuple[str, ...] = (),
               machines: int = 1, reference=None) -> dict[str, float]:
    """Train `args` into run_dir through `events` (one at each checkpoint, the k-th after checkpoint k), each
    followed by --resume, to the end, every launch with the launch options `spread` (an accelerate config);
    `reference()` trains the uninterrupted run meanwhile. Returns seconds from each interruption until no process
    of the run was left."""
    seconds = {}
    for k, how in enumerate(events, start=1):
        launch_args = [*args, "--output", str(run_dir), *spread] if k == 1 else ["--resume", str(run_dir), *spread]
        run = launch(root, f"{k}-{how}", launch_args, machines, pause=k)
        wait_until_paused(run)
        if k == 1 and reference is not None:
            reference()  # (while this one sleeps at its pause)
        tree = run.tree()
        interrupt(run, how)
        if how in SIGNALS:
            assert_stopped_in_one_line(run, how)
            manifest = json.loads((run_dir / "manifest.json").read_text())
            assert (manifest["status"], manifest["stopped_at_step"]) == ("stopped", k), manifest
        seconds[how] = assert_all_gone(tree, how)
        for machine in run.machines:
            machine.wait(timeout=BOUND_S)
        assert_checkpoints_complete(run_dir, newest=k)
        listed = json.loads(run_cli("runs", run_dir.parent, "--json").stdout)
        assert "running" not in [r["status"] for r in listed if Path(r["path"]) == run_dir], listed
    final = launch(root, "final", ["--resume", str(run_dir), *spread], machines)
    codes = finish(final)
    assert codes == [0] * machines, final.output()[-4000:]
    assert json.loads((run_dir / "manifest.json").read_text())["resumed_from"].endswith(f"checkpoint-{len(events)}")
    return seconds


def assert_same_run(resumed: Path, uninterrupted: Path) -> None:
    """The same per-step losses and saved weights, to the bit."""
    import torch
    from safetensors.torch import load_file

    assert step_losses(resumed) == step_losses(uninterrupted)
    name = "adapter/adapter_model.safetensors" if (uninterrupted / "adapter").is_dir() else "model/model.safetensors"
    a, b = load_file(resumed / name), load_file(uninterrupted / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def sets_args(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


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
