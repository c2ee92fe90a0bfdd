"""The process between `hftoolkit train` and its training processes: accelerate's launcher, run in this process so
that it ends with the process that started it and says nothing of its own (`main`).

Run as `python -m hftoolkit.training.launcher ACCELERATE-LAUNCH-ARGUMENTS`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from hftoolkit.base.lifecycle import (
    PARENT_VARIABLE,
    REASONS_VARIABLE,
    Stopped,
    die_with_parent,
    record_reason,
    stop_on_signals,
)

LOG_NAME = "launcher.log"


def main(argv: list[str]) -> int:
    """Run `accelerate launch` with `argv`; returns the exit status to end with.

    `accelerate launch` (torchrun underneath) starts each training process in a session of its own, so a signal to
    the terminal's process group never reaches them, and when the launcher itself fails or is stopped it prints a
    traceback. Here:
    - this process ends when `hftoolkit train` ends, however it ends (lifecycle.die_with_parent), and each training
      process ends with this one (the same, armed in cli/app.main);
    - a stop (SIGINT, SIGTERM) is handed to the training processes by torchrun's own handlers, and this process
      exits with 128 + the signal, silently: the main training process says where the run stopped;
    - a training process that fails wrote its reason (lifecycle.record_reason); one killed by a signal cannot, so
      it is written here (`_failed`); `relaunch.relaunch` prints the one that explains the rest;
    - what the libraries log here goes to a file beside those reasons (`_log_to_file`), which `relaunch` appends
      to the run's train.log.
    """
    stop_on_signals()  # (torchrun's agent installs its own while it waits on the training processes)
    die_with_parent()
    os.environ[PARENT_VARIABLE] = str(os.getpid())  # each training process ends with this one
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    _log_to_file()  # (after the imports: torch gives its loggers handlers of their own)

    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except ChildFailedError as failed:
        return _failed(failed)
    except subprocess.CalledProcessError as failed:  # (one process: accelerate's simple launcher)
        return _exit_status(failed.returncode)
    except SignalException as stop:
        return 128 + int(stop.sigval)
    except Stopped as stop:
        return stop.exit_code
    except Exception as err:  # accelerate refused the launch itself: its traceback goes to the log, its reason up
        logging.getLogger(__name__).exception("accelerate launch failed")
        record_reason(f"accelerate launch: {type(err).__name__}: {err}")
        return 1
    return 0


def _failed(failed) -> int:
    """The exit status of the process that failed first; a process that a signal killed has its reason written."""
    _, first = failed.get_first_failure()
    for rank, failure in failed.failures.items():
        if failure.exitcode < 0:
            name = signal.Signals(-failure.exitcode).name
            record_reason(f"training process {rank} (pid {failure.pid}) was killed by {name}, so the run stopped: "
                          "if the machine ran out of memory, lower training.batch_size or eval.batch_size; then run "
                          "the same command with --resume", rank=rank)
    return _exit_status(first.exitcode)


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def _log_to_file() -> None:
    """What the launcher says (torchrun's and accelerate's logs, DeepSpeed's banners) into LOG_NAME in the reasons
    folder, not the console. Python's streams only: the training processes share this process's file descriptors,
    which stay the console. torch gives many of its loggers a stderr handler of their own at import: each is
    replaced."""
    folder = os.environ.get(REASONS_VARIABLE)
    log = open(os.path.join(folder, LOG_NAME), "a", buffering=1) if folder else open(os.devnull, "w")
    sys.stdout = sys.stderr = log  # (what libraries imported later print or log: DeepSpeed's accelerator banner)
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict))]
    for logger in loggers:
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
    logging.root.addHandler(handler)
    logging.root.setLevel(logging.INFO)
    logging.captureWarnings(True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
