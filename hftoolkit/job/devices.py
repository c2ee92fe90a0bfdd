"""Where a run trains, or is planned to: a GPU of the datasheet table, a GPU known by its memory alone, or this
machine. In the job layer, since the precision rule (job/precision.py) and the strategies read it, and the plan
(planning/) above them.

A device holds its memory per process and its dense peak FLOP/s per precision; planning/model.py
divides a step's FLOPs by them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hftoolkit.base import console

TFLOPS = 1e12


@dataclass(frozen=True)
class Device:
    """Where a process trains: its memory per process and its dense peak FLOP/s per precision."""
    name: str
    kind: str
    memory: int
    peak_flops: dict = field(default_factory=dict)
    utilisation: float = 0.4


def _gpu(name: str, gib: float, fp32: float, half: float, bf16: bool = True) -> Device:
    peaks = {"fp32": fp32 * TFLOPS, "fp16": half * TFLOPS, **({"bf16": half * TFLOPS} if bf16 else {})}
    return Device(name, "cuda", int(gib * console.GIB), peaks)


# Datasheet dense (not 2:4 sparse) tensor-core peaks for bf16/fp16, and for fp32 the plain (non-tensor-core) FP32
# peak: the Trainer trains fp32 without TF32 unless training.tf32 is set. GeForce cards: fp16/bf16 with fp32
# accumulation, which is what autocast uses. Memory: what torch reports as the card's total. Pre-Ampere cards
# have no bf16, so no bf16 rate (time then comes out None).
GPUS: dict[str, Device] = {
    "t4": _gpu("NVIDIA T4", 15, 8.1, 65, bf16=False),
    "v100-16gb": _gpu("NVIDIA V100 16GB (SXM2)", 16, 15.7, 125, bf16=False),
    "v100-32gb": _gpu("NVIDIA V100 32GB (SXM2)", 32, 15.7, 125, bf16=False),
    "a10g": _gpu("NVIDIA A10G", 22.5, 31.2, 70),  # AWS's A10 variant: no NVIDIA datasheet; the commonly quoted rates
    "l4": _gpu("NVIDIA L4", 22.5, 30.3, 121),
    "l40s": _gpu("NVIDIA L40S", 45, 91.6, 362),
    "rtx3090": _gpu("NVIDIA GeForce RTX 3090", 24, 35.6, 71),
    "rtx4090": _gpu("NVIDIA GeForce RTX 4090", 24, 82.6, 165),
    "a100-40gb": _gpu("NVIDIA A100 40GB", 40, 19.5, 312),
    "a100-80gb": _gpu("NVIDIA A100 80GB", 80, 19.5, 312),
    "h100-80gb": _gpu("NVIDIA H100 80GB (SXM)", 79.6, 67, 989.5),
    "h200": _gpu("NVIDIA H200", 140.4, 67, 989.5),
}


def device_named(name: str) -> Device:
    """A GPU of the table by its short name, in any case."""
    from hftoolkit.base.errors import UserError

    device = GPUS.get(name.strip().lower())
    if device is None:
        raise UserError(f"--gpu {name}: unknown GPU; known: {', '.join(GPUS)}: or give --gpu-memory GiB")
    return device


def device_with_memory(gib: float) -> Device:
    """A GPU known only by its memory. Its speed is not guessed: peak_flops is empty, so the time comes out None
    rather than a figure borrowed from some other card."""
    from hftoolkit.base.errors import UserError

    if not isinstance(gib, (int, float)) or not math.isfinite(gib) or gib <= 0:
        raise UserError(f"--gpu-memory {gib}: give the GPU's memory in GiB, a positive number such as 24")
    return Device(f"a GPU with {gib:g} GiB", "cuda", int(gib * console.GIB), {})


def this_machine() -> Device:
    """This machine's GPU (the first one) when torch sees one, else its CPU with all of its RAM."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        known = next((d for d in GPUS.values() if d.name.lower() in props.name.lower()
                      or props.name.lower() in d.name.lower()), None)
        return Device(props.name, "cuda", int(props.total_memory), dict(known.peak_flops) if known else {})
    total = _meminfo_total()
    return Device(f"this machine's CPU ({console.gib(total)} RAM)", "cpu", total, {})


def _meminfo_total() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
