"""Starting a run's processes: `hftoolkit train RECIPE --num-processes N` (or `--accelerate-config FILE`, or a
recipe's training.accelerate_config) starts itself again under `accelerate launch`; a process that a launcher
already started (accelerate, torchrun, mpirun) never relaunches. On several machines each machine runs the same
command with its own rank. The launch is planned, and checked against the recipe, in `strategies/launch.py`.
Imports no torch at module level: the launching process stays light.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.lifecycle import PARENT_VARIABLE, REASONS_VARIABLE, STOP_SIGNALS, Stopped, first_reason
from hftoolkit.base.run_layout import LOG
from hftoolkit.base.secrets import redact
from hftoolkit.training.strategies.launch import LaunchPlan

# The command the user typed, handed to the relaunched processes for manifest.json.
COMMAND_VARIABLE = "HFTOOLKIT_COMMAND"
LAUNCH_OPTIONS = ("--num-processes", "--accelerate-config", "--num-machines", "--machine-rank", "--main-process-ip",
                  "--main-process-port")


def command_line() -> list[str]:
    """The command as the user typed it (before a relaunch), for manifest.json."""
    recorded = os.environ.get(COMMAND_VARIABLE)
    return json.loads(recorded) if recorded else list(sys.argv)


# ---------------------------------------------------------------- relaunching


def launch_command(plan: LaunchPlan, argv: list[str], cuda: bool) -> tuple[list[str], dict[str, str]]:
    """`accelerate launch` (through training/launcher.py) of `hftoolkit <argv minus the launch options>`, and the
    environment to give it."""
    cmd = [sys.executable, "-m", "hftoolkit.training.launcher"]
    if plan.config is not None:
        cmd += ["--config_file", str(plan.config)]
    cmd += ["--num_processes", str(plan.num_processes)]
    if plan.config is None:
        cmd += ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
    elif plan.distributed == "MULTI_CPU" and plan.num_processes > 1:
        # accelerate 1.15 starts a MULTI_CPU config's processes only through mpirun; torchrun does it
        # too, and ACCELERATE_USE_CPU below keeps each process on the CPU with gloo.
        cmd += ["--multi_gpu"]
    if plan.num_machines > 1:  # as resolved from the options and the config, which they override
        cmd += ["--num_machines", str(plan.num_machines), "--machine_rank", str(plan.machine_rank),
                "--main_process_ip", str(plan.main_process_ip), "--main_process_port", str(plan.main_process_port)]
    elif plan.main_process_port is None:  # port 0: a free one, so that runs on one machine never share a port
        cmd += ["--num_machines", "1", "--main_process_port", "0"]
    cmd += ["-m", "hftoolkit", *strip_launch_options(argv)]
    env = {**os.environ, COMMAND_VARIABLE: json.dumps(["hftoolkit", *argv]), PARENT_VARIABLE: str(os.getpid())}
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets for several processes, without its banner
    if not cuda:  # (a DeepSpeed process drops it again: patches/accelerate_1_15.deepspeed_cpu_state)
        env["ACCELERATE_USE_CPU"] = "true"  # without it the processes look for GPUs (and each thinks it is rank 0)
    return cmd, env


def strip_launch_options(argv: list[str]) -> list[str]:
    """argv without --num-processes and --accelerate-config (the relaunched processes must not relaunch)."""
    return _split_launch_options(argv)[0]


def launch_options(argv: list[str]) -> list[str]:
    """The launch options of argv (--num-processes N, --accelerate-config FILE, the machines'), as typed."""
    return _split_launch_options(argv)[1]


def _split_launch_options(argv: list[str]) -> tuple[list[str], list[str]]:
    rest, options, taking = [], [], False
    for arg in argv:
        if taking:
            options.append(arg)
            taking = False
        elif arg in LAUNCH_OPTIONS:
            options.append(arg)
            taking = True
        elif arg.startswith(tuple(f"{o}=" for o in LAUNCH_OPTIONS)):
            options.append(arg)
        else:
            rest.append(arg)
    return rest, options


def relaunch(plan: LaunchPlan, argv: list[str], run_dir: Path | None = None) -> int:
    """Run the training processes under accelerate's launcher; returns their exit status.

    The launcher starts in a session of its own and this process hands it the stop signals it gets (a closed
    terminal, Ctrl-C, a scheduler's SIGTERM), once; the training processes end with the launcher, and it with this
    process (training/launcher.py). A failed launch is said in one line: the reason that explains the others
    (lifecycle.first_reason). What the launcher logged is appended to the run's train.log.
    """
    import tempfile

    import torch

    from hftoolkit.training.launcher import LOG_NAME

    cuda = torch.cuda.is_available()
    here = plan.num_processes // plan.num_machines
    if cuda and plan.config is None and here > torch.cuda.device_count():
        raise UserError(f"--num-processes {plan.num_processes}: this machine has {torch.cuda.device_count()} GPU(s), "
                        "one process each: lower --num-processes, or spread them with --num-machines")
    cmd, env = launch_command(plan, argv, cuda)
    where = f" of {plan.num_processes} on machine {plan.machine_rank}" if plan.num_machines > 1 else ""
    shown = redact(shlex.join(cmd))  # (the processes get the command as typed; the screen, its secrets masked)
    print(f"launching {here} process{'es' if here > 1 else ''}{where}: {shown}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="hftoolkit-launch-") as reasons:
        process = subprocess.Popen(cmd, env={**env, REASONS_VARIABLE: reasons}, start_new_session=True)
        status, stopped = _wait_passing_signals(process)
        _keep_log(Path(reasons) / LOG_NAME, run_dir)
        reason = None if stopped or status == 0 else (
            first_reason(reasons) or f"the launch ended with exit status {status} and no training process said why: "
                                     "see the lines above, and the run directory's train.log if it has one")
    if stopped is not None:  # (the main training process has said where the run stopped)
        stop = Stopped(stopped)
        stop.said = True
        raise stop
    if reason is not None:
        error = UserError(reason)
        error.exit_code = status
        raise error
    return status


def _wait_passing_signals(process: subprocess.Popen) -> tuple[int, int | None]:
    """Wait for `process`, handing it the first stop signal this process gets; (its exit status, that signal)."""
    import signal

    stopped = []

    def hand_on(signum, frame):
        if not stopped and process.poll() is None:
            process.send_signal(signum)
        stopped.append(signum)

    previous = {sig: signal.signal(sig, hand_on) for sig in STOP_SIGNALS}
    try:
        return process.wait(), (stopped[0] if stopped else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _keep_log(log: Path, run_dir: Path | None) -> None:
    """The launcher's log, appended to the run's train.log (when the run wrote one)."""
    if run_dir is not None and log.is_file() and log.stat().st_size and (Path(run_dir) / LOG).is_file():
        said = redact(log.read_text(errors="replace"))  # (secrets masked, as in every line of train.log)
        with open(Path(run_dir) / LOG, "a", encoding="utf-8") as out:
            out.write("\n--- the launcher (accelerate launch, torchrun) ---\n" + said)


def end_processes() -> None:
    """Wait for every process, then close the process group.

    Closing it explicitly matters on gloo: left to interpreter exit, its threads can abort the process
    (SIGABRT) as they are torn down, so a run that trained and saved would end with a crash.
    """
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
