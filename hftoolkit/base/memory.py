"""A process's memory, as runs report it: the peak, its reset between runs in one process, and freed memory
handed back to the system. Imports torch only where CUDA may be in use."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import resource
import sys
from pathlib import Path


def peak_memory_mb() -> float:
    """Peak GPU memory allocated when on CUDA, else the process's peak resident set size."""
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resident_peak_kb() / 1024, 1)


def reserved_peak_mb() -> float | None:
    """Peak GPU memory the CUDA allocator reserved (allocated plus its cache); None off CUDA."""
    import torch

    return round(torch.cuda.max_memory_reserved() / 2**20, 1) if torch.cuda.is_available() else None


def resident_peak_kb() -> float:
    """The process's own peak resident set: Linux's VmHWM, which `reset_peak_memory` resets. getrusage's
    ru_maxrss is the fallback elsewhere: on Linux a process started by a larger one inherits its peak there."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def release_freed_memory() -> None:
    """Collect garbage, then hand freed heap back to the system: glibc keeps it resident otherwise, and a peak
    measured afterwards would count it."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def reset_peak_memory() -> None:
    """Start this process's peak-memory count again, so that each run trained in one process reports its own.

    The peak resident set (getrusage) only grows: Linux resets it when 5 is written to /proc/self/clear_refs;
    CUDA's peak is reset by torch. Elsewhere the peak stays cumulative. Memory an earlier run freed is handed
    back first, or the next run's peak would count it.
    """
    release_freed_memory()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
