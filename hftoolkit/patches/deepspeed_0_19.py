"""DeepSpeed 0.19 compiles its shared-memory all-reduce (deepspeed_shm_comm) as its CPU process group starts: a C++
build of minutes at the first run on each machine, needing g++ and ninja, for an op only `inference_all_reduce`
(DeepSpeed-Inference's tensor parallelism) calls. Training's collectives go over gloo either way, so the op is
marked incompatible and never built."""

from __future__ import annotations

LIBRARY = "deepspeed"
VERSIONS = ">=0.19,<0.20"


def without_shared_memory_allreduce() -> None:
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def still_needed() -> list[str]:
    import deepspeed.ops

    ops = getattr(deepspeed.ops, "__compatible_ops__", None)
    return [] if isinstance(ops, dict) else ["deepspeed.ops.__compatible_ops__ is gone: the build can't be skipped"]
