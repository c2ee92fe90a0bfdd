"""DeepSpeed ZeRO: stage 2 partitions the gradients and the optimizer states over the processes (each holds the
whole weights), stage 3 the weights too, gathering a block's for the moment it computes with them. A run goes
Trainer -> accelerate -> deepspeed.initialize on GPUs and CPUs alike, with DeepSpeed's own accelerator (CUDA, or
its CPU accelerator, whose collectives go over gloo).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

from hftoolkit.base import extras
from hftoolkit.training.strategies.base import Strategy, has_cuda


class ZeRO2(Strategy):
    name = "zero2"
    label = "ZeRO-2"
    shards_gradients = shards_optimizer = True
    sharding = "DEEPSPEED"
    runtime = "deepspeed"
    can_skip_nonfinite = False  # DeepSpeed owns the gradients and the step: an update can't be dropped

    @property
    def record_name(self) -> str:  # (stage 1, which shards the optimizer states only, is planned as stage 2)
        return f"ZeRO-{self.launch.zero_stage or 2}"

    def problems(self, recipe, cuda: bool | None = None, model_type: str | None = None) -> list[str]:
        problems = super().problems(recipe, cuda, model_type)
        absent = None if self.launch.launched else extras.missing("deepspeed", self.launch.source)
        if absent:
            return problems + [f"{absent}, or use ddp.yaml or fsdp.yaml"]
        cuda = has_cuda() if cuda is None else cuda
        refused = self.precision_refusal(recipe.training.precision, cuda)
        if refused:  # (auto never is: it steps down to what the strategy runs)
            problems.append(f"training.precision: {refused}: set training.precision: fp32 or auto, or use fsdp.yaml "
                            "or ddp.yaml")
        return problems

    def precision_refusal(self, precision: str, cuda: bool) -> str | None:
        """DeepSpeed's CPU processes keep TrainingArguments' use_cpu off, and transformers then refuses bf16 and
        fp16: said here in one line instead of its traceback from every process."""
        if cuda or precision in ("fp32", "auto"):
            return None
        return (f"{precision} under DeepSpeed ({self.launch.source}) on CPU processes is refused by transformers "
                "without a GPU")

    def _on_cpu(self) -> bool:
        return not has_cuda()

    def process_state(self):
        """accelerate engages DeepSpeed only for processes it does not treat as CPU ones, so on a CPU-only machine
        the state is set up as `patches.accelerate_1_15.deepspeed_cpu_state` says, and the Trainer is told to use
        it as it is (`trainer_arguments`)."""
        if not self._on_cpu():
            return super().process_state()
        from hftoolkit.patches.accelerate_1_15 import deepspeed_cpu_state

        return deepspeed_cpu_state()

    def trainer_arguments(self, cuda: bool) -> dict:
        if cuda:
            return super().trainer_arguments(cuda)
        # TrainingArguments would otherwise replace the state process_state made with a CPU one, where accelerate
        # turns DeepSpeed off.
        return {"use_cpu": False, "accelerator_config": {"use_configured_state": True}}

    def record_after_training(self, trainer) -> dict:
        return optimizer_state_record(trainer) or {}

    def save(self, trainer, target) -> None:
        from hftoolkit.training.strategies.fsdp import save_sharded

        save_sharded(trainer, target)


class ZeRO3(ZeRO2):
    name = "zero3"
    label = "ZeRO-3"
    shards_parameters = True

    def __init__(self, launch):
        super().__init__(launch)
        self._live_config = None

    def problems(self, recipe, cuda: bool | None = None, model_type: str | None = None) -> list[str]:
        problems = super().problems(recipe, cuda, model_type)
        if recipe.model.quantization != "none":
            problems.append(f"model.quantization: {recipe.model.quantization} (bitsandbytes) weights cannot be "
                            f"sharded across processes, which DeepSpeed ZeRO-3 ({self.launch.source}) does to every "
                            "weight: use DDP (--num-processes N or recipes/accelerate/ddp.yaml) or DeepSpeed ZeRO-2, "
                            "or set model.quantization to none")
        return problems

    @contextmanager
    def loading(self, state):
        """Every process takes part in each weight's scatter when ZeRO-3 partitions at load (zero3_init_flag), so
        none goes first; otherwise the main process first."""
        self._live_config = config_at_load()
        with nullcontext() if self._live_config is not None else state.main_process_first():
            yield

    def prepare(self, trainer, run) -> None:
        self._live_config = None  # the Trainer's own DeepSpeed config is live now

    def record(self, trainer, precision: str) -> dict:
        ran = super().record(trainer, precision)
        shards = shard_record(trainer.model)  # (a collective call: every process)
        return {**ran, "shards_at_load": shards} if shards else ran


def config_at_load():
    """The DeepSpeed config made live for from_pretrained, when this ZeRO-3 run builds its model partitioned
    (zero3_init_flag); None otherwise. Its batch sizes are placeholders ("auto", filled in by the Trainer later),
    which deepspeed.zero.Init does not read.

    ZeRO-3 partitions the model as it is built (deepspeed.zero.Init inside from_pretrained) only if transformers
    sees a live DeepSpeed config at that moment: `ZeRO3.loading` makes it live before the weights load, and it is
    kept until the Trainer exists (`prepare`), since transformers holds only a weak reference to it."""
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin()  # from the variables accelerate launch set from the config file
    if plugin.zero_stage != 3 or not plugin.zero3_init_flag:
        return None
    plugin.set_deepspeed_weakref()
    return plugin


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
    """The elements of the torch optimizer's state (Adam's two moments) each process holds, against the trainable
    parameters: ZeRO-1/2/3 give each process the moments of its 1/N of them (a collective call: every process).
    None when DeepSpeed does not run the optimizer."""
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
