"""The kill chain: one run trained through a chain of interruptions, one at each checkpoint (a test hook pauses the
writing process once checkpoint k is committed, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE=k), each followed by `train --resume`,
and what it needs: launching `hftoolkit train` on one or two machines (or `accelerate launch -m hftoolkit train`
started by hand), dealing each interruption, and the checks after it (no process left, complete checkpoints, one
line for a stop signal). tests/e2e/test_kills.py describes the matrix; tests/e2e/test_fsdp.py, tests/e2e/test_zero.py
and tests/e2e/test_multinode.py run the same chain.
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
from tests.helpers import RECIPES, run_cli
from tests.helpers.launches import BOUND_S, free_port, step_losses
from tests.helpers.processes import kill_tree, start_in_group

GONE_WITHIN_S = 10  # after an interruption, no process of the run may be alive this long after
# How each interruption is dealt, and to which process of machine 0 (the writer's machine).
SIGNALS = {"SIGTERM": (signal.SIGTERM, 143), "SIGINT": (signal.SIGINT, 130)}
# SIGKILL of: the launcher of a run started by hand (`accelerate launch -m hftoolkit train`), whose training processes
# torchrun put in sessions of their own, so only their parent's death can reach them; `hftoolkit train` alone, whose
# launcher must notice; one training process, whose peers and launcher must notice; `hftoolkit train`'s process group,
# which kills its launcher too (no chain takes it: its training processes meet their parent's death as by hand, and
# the group's top process has no one left to tell). tests/e2e/test_kills.py says which strategy takes which.
KILLS = ("by-hand", "top-process", "one-worker", "launcher-group")
# `accelerate launch` as docs/distributed.md tells a CPU-only machine to start it by hand: the shipped config, the
# variable that puts its processes on the CPU.
BY_HAND = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(RECIPES / "accelerate" / "cpu-2proc.yaml"), "-m", "hftoolkit", "train"]


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


def launch(root: Path, name: str, args: list[str], machines: int = 1, pause: int | None = None,
           by_hand: bool = False) -> Launch:
    """`hftoolkit train ARGS` (on `machines` machines of one process each, meeting on loopback), or with `by_hand`
    `accelerate launch -m hftoolkit train ARGS` on 2 CPU processes (BY_HAND)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pause is not None:
        env["HFTOOLKIT_TEST_PAUSE_AFTER_SAVE"] = str(pause)
    if by_hand:
        assert machines == 1, "by hand: one machine"
        log = root / f"{name}-machine0.log"
        with log.open("wb") as out:
            launcher = start_in_group([*BY_HAND, *args], stdout=out, stderr=subprocess.STDOUT,
                                      env={**env, "ACCELERATE_USE_CPU": "true"})
        return Launch([launcher], [log])
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
    process alone (`accelerate launch` for a run started by hand), or of one training process (rank 1 on one
    machine; machine 0's own on two)."""
    assert how in (*SIGNALS, *KILLS), how
    top = run.machines[0]
    if how == "SIGTERM":
        top.send_signal(signal.SIGTERM)
    elif how == "SIGINT":
        os.killpg(top.pid, signal.SIGINT)  # as Ctrl-C reaches the terminal's foreground group
    elif how == "launcher-group":
        os.killpg(top.pid, signal.SIGKILL)
    elif how in ("top-process", "by-hand"):
        top.send_signal(signal.SIGKILL)
    else:
        workers = run.workers()
        victim = workers[0] if len(run.machines) > 1 else workers[max(workers)]
        victim.send_signal(signal.SIGKILL)


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie; a process that ends between the two questions is gone (psutil raises then)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(tree: list[psutil.Process], how: str) -> float:
    """Every process of `tree` ends within GONE_WITHIN_S; returns the seconds it took."""
    started = time.monotonic()
    while True:
        alive = [p for p in tree if _alive(p)]
        if not alive:
            return time.monotonic() - started
        if time.monotonic() - started > GONE_WITHIN_S:
            described = [f"{p.pid} {' '.join(p.cmdline())[:120] if _alive(p) else '(ended)'}" for p in alive]
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
    followed by --resume, to the end, every launch with the launch options `spread` (an accelerate config), but for
    the "by-hand" event's, started as BY_HAND is; `reference()` trains the uninterrupted run meanwhile. Returns
    seconds from each interruption until no process of the run was left."""
    seconds = {}
    for k, how in enumerate(events, start=1):
        by_hand = how == "by-hand"
        assert not (by_hand and spread), "by hand: DDP, the launch options BY_HAND gives"
        launch_args = [*args, "--output", str(run_dir)] if k == 1 else ["--resume", str(run_dir)]
        run = launch(root, f"{k}-{how}", [*launch_args, *spread], machines, pause=k, by_hand=by_hand)
        wait_until_paused(run)
        if k == 1 and reference is not None:
            reference()  # (while this one sleeps at its pause)
        tree = run.tree()
        if by_hand:
            assert len(run.workers()) == 2, [p.cmdline() for p in tree]
        interrupt(run, how)
        if how in SIGNALS:
            assert_stopped_in_one_line(run, how)
            manifest = json.loads((run_dir / "manifest.json").read_text())
            assert (manifest["status"], manifest["stopped_at_step"]) == ("stopped", k), manifest
        seconds[how] = assert_all_gone(tree, how)
        if by_hand:  # (the training processes met their launcher's death as a stop: SIGTERM, from the kernel)
            assert json.loads((run_dir / "manifest.json").read_text())["status"] == "stopped"
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
