"""Another process holding a run's lock, as a live writer does (flock: the kernel releases it when the holder ends,
SIGKILL included), for the tests of every command that meets a run another process writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hftoolkit.base.run_layout import LOCK

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[3] == "try" else 0))
os.write(fd, sys.argv[2].encode())
print("held", flush=True)
time.sleep(300)
"""


def hold_elsewhere(run: Path, command: str = "hftoolkit train recipes/x.yaml") -> subprocess.Popen:
    """Another process that holds `run`'s lock as a live writer does (flock, its record written)."""
    run.mkdir(parents=True, exist_ok=True)
    record = json.dumps({"pid": 0, "host": "elsewhere", "started": "2026-01-01T00:00:00+0000", "command": command})
    writer = subprocess.Popen([sys.executable, "-c", HOLDER, str(run / LOCK), record, "wait"], stdout=subprocess.PIPE,
                              text=True)
    assert writer.stdout.readline().strip() == "held"
    return writer


def end(writer: subprocess.Popen) -> None:
    writer.kill()  # as a SIGKILLed writer ends: the kernel releases its lock
    writer.wait()


def can_lock(path: Path) -> bool:
    """Whether another process can take the lock at `path` now."""
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), "{}", "try"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    took = other.stdout.readline().strip() == "held"
    end(other)
    return took
