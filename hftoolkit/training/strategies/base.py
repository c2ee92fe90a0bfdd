"""The protocol every strategy follows, with what a single process does as the default of each part.

A strategy is one way of spreading a run over its processes (`single`, `ddp`, `fsdp`, `zero`). It is made once
from the launch (`strategy_for`), put on the `Job`, and asked at each stage where the way of spreading matters
(its parts: docs/architecture.md, "The strategy protocol"). Imports no torch at module level.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hftoolkit.training.strategies.launch import LaunchPlan

if TYPE_CHECKING:
    from hftoolkit.config.recipe import Recipe


@dataclass(frozen=True)
class Spread:
    """How a strategy spreads the model states over the processes of a run."""
    name: str
    processes: int
    processes_per_machine: int
    shards_parameters: bool
    shards_gradients: bool
    shards_optimizer: bool
    runtime: str = "torch"


class Strategy:
    name: ClassVar[str] = "single"  # the key in strategies.STRATEGIES, and what `plan --json` names
    label: ClassVar[str] = "one process"  # how a person reads it
    # FSDP, ZeRO-3: each process holds a slice of every weight, so a forward pass needs every process.
    shards_parameters: ClassVar[bool] = False
    shards_gradients: ClassVar[bool] = False
    shards_optimizer: ClassVar[bool] = False
    sharding: ClassVar[str | None] = None  # "FSDP" or "DEEPSPEED": how its checkpoints are written
    record_name: ClassVar[str | None] = None  # manifest.json's "sharding": "FSDP", "ZeRO-2", "ZeRO-3"
    runtime: ClassVar[str] = "torch"  # what each process imports besides torch ("deepspeed")
    can_skip_nonfinite: ClassVar[bool] = True  # a step with a non-finite gradient can be dropped

    def __init__(self, launch: LaunchPlan):
        self.launch = launch

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.launch.num_processes} processes, {self.launch.num_machines} machines)"

    @property
    def processes(self) -> int:
        return self.launch.num_processes

    # ------------------------------------------------------------ before anything loads

    def problems(self, recipe: Recipe, cuda: bool | None = None, model_type: str | None = None) -> list[str]:
        """Every reason `recipe` can't train this way, each a `key: what, why, what to do` sentence; `cuda` says
        whether the processes have GPUs (None: as this machine has); `model_type` is the resolved job's
        (job.model.model_type), which `auto` precision reads (None: not known yet)."""
        problems = []
        n, t = self.processes, recipe.training
        if t.batch_size % n:
            problems.append(f"training.batch_size: {t.batch_size} examples per step do not split evenly over {n} "
                            f"processes ({self.launch.source}): set it to a multiple of {n}, each process then "
                            f"takes batch_size / {n}")
        return problems + self._precision_problems(recipe, cuda, model_type)

    def precision_refusal(self, precision: str, cuda: bool) -> str | None:
        """Why this strategy can't train in `precision` on GPUs (`cuda`) or CPU processes; None where it can.
        `auto` steps down to fp32 from a precision refused here (job/precision.py)."""
        return None

    def _precision_problems(self, recipe: Recipe, cuda: bool | None, model_type: str | None) -> list[str]:
        """The launch config's mixed_precision against the recipe's training.precision, which decides."""
        if self.launch.mixed_precision == "no":  # (auto is resolved, importing torch, only when there is a config)
            return []
        precision = recipe_precision(recipe, self, cuda, model_type)
        wanted = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}[precision]
        if self.launch.mixed_precision == wanted:
            return []
        auto = "" if recipe.training.precision == precision else f" (auto picks {precision} on this machine)"
        return [f"training.precision: {precision} disagrees with mixed_precision {self.launch.mixed_precision!r} of "
                f"{self.launch.source}{auto}: set mixed_precision: 'no' in the config (the recipe's "
                "training.precision decides)"]

    # ------------------------------------------------------------ loading

    def process_state(self):
        """accelerate's PartialState for this training process (the first one it makes sets up the process
        group). cpu=True on a machine without CUDA: processes that torchrun started without ACCELERATE_USE_CPU
        would otherwise each run alone as rank 0, and all write the run directory."""
        import torch
        from accelerate import PartialState

        return PartialState(cpu=not torch.cuda.is_available())

    def loading(self, state):
        """The context to load the model in: the main process first (the others then read its caches and
        prepared weights)."""
        return state.main_process_first()

    def load_arguments(self, quantization) -> dict:
        """from_pretrained's arguments this strategy adds, given the recipe's BitsAndBytesConfig (or None)."""
        return {}

    def quantization_arguments(self, compute_dtype) -> dict:
        """BitsAndBytesConfig's arguments this strategy adds for 4-bit weights."""
        return {}

    def receives_weights(self) -> bool:
        """True on a process that does not read the checkpoint (it gets the weights from another)."""
        return False

    # ------------------------------------------------------------ training

    def trainer_arguments(self, cuda: bool) -> dict:
        return {"use_cpu": not cuda}

    def building_trainer(self):
        """The context the Trainer (and so its Accelerator) is built in."""
        return nullcontext()

    def prepare(self, trainer, run) -> None:
        """What the strategy adds to a built Trainer (its callbacks, its wrapping policy)."""

    def record(self, trainer, precision: str) -> dict:
        """How the run was spread, as accelerate resolved it (manifest.json's "distributed"): its type, the
        processes and machines, what was sharded, the precision, and each process's device. A collective call."""
        from accelerate.utils import gather_object

        from hftoolkit.base.errors import UserError

        state = trainer.accelerator.state
        kind = state.distributed_type.name
        if self.sharding and kind != self.sharding:  # never trained as plain DDP while the config says otherwise
            raise UserError(f"the launch asked for {self.sharding}, but accelerate set the processes up as {kind}: "
                            "this combination of machine and libraries is not supported; use --num-processes N for "
                            "DDP")
        devices = gather_object([str(state.device)]) if state.num_processes > 1 else [str(state.device)]
        return {"type": kind, "processes": state.num_processes, "machines": self.launch.num_machines,
                "sharding": self.record_name, "precision": precision, "devices": devices}

    def record_after_training(self, trainer) -> dict:
        """What training showed about the spread (a collective call), added to manifest.json's "distributed"."""
        return {}

    def save(self, trainer, target) -> None:
        """Write the adapter or the model to `target` on the run directory's writer."""
        if trainer.args.should_save:  # (the run directory's writer: see workflows/train.writes_run)
            trainer.model.save_pretrained(target, safe_serialization=True)

    # ------------------------------------------------------------ planning

    def spread(self):
        """What this strategy divides over its processes, for its memory and time plan."""
        return Spread(name=self.name, processes=self.processes,
                      processes_per_machine=self.launch.processes_per_machine,
                      shards_parameters=self.shards_parameters, shards_gradients=self.shards_gradients,
                      shards_optimizer=self.shards_optimizer, runtime=self.runtime)


def recipe_precision(recipe: Recipe, strategy: Strategy, cuda: bool | None = None,
                     model_type: str | None = None) -> str:
    """training.precision with auto decided for this machine (`cuda`: for GPUs, or CPU processes) under
    `strategy`, for a model of `model_type` (the resolved job's), before anything is loaded."""
    from hftoolkit.job.devices import Device
    from hftoolkit.job.precision import resolve_precision

    device = None if cuda is None else Device("planned", "cuda" if cuda else "cpu", 0)
    return resolve_precision(recipe.training.precision, model_type, strategy, device)


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
