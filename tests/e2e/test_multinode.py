"""Two machines, played by two `hftoolkit train --num-machines 2 --machine-rank R` commands on the loopback address.

Each "machine" runs one process of two (--num-processes counts all machines' processes). A shared run directory is
one --output for both; machines without a shared file system are one --output each with
training.save_on_each_node. Killing a machine kills its whole process tree (launcher, torchrun's agent, the
training process), as losing the machine would.

One full fine-tuning recipe serves every launched run (a checkpoint each step; only the --output layout differs):
- `uninterrupted`: two machines sharing the run directory, compared with `one`, the same recipe on one process;
- `killed`: the same, through tests/helpers/kills.py's chain: machine 0's training process SIGKILLed after checkpoint
  1, so that machine 1 must notice and end too, then --resume on both (every other interruption: tests/e2e/
  test_kills.py, under DDP); `uninterrupted` trains while the chain's first run sleeps at its pause, and `killed`
  ends as it did, to the bit;
- machines with a folder each: machine 1 lost after checkpoint 2, machine 0 stopping in one line, then --resume on
  both; the runs end as `uninterrupted` did, to the bit (where each machine keeps its copy changes no step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import RECIPES, kills, run_cli, train_recipe
from tests.helpers.launches import SAME_BATCHES, STEPS, free_port, step_losses
from tests.helpers.processes import kill_tree, start_in_group

ENCODER = RECIPES / "encoder-classification.yaml"

BOUND_S = 240  # per pair of launched machines; a loaded 2-core machine takes ~30-50 s for one pair
# The other machine notices a lost peer as its connection closes (gloo): measured 1.5-3 s from the kill to its
# exit, torchrun's teardown included. The bound leaves room for a loaded machine, and none for a hang.
STOP_BOUND_S = 30
LOST_PEER = "another process of the run ended, so this one cannot go on"
# Full fine-tuning: each machine writing its own copy of the weights is patches/transformers_5.py's.
SETS = (*SAME_BATCHES, "lora.enabled=false", "training.learning_rate=1e-3", "training.save_steps=1",
        "data.max_eval_samples=16", "eval.batch_size=8")

pytestmark = pytest.mark.xdist_group("processes")  # several processes each: one worker runs them all


@pytest.fixture(scope="module")
def shared(tmp_path_factory, no_dropout):
    """The runs of the recipe on two machines sharing the run directory, and on one process, as the module
    docstring says: {"sets", "one", "uninterrupted", "killed", "logs" (each machine's log of `uninterrupted`),
    "seconds" (from the kill until no process of either machine was left)}."""
    root = tmp_path_factory.mktemp("two-machines")
    sets = (f"model.checkpoint={no_dropout['bert']}", *SETS)
    args = [str(ENCODER), *kills.sets_args(*sets)]
    started = {}

    def uninterrupted():
        started["at"] = time.perf_counter()
        codes = kills.finish(kills.launch(root, "uninterrupted", [*args, "--output", str(root / "uninterrupted")], 2))
        assert codes == [0, 0], (root / "uninterrupted-machine0.log").read_text()[-3000:]
        started["seconds"] = time.perf_counter() - started["at"]
        train_recipe(ENCODER, root / "one", *sets)

    seconds = kills.kill_chain(root, args, root / "killed", ["one-worker"], machines=2, reference=uninterrupted)
    print(f"two machines, one shared folder: {started['seconds']:.0f} s uninterrupted")
    return {"sets": sets, "one": root / "one", "uninterrupted": root / "uninterrupted", "killed": root / "killed",
            "logs": [root / f"uninterrupted-machine{rank}.log" for rank in (0, 1)], "seconds": seconds}


def start_machines(outputs: tuple[Path, Path], sets: tuple[str, ...], *extra: str,
                   env: tuple[dict, dict] = ({}, {})) -> list[subprocess.Popen]:
    """Machine 0 and machine 1, each `hftoolkit train` with its rank, meeting at 127.0.0.1 on a free port."""
    port = str(free_port())
    machines = []
    for rank, output in enumerate(outputs):
        cmd = [sys.executable, "-m", "hftoolkit", "train", ENCODER, "--output", output, "--num-processes", "2",
               "--num-machines", "2", "--machine-rank", str(rank), "--main-process-ip", "127.0.0.1",
               "--main-process-port", port, *extra, *[a for s in sets for a in ("--set", s)]]
        machines.append(start_in_group(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env={**os.environ, "OMP_NUM_THREADS": "1", **env[rank]}))
    return machines


def finish(machines: list[subprocess.Popen], bound: float = BOUND_S) -> list[tuple[int, str]]:
    """Each machine's exit status and output; past `bound` seconds every machine is killed and the test fails."""
    deadline, results = time.monotonic() + bound, []
    for machine in machines:
        try:
            results.append(machine.communicate(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            for m in machines:
                kill_tree(m)
            pytest.fail(f"a machine still runs after {bound} s (a process hangs)")
    return [(m.returncode, out) for m, (out, _) in zip(machines, results)]


def train_two_machines(outputs: tuple[Path, Path], sets: tuple[str, ...], *extra: str) -> list[str]:
    results = finish(start_machines(outputs, sets, *extra))
    failed = [f"machine {rank} (exit {code}):\n{output[-3000:]}" for rank, (code, output) in enumerate(results) if code]
    assert not failed, "\n".join(failed)
    return [output for _, output in results]


def no_staging_left(*runs: Path) -> None:
    left = [p for run in runs for p in run.rglob(".*")]
    assert not left, f"temporary files or staging folders left behind: {left}"


def assert_complete_copy(run: Path) -> None:
    """A full fine-tuning run directory with every file of the contract, complete, from two machines."""
    from hftoolkit.base.run_layout import FILES

    names = {p.name for p in run.iterdir()}
    assert set(FILES) | {"model", "train.log"} <= names, f"{run}: missing {set(FILES) | {'model'} - names}"
    assert (run / "model" / "model.safetensors").is_file(), f"{run}: no weights"
    for checkpoint in (run / "checkpoints").iterdir():
        assert (checkpoint / "model.safetensors").is_file(), f"{checkpoint}: no weights"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["distributed"]["machines"] == 2


def model_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run / "model" / "model.safetensors")


def machines_record(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())["distributed"]


@pytest.mark.slow
def test_two_machines_sharing_the_run_directory_train_as_one_process(shared):
    run = shared["uninterrupted"]
    outputs = [log.read_text(errors="replace") for log in shared["logs"]]
    assert "run directory:" in outputs[0] and "run directory:" not in outputs[1]  # machine 0 reports the run
    assert_complete_copy(run)
    assert "--machine-rank" in json.loads((run / "manifest.json").read_text())["command"]  # the command typed
    no_staging_left(run)
    committed = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert committed == [f"checkpoint-{STEPS - 1}", f"checkpoint-{STEPS}"]  # (training.keep_last: 2)
    for checkpoint in committed:  # machine 1's RNG state is committed with machine 0's files
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in (run / "checkpoints" /
                                                                          checkpoint).iterdir()}
    ran = machines_record(run)
    assert (ran["type"], ran["processes"], ran["machines"]) == ("MULTI_CPU", 2, 2)
    same_as_one_process(shared["one"], run)


@pytest.mark.slow
def test_two_machines_a_killed_training_process_stops_both_and_resumes_to_the_uninterrupted_run(shared):
    """Machine 0's training process (the writer's) SIGKILLed after checkpoint 1: machine 1, waiting on it, ended
    too, within kills.GONE_WITHIN_S, every checkpoint left complete, `runs` never saying "running" (checked in the
    chain); --resume on both machines then ends as the uninterrupted run, to the bit."""
    kills.assert_same_run(shared["killed"], shared["uninterrupted"])
    print(f"two machines: seconds until no process was left: {shared['seconds']}")


@pytest.mark.slow
def test_a_run_directory_that_a_machine_cannot_see_is_refused(tmp_path):
    """One --output per machine without training.save_on_each_node: machine 1 would never commit a checkpoint. The
    check is a collective call that both machines make: both end, with the refusal, and leave no run directory.
    (Which layouts it refuses: the test after this one, in one process.)"""
    results = finish(start_machines((tmp_path / "zero", tmp_path / "one"), ("training.max_steps=1",)))
    for code, output in results:
        assert code != 0
        assert "machine 1 cannot see the run directory" in output and "training.save_on_each_node: true" in output
    assert not (tmp_path / "zero").exists() and not (tmp_path / "one").exists()


@pytest.mark.parametrize("layout, each_node, refused", [
    ("a folder each", False, "--output: machine 1 cannot see the run directory"),
    ("a folder each", True, None),
    ("one shared folder", True, "training.save_on_each_node: machine 1 shares the run directory"),
    ("one shared folder", False, None)])
def test_the_run_directory_check_refuses_the_layouts_the_machines_would_write_wrongly(tmp_path, monkeypatch, layout,
                                                                                     each_node, refused):
    """multi_machine.check_run_directory as machine 0 runs it, machine 1's part of the collective played: machine 0
    makes a file of a random name in its --output (broadcast), machine 1 says whether its own --output shows it
    (gathered). One folder each needs training.save_on_each_node; one shared folder refuses it."""
    from types import SimpleNamespace

    import accelerate
    import accelerate.utils

    from hftoolkit.base.errors import UserError
    from hftoolkit.training.multi_machine import check_run_directory
    from hftoolkit.training.strategies import LaunchPlan

    mine = tmp_path / "zero"
    theirs = mine if layout == "one shared folder" else tmp_path / "one"
    mine.mkdir()
    theirs.mkdir(exist_ok=True)
    probe = []
    for variable in ("RANK", "GROUP_RANK"):  # (this process: machine 0's)
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(accelerate, "PartialState",
                        lambda: SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None))
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", lambda names: probe.extend(names) or names)
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda seen: [*seen, (1, (theirs / probe[0]).exists())])
    plan = LaunchPlan(num_processes=2, num_machines=2)
    if refused:
        with pytest.raises(UserError, match=refused):
            check_run_directory(mine, each_node, plan)
    else:
        check_run_directory(mine, each_node, plan)
    assert probe and not list(mine.iterdir()), "the probe file is gone"


@pytest.mark.slow
def test_full_fine_tuning_on_machines_with_a_folder_each_survives_a_killed_machine_and_resumes_exactly(
        tmp_path, shared):
    """Machine 1 stops (a test hook) once its checkpoint 2 is committed, and is killed there with its whole tree:
    machine 0 ends in one line that says to resume on every machine; --resume on both then completes each
    machine's own copy, equal to the bit to the uninterrupted run of a shared folder."""
    sets = (*shared["sets"], "training.save_on_each_node=true")
    runs = (tmp_path / "run-0", tmp_path / "run-1")
    machines = start_machines(runs, sets, env=({}, {"HFTOOLKIT_TEST_PAUSE_AFTER_SAVE": "2"}))
    deadline = time.monotonic() + BOUND_S
    saved = runs[1] / "checkpoints"
    while not (saved / "checkpoint-2").is_dir() or (saved / ".tmp-checkpoint-2").exists():  # (committed, pausing)
        assert time.monotonic() < deadline and machines[0].poll() is None, "machine 1 never saved checkpoint 2"
        time.sleep(0.2)
    kill_tree(machines[1])  # the whole tree, as losing the machine would
    killed = time.perf_counter()
    (code, output), _ = finish(machines, bound=STOP_BOUND_S)
    stop_s = time.perf_counter() - killed
    assert code != 0 and LOST_PEER in output and "--resume on every machine" in output, output[-3000:]
    assert json.loads((runs[0] / "manifest.json").read_text())["status"] == "failed"
    for run in runs:
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-2"]

    train_two_machines(runs, sets, "--resume")
    no_staging_left(*runs)
    for run in runs:  # each machine's own complete copy
        assert_complete_copy(run)
    reference = model_weights(shared["uninterrupted"])
    for run in runs:  # the same steps as the uninterrupted run, to the bit
        assert json.loads((run / "manifest.json").read_text())["resumed_from"].endswith("checkpoint-2")
        assert step_losses(run) == step_losses(shared["uninterrupted"])
        weights = model_weights(run)
        assert weights.keys() == reference.keys() and all((weights[k] == reference[k]).all() for k in reference)
    print(f"a killed machine stopped the other in {stop_s:.1f} s")


def same_as_one_process(one: Path, two: Path) -> None:
    """Full fine-tuning on two machines against one process, with test_distributed's tolerances (there derived
    for an adapter; every weight here is trained)."""
    import torch

    losses_one, losses_two = step_losses(one), step_losses(two)
    assert sorted(losses_one) == sorted(losses_two) == list(range(1, STEPS + 1))
    rel = max(abs(losses_two[s] - losses_one[s]) / abs(losses_one[s]) for s in losses_one)
    assert rel < 1e-4, f"per-step losses differ: 1 process {losses_one}, 2 machines {losses_two}"
    w1, w2 = model_weights(one), model_weights(two)
    gaps = torch.cat([(w1[k] - w2[k]).abs().flatten() for k in w1])
    lr = _learning_rate(one)
    assert float(gaps.max()) <= 2 * lr * STEPS
    assert float((gaps > lr / 100).float().mean()) <= 0.02
    print(f"full, 2 machines vs 1 process: loss rel {rel:.2e}, max weight gap {float(gaps.max()):.2e}, "
          f"share apart {float((gaps > lr / 100).float().mean()):.4f}")


def _learning_rate(run: Path) -> float:
    import yaml

    return yaml.safe_load((run / "recipe.yaml").read_text())["training"]["learning_rate"]


# ---------------------------------------------------------------- planned before anything starts


def test_machines_options_reach_accelerate_launch_and_override_the_config(tmp_path):
    from hftoolkit.training.relaunch import launch_command
    from hftoolkit.training.strategies.launch import Machines, plan_from_config

    argv = ["train", "r.yaml", "--num-processes", "2", "--num-machines", "2", "--machine-rank", "1",
            "--main-process-ip", "10.1.2.3", "--main-process-port=29600", "--overwrite"]
    plan = plan_from_config(None, 2, machines=Machines(2, 1, "10.1.2.3", 29600))
    cmd, _ = launch_command(plan, argv, cuda=False)
    flags = dict(zip(cmd, cmd[1:]))
    assert (flags["--num_processes"], flags["--num_machines"], flags["--machine_rank"]) == ("2", "2", "1")
    assert (flags["--main_process_ip"], flags["--main_process_port"]) == ("10.1.2.3", "29600")
    assert cmd[cmd.index("-m", 3):] == ["-m", "hftoolkit", "train", "r.yaml", "--overwrite"]  # none relaunches
    # The shipped multi-node config's keys, with this machine's rank from the command line.
    plan = plan_from_config(RECIPES / "accelerate" / "multi-node.yaml", None, machines=Machines(machine_rank=1))
    assert (plan.num_processes, plan.num_machines, plan.machine_rank) == (16, 2, 1)
    assert (plan.main_process_ip, plan.main_process_port) == ("10.0.0.1", 29500) and plan.relaunch


def test_machines_that_cannot_form_one_run_are_refused_before_launching():
    result = run_cli("train", ENCODER, "--num-machines", "2", "--machine-rank", "2", "--num-processes", "3",
                     expect=2)
    assert "--num-processes 3: counts the processes of all 2 machines together" in result.output
    assert "--machine-rank 2: the machines of a 2-machine run are numbered 0 to 1" in result.output
    assert "--main-process-ip: 2 machines meet at machine 0's address" in result.output


def test_a_launched_process_refuses_machine_options(monkeypatch):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training.strategies import Machines, launch_strategy

    for name, value in (("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("GROUP_RANK", "1"),
                        ("MASTER_ADDR", "10.0.0.1")):
        monkeypatch.setenv(name, value)
    recipe = load_recipe(ENCODER, ["training.batch_size=16"])
    plan = launch_strategy(recipe, None, None).launch
    assert (plan.num_machines, plan.machine_rank, plan.relaunch) == (2, 1, False)
    with pytest.raises(Exception, match="--machine-rank: this process was started by a launcher already"):
        launch_strategy(recipe, None, None, machines=Machines(machine_rank=1))


def test_a_lost_peer_is_one_line_and_other_errors_pass_through():
    import torch  # noqa: F401  (lost_peer reads errors of torch.distributed)

    from hftoolkit.training.multi_machine import lost_peer
    from hftoolkit.training.strategies import LaunchPlan

    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:1455. This is typically caused by a remote worker crashing. Check the logs")
    error = lost_peer(gloo, LaunchPlan())
    assert error is not None and "\n" not in error.message
    assert f"{LOST_PEER} (Connection closed by peer [127.0.0.1]:1455): see why" in error.message
    assert lost_peer(RuntimeError("CUDA out of memory"), LaunchPlan()) is None
    assert lost_peer(ValueError("bad"), LaunchPlan()) is None
