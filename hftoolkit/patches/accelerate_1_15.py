"""accelerate 1.15 and 1.16 decide by the device type, in two places, what hftoolkit runs on CPU processes too.

FSDP and DeepSpeed are engaged only for accelerator processes; `fsdp_on_cpu` and `deepspeed_cpu_state` complete
the decision on CPU processes over gloo (strategies/fsdp.py, strategies/zero.py).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

LIBRARY = "accelerate"
VERSIONS = ">=1.15,<1.17"  # (1.16 checked: AcceleratorState.__init__ decides alike)


@contextmanager
def fsdp_on_cpu():
    """Inside the block, an AcceleratorState that resolves MULTI_CPU under an FSDP launch becomes FSDP.

    `AcceleratorState.__init__` turns a launch with ACCELERATE_USE_FSDP=true into DistributedType.FSDP only for
    accelerator processes (state.py: the MULTI_GPU, MULTI_XPU... list); CPU processes (MULTI_CPU, gloo) keep
    MULTI_CPU and the plugin is dropped, so they would train as plain DDP, every process holding the whole model.
    torch's FSDP2 (`fully_shard`) shards over gloo on CPU as it does over NCCL, so this block does what
    AcceleratorState.__init__ does for MULTI_GPU in the same case: the type, the plugin, the plugin's mixed
    precision, and PartialState's copy of the type. Nothing else in it depends on the device.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

    AcceleratorState.__init__ = init
    try:
        yield
    finally:
        AcceleratorState.__init__ = original


def deepspeed_cpu_state():
    """accelerate's PartialState for a DeepSpeed process on a machine without CUDA.

    `AcceleratorState` engages DeepSpeed only for processes it does not treat as CPU ones ("ACCELERATE_USE_
    DEEPSPEED ... and not cpu"), and a CPU machine's processes are CPU ones because ACCELERATE_USE_CPU says so:
    it is dropped here, and the process group is set up as accelerate's DeepSpeed branch does for GPUs
    (deepspeed.comm.init_distributed, then distributed_type DEEPSPEED), "gloo" standing in for the GPU backend it
    would pick, so the state knows its world size. Without ACCELERATE_USE_CPU, the Accelerator the Trainer makes
    keeps DeepSpeed engaged; the Trainer is told to use this state as it is (`use_configured_state`,
    strategies/zero.py).
    """
    from accelerate import PartialState

    from hftoolkit.patches.deepspeed_0_19 import without_shared_memory_allreduce

    os.environ.pop("ACCELERATE_USE_CPU", None)
    without_shared_memory_allreduce()
    return PartialState(cpu=False, backend="gloo")


def still_needed() -> list[str]:
    """What in accelerate's code these patches rely on, and whether it still reads so: an empty list when all
    holds (tests/unit/patches/test_patches.py)."""
    import inspect

    from accelerate import state

    source = inspect.getsource(state.AcceleratorState.__init__)
    changed = []
    if "DistributedType.MULTI_GPU" not in source or "fsdp_plugin" not in source:
        changed.append("AcceleratorState.__init__ no longer decides FSDP from a list of accelerator types")
    if "ACCELERATE_USE_DEEPSPEED" not in source or "not cpu" not in source.replace("not self._cpu", "not cpu"):
        changed.append("AcceleratorState.__init__ no longer engages DeepSpeed for non-CPU processes only")
    return changed
