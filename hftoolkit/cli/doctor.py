"""`doctor`: what this machine offers, read without importing torch (it takes seconds)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = ("torch", "transformers", "peft", "accelerate", "datasets", "evaluate", "bitsandbytes", "typer", "pydantic")


def report() -> list[tuple[str, str]]:
    from hftoolkit import __version__
    from hftoolkit.sources import hub

    rows = [("hftoolkit", __version__), ("python", f"{platform.python_version()} ({sys.executable})")]
    for name in PACKAGES:
        try:
            rows.append((name, version(name)))
        except PackageNotFoundError:
            rows.append((name, "not installed"))
    rows.append(("cuda", _cuda()))
    rows.append(("bitsandbytes backend", _bnb_backend()))
    rows += hub.cache_report()
    free = shutil.disk_usage(Path.cwd()).free / 2**30
    rows.append(("free disk", f"{free:.1f} GiB in {Path.cwd()}"))
    return rows


def _cuda() -> str:
    """GPUs as nvidia-smi lists them; the torch build's CUDA version from its metadata."""
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = ""
    build = "CPU-only torch build" if "+cpu" in torch_version else f"torch {torch_version}"
    smi = shutil.which("nvidia-smi")
    if not smi:
        return f"no NVIDIA GPU found (no nvidia-smi); {build}"
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{out.replace(chr(10), '; ') or 'nvidia-smi found no GPU'}; {build}"


def _bnb_backend() -> str:
    try:
        bnb = version("bitsandbytes")
    except PackageNotFoundError:
        return "bitsandbytes not installed: 8-bit and 4-bit loading unavailable"
    backend = "cuda" if shutil.which("nvidia-smi") else "cpu (8-bit and 4-bit run, slower than on a GPU)"
    return f"{backend}, bitsandbytes {bnb}"
