"""DeepSpeed ZeRO on any machine, the CPU included, and what a run records about its shards.

A DeepSpeed run goes the same way on GPUs and on CPUs: Trainer -> accelerate -> deepspeed.initialize, with
DeepSpeed's own accelerator (CUDA, or its CPU accelerator, whose collectives go over gloo). accelerate 1.15
engages DeepSpeed only for processes it does not treat as CPU ones (`AcceleratorState`: "ACCELERATE_USE_DEEPSPEED
... and not cpu"), and a CPU machine's processes are CPU ones because ACCELERATE_USE_CPU says so. The shim, the
whole of it, is in `process_state` and `arguments_for_this_machine`: on a CPU-only machine a DeepSpeed process
drops ACCELERATE_USE_CPU, sets up its process group itself (gloo, through deepspeed.comm, as accelerate does for
GPUs), and the Trainer is told to use that state as it is (`use_configured_state`) instead of building its own.

ZeRO-3 partitions the model as it is built (deepspeed.zero.Init inside from_pretrained) only if transformers
sees a live DeepSpeed config at that moment: `config_at_load` makes it live before the weights load.
`shard_record` and `optimizer_state_record` say, from inside the run, what each process holds.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

from hftoolkit.processes import sharding_launched


def deepspeed_on_cpu() -> bool:
    """A DeepSpeed process on a machine without CUDA: DeepSpeed's CPU accelerator, gloo between processes."""
    import torch

    return sharding_launched() == "DEEPSPEED" and not torch.cuda.is_available()


def process_state():
    """accelerate's PartialState for this training process (the first one it makes sets up the process group)."""
    import torch
    from accelerate import PartialState

    if not deepspeed_on_cpu():
        # cpu=True on a machine without CUDA: processes that torchrun started without ACCELERATE_USE_CPU=true
        # would otherwise each run alone as rank 0, and all write the run directory.
        return PartialState(cpu=not torch.cuda.is_available())
    # accelerate's DeepSpeed branch (deepspeed.comm.init_distributed, then distributed_type DEEPSPEED) is taken for
    # non-CPU processes only; "gloo" stands in for the GPU backend it would pick, so the state knows its
    # world size. Without ACCELERATE_USE_CPU, the Accelerator the Trainer makes keeps DeepSpeed engaged.
    os.environ.pop("ACCELERATE_USE_CPU", None)
    _without_shared_memory_allreduce()
    return PartialState(cpu=False, backend="gloo")


def _without_shared_memory_allreduce() -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce (deepspeed_shm_comm) as its CPU process group
    starts: a C++ build of 150 s on 2 cores at the first run on each machine, needing g++ and ninja, for an op only
    `inference_all_reduce` (DeepSpeed-Inference's tensor parallelism) calls. Training's collectives go over gloo
    either way."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def arguments_for_this_machine(cuda: bool) -> dict:
    """TrainingArguments' device settings: use_cpu on a CPU machine, except for DeepSpeed, which runs on its own
    CPU accelerator in the state `process_state` made (TrainingArguments would otherwise replace that state
    with a CPU one, where accelerate turns DeepSpeed off)."""
    if deepspeed_on_cpu():
        return {"use_cpu": False, "accelerator_config": {"use_configured_state": True}}
    return {"use_cpu": not cuda}


def config_at_load():
    """The DeepSpeed config made live for from_pretrained, when this is a ZeRO-3 run that builds its model
    partitioned (zero3_init_flag); None otherwise. Keep the returned object until the Trainer exists: transformers
    holds only a weak reference to it. Its batch sizes are placeholders ("auto", filled in by the Trainer later),
    which deepspeed.zero.Init does not read."""
    if sharding_launched() != "DEEPSPEED":
        return None
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin()  # from the variables accelerate launch set from the config file
    if plugin.zero_stage != 3 or not plugin.zero3_init_flag:
        return None
    plugin.set_deepspeed_weakref()
    return plugin


def loading_order(state, plugin):
    """The context to load the model in: the main process first (the others then read its caches and prepared
    weights), except when ZeRO-3 partitions at load, where every process takes part in each weight's scatter."""
    return nullcontext() if plugin is not None else state.main_process_first()


def shard_record(model) -> dict | None:
    """Under ZeRO-3, the parameter elements this process stores against the model's full count, per process:
    about 1/N each once partitioned (a collective call: every process). None for a model with no ZeRO-3
    parameters."""
    params = list(model.parameters())
    if not any(hasattr(p, "ds_tensor") for p in params):
        return None
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params)
    full = sum(getattr(p, "ds_numel", p.numel()) for p in params)
    return {"parameters": full, "parameters_per_process": _gathered(local)}


def optimizer_state_record(trainer) -> dict | None:
    """Under DeepSpeed, the elements of the torch optimizer's state (Adam's two moments) each process holds, against
    the trainable parameters: ZeRO-1/2/3 give each process the moments of its 1/N of them (a collective call:
    every process). None when DeepSpeed does not run the optimizer."""
    engine = getattr(trainer, "model_wrapped", None)
    optimizer = getattr(engine, "optimizer", None)
    inner = getattr(optimizer, "optimizer", None)  # DeepSpeed's ZeRO optimizer wraps the torch optimizer
    if inner is None or not hasattr(engine, "zero_optimization_stage"):
        return None
    import torch

    held = sum(t.numel() for state in inner.state.values() for t in state.values()
               if torch.is_tensor(t) and t.dim() > 0)
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters() if p.requires_grad)
    return {"trainable_parameters": trainable, "optimizer_state_per_process": _gathered(held)}


def _gathered(value: int) -> list[int]:
    from accelerate import PartialState
    from accelerate.utils import gather_object

    return gather_object([value]) if PartialState().num_processes > 1 else [value]
