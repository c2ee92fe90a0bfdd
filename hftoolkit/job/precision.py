"""training.precision resolved: the one rule, for this machine or a device `plan` names, under the run's strategy.

`auto` picks what the device multiplies fastest (bf16 on a GPU that has it, else fp16, or fp32 for a model that
overflows in fp16; on a CPU, bf16 autocast where the CPU multiplies bf16 matrices in hardware, else fp32), then
steps down to fp32 where the strategy can't run that pick on that device (DeepSpeed's CPU processes), and says
why. A precision the recipe names is kept as named: the strategy's problems refuse it there, in one line.
Imports torch only inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from hftoolkit.config.families import NO_FP16

if TYPE_CHECKING:
    from hftoolkit.job.devices import Device


class Strategy(Protocol):
    """What the rule asks of a strategy (training/strategies/base.py: the strategies live in the layer above)."""

    def precision_refusal(self, precision: str, cuda: bool) -> str | None: ...


def resolve_precision(requested: str, model_type: str | None, strategy: Strategy | None = None,
                      device: Device | None = None) -> str:
    """The precision a run of `model_type` trains in: `requested`, with auto decided for `device` (None: this
    machine) under `strategy` (None: one process)."""
    return precision_and_reason(requested, model_type, strategy, device)[0]


def precision_and_reason(requested: str, model_type: str | None, strategy: Strategy | None = None,
                         device: Device | None = None) -> tuple[str, str | None]:
    """The precision, and why auto stepped down from the device's own pick (None when it did not)."""
    if requested != "auto":
        return requested, None
    cuda = _has_cuda() if device is None else device.kind == "cuda"
    pick = _device_pick(cuda, model_type, device)
    refused = strategy.precision_refusal(pick, cuda) if strategy is not None else None
    if refused is None:
        return pick, None
    return "fp32", f"auto picks fp32, not {pick}: {refused}"


def _device_pick(cuda: bool, model_type: str | None, device: Device | None) -> str:
    if not cuda:
        from hftoolkit.job.hardware import cpu_bf16_features

        return "bf16" if cpu_bf16_features() else "fp32"
    if device is not None and device.peak_flops:  # a GPU from plan's table: what its figures list
        has_bf16 = "bf16" in device.peak_flops
    else:
        import torch

        has_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if has_bf16:
        return "bf16"
    return "fp32" if model_type in NO_FP16 else "fp16"


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
