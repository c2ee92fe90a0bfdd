"""Processes the tests start: each in a session of its own, ended with its whole tree, and none left behind.

A launch is a tree: `hftoolkit train` -> the launcher (torchrun's agent) -> the training processes, which torchrun
starts in sessions of their own, so a kill of the first one's process group misses them. kill_tree ends every
descendant instead. At the end of a session, strays() lists what the tests left running: each pytest
process makes itself a child subreaper (Linux), so the orphans of its tests become its children and stay visible.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h

_started: list[subprocess.Popen] = []
_seen_after: dict[tuple[int, float], str] = {}  # (pid, start time) -> the test it was first seen running after


def start_in_group(cmd, **popen_kwargs) -> subprocess.Popen:
    """Popen of `cmd` (items str()ed) in a session of its own (so a new process group, out of reach of the
    terminal's signals), recorded so that the test's teardown ends its tree if the test did not."""
    process = subprocess.Popen([str(c) for c in cmd], start_new_session=True, **popen_kwargs)
    _started.append(process)
    return process


def started_count() -> int:
    return len(_started)


def end_started(since: int = 0) -> None:
    """Kill the trees of the processes start_in_group started since the count `since` (newest first)."""
    for process in reversed(_started[since:]):
        kill_tree(process)
    del _started[since:]


def _send(process: psutil.Process, sig: int) -> None:
    try:
        process.send_signal(sig)
    except (psutil.NoSuchProcess, ProcessLookupError):
        pass  # already gone
    except psutil.AccessDenied:
        pass  # not ours to end: the session's stray check names it if it is a test's


def _tree(pid: int, freeze: bool) -> list[psutil.Process]:
    """`pid` and every descendant, found before any is killed. With `freeze`, each is stopped (SIGSTOP) as it is
    found and the search repeats until it finds no new one: a stopped process forks no child behind the search."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    found = {root.pid: root}
    new = [root]
    while new:
        if freeze:
            for process in new:
                _send(process, signal.SIGSTOP)
        try:
            descendants = root.children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        new = [p for p in descendants if p.pid not in found]
        found.update((p.pid, p) for p in new)
        if not freeze:
            break
    return list(found.values())


def _ended(process: psutil.Process, tree: set[int]) -> bool:
    """Gone, or a zombie that is not this process's to reap. A zombie of ours is reaped here; one whose parent in
    the tree still runs is waited for: it becomes ours (a subreaper's orphan) when that parent ends."""
    try:
        if process.status() != psutil.STATUS_ZOMBIE:
            return False
        parent = process.ppid()
        if parent == os.getpid():  # (0 until its last thread has ended too)
            return os.waitpid(process.pid, os.WNOHANG)[0] != 0
        return parent not in tree
    except (psutil.NoSuchProcess, ChildProcessError):
        return True


def kill_tree(target: subprocess.Popen | int, sig: int = signal.SIGKILL, timeout: float = 10.0) -> list[int]:
    """Send `sig` to a process and to all its descendants (collected first, stopped meanwhile when `sig` is
    SIGKILL); returns their pids. Processes already gone are skipped, never an error: safe in a `finally:`. After
    SIGKILL it waits (up to `timeout`) until they have ended, reaping a Popen through its own wait() (reaped behind
    its back, it would report exit 0) and the descendants that became this process's children (a subreaper's
    orphans)."""
    popen = target if isinstance(target, subprocess.Popen) else None
    if popen is not None and popen.returncode is not None:
        return []  # reaped already: its pid may be another process's now
    pid = popen.pid if popen is not None else int(target)
    if pid == os.getpid():
        raise ValueError("kill_tree of the test process itself")
    tree = _tree(pid, freeze=sig == signal.SIGKILL)
    for process in tree:
        _send(process, sig)
    if sig != signal.SIGKILL:
        return [p.pid for p in tree]
    deadline = time.monotonic() + timeout
    if popen is not None:
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass  # left for the session's stray check to report
    # A root given by pid may be some Popen's child: left to its owner to reap.
    pids = {p.pid for p in tree}
    rest = [p for p in tree if p.pid != pid]
    while rest and time.monotonic() < deadline:
        rest = [p for p in rest if not _ended(p, pids)]
        if rest:
            time.sleep(0.05)
    return [p.pid for p in tree]


# ---------------------------------------------------------------- nothing left behind


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphaned descendants are re-parented to it rather than to init,
    so strays() sees them. False where the platform has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _key(process: psutil.Process) -> tuple[int, float] | None:
    try:
        return process.pid, process.create_time()
    except psutil.Error:
        return None


def note_test_end(nodeid: str) -> None:
    """Record the descendants running at the end of a test (its teardown): a stray is then named with the test it
    outlived first."""
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for process in descendants:
        key = _key(process)
        if key is not None:
            _seen_after.setdefault(key, nodeid)


def _owned_pids() -> set[int]:
    """Children that an object of this process waits for (a subprocess.Popen, a multiprocessing process): theirs to
    reap. A zombie reaped here instead would read as exit status 0 to its Popen."""
    kinds = [subprocess.Popen]
    for name in ("multiprocessing.popen_fork", "multiprocess.popen_fork"):
        if name in sys.modules:
            kinds.append(sys.modules[name].Popen)
    kinds = tuple(kinds)
    return {o.pid for o in gc.get_objects() if issubclass(type(o), kinds) and getattr(o, "pid", None)}


def _helpers() -> set[int]:
    """Long-lived children that libraries start for the process's lifetime (multiprocessing's resource tracker and
    fork server, also those of `multiprocess`, the fork that datasets uses): not the tests' doing."""
    pids = set()
    for package in ("multiprocessing", "multiprocess"):
        tracker = sys.modules.get(f"{package}.resource_tracker")
        forkserver = sys.modules.get(f"{package}.forkserver")
        pids.add(getattr(getattr(tracker, "_resource_tracker", None), "_pid", None))
        pids.add(getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None))
    return {p for p in pids if p}


def _describe(process: psutil.Process) -> str:
    try:
        with process.oneshot():
            command = " ".join(process.cmdline()) or process.name()
            parent = process.ppid()
    except psutil.Error as e:
        return f"pid {process.pid}: ({type(e).__name__})"
    test = _seen_after.get(_key(process))
    when = f"still running after {test}" if test else "started after the last test"
    return f"pid {process.pid} (parent {parent}), {when}: {command[:300]}"


def strays() -> list[psutil.Process]:
    """This process's descendants that still run, library helpers aside. Zombies are not listed; those that no
    Popen or multiprocessing object of this process waits for (a subreaper's orphans) are reaped."""
    me = os.getpid()
    try:
        descendants = psutil.Process(me).children(recursive=True)
    except psutil.Error:
        return []
    helpers = _helpers()
    alive, zombies = [], []
    for process in descendants:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                if process.ppid() == me:
                    zombies.append(process.pid)
            elif process.pid not in helpers:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    if zombies:
        owned = _owned_pids()
        for pid in zombies:
            if pid not in owned:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
    return alive


def end_strays() -> list[str]:
    """Kill every stray with its tree; returns a line naming each (pid, parent, the first test it outlived, its
    command line), read before the kill."""
    found = strays()
    lines = [_describe(p) for p in found]
    for process in found:
        kill_tree(process.pid)
    if found:
        strays()  # reaps the killed roots that no Popen waits for
    return lines
