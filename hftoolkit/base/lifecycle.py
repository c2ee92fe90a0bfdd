"""How the processes of one run end together: a stop signal, a parent that is gone, and the one reason that
explains a failed launch."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from hftoolkit.base import ranks

# The pid of the process that started this one, set by whoever starts it (the launcher, hftoolkit's own relaunch):
# if that process is already gone when this one arms its parent-death signal, this one ends at once.
PARENT_VARIABLE = "HFTOOLKIT_PARENT_PID"
# SIGINT, SIGTERM and SIGHUP (a closed terminal) end a run the same way: one line, its state recorded.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Once asked to stop, a process that has not ended after this long (a collective call waiting on a peer that is
# gone, a library that catches the exception) is killed: every process of a run is gone soon after a stop.
GRACE_SECONDS = 5.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Stopped(BaseException):
    """A stop signal arrived (SIGINT, SIGTERM, SIGHUP): raised where the process was, so that what it was doing
    unwinds and records how far it got. A BaseException, like KeyboardInterrupt: `except Exception` in a library
    does not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.said = False  # the command has printed its own line about the stop

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def stop_on_signals() -> None:
    """From now on a stop signal raises Stopped in the main thread, once; later ones are ignored while the first
    unwinds, and GRACE_SECONDS after it the process is killed if it still runs. A forked child (a data loader's
    worker, a tokenizing pool) gets the default handlers back: its parent decides how it ends."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
    if not _reset_in_children:
        os.register_at_fork(after_in_child=_default_handlers)
        _reset_in_children.append(True)
        sys.unraisablehook = _stop_again(sys.unraisablehook)


_reset_in_children: list[bool] = []


def _default_handlers() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def _stop(signum, frame) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    deadline = threading.Timer(GRACE_SECONDS, os.kill, (os.getpid(), signal.SIGKILL))
    deadline.daemon = True
    deadline.start()
    raise Stopped(signum)


def _stop_again(hook):
    """sys.unraisablehook that, for a Stopped raised where Python can only ignore it (a __del__, a callback),
    raises it again at the next chance instead of printing its traceback."""
    def unraisable(info) -> None:
        if not isinstance(info.exc_value, Stopped):
            return hook(info)
        signum = info.exc_value.signum

        def again(*_):
            signal.signal(signum, signal.SIG_IGN)
            raise Stopped(signum)

        signal.signal(signum, again)
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()  # (sent from here, it would land in here)

    return unraisable


def die_with_parent() -> None:
    """End this process (SIGTERM, then Stopped) when the process that started it ends, however it ends: SIGKILL
    included, which no handler of the parent's can pass on. Linux says so through prctl's parent-death signal;
    elsewhere a watchdog thread notices the new parent."""
    expected = int(os.environ.get(PARENT_VARIABLE) or os.getppid())
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    else:
        threading.Thread(target=_watch_parent, args=(expected,), daemon=True, name="parent-watchdog").start()
    if os.getppid() != expected:  # the parent ended before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def _watch_parent(expected: int) -> None:
    while os.getppid() == expected:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)


# ---------------------------------------------------------------- one reason for a failed launch

# A folder that hftoolkit's relaunch names: a training process that fails writes its reason there instead of
# printing it, and the relaunching process prints the one reason that explains the others.
REASONS_VARIABLE = "HFTOOLKIT_REASONS"


def record_reason(message: str, consequence: bool = False, rank: int | None = None) -> bool:
    """Under a relaunch, write why this process (or the process `rank`, for the launcher) failed where the
    relaunching process reads it; `consequence`: it failed because another process of the run did. False when
    there is no such folder: the caller prints the reason itself."""
    import json

    folder = os.environ.get(REASONS_VARIABLE)
    if not folder or not os.path.isdir(folder):
        return False
    rank = ranks.rank() if rank is None else rank
    record = {"rank": rank, "time": time.time(), "message": message, "consequence": consequence}
    path = os.path.join(folder, f"rank-{rank}-{os.getpid()}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(record, out)
    os.replace(path + ".tmp", path)
    return True


def first_reason(folder: str) -> str | None:
    """The reason that explains a failed launch: a process's own failure before one that only followed another's
    (a peer that was lost), the earliest first."""
    import json

    records = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as found:
                records.append(json.load(found))
    records.sort(key=lambda r: (r["consequence"], r["time"], r["rank"]))
    return records[0]["message"] if records else None
