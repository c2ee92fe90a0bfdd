"""`hftoolkit plan RECIPE`: the memory and time a run will take, for every strategy at once, before a GPU is rented;
and the same plan asked by `train` before it loads anything.

The model is built from its config on the meta device (nothing read but config.json), with the task head and the
LoRA adapter the run would have; each strategy (training/strategies) divides its states as it would, and
`planning/model.py` turns the figures into bytes, and `planning/timing.py` into seconds, on the target device.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hftoolkit.base.console import gib
from hftoolkit.base.errors import UserError
from hftoolkit.config.recipe import Recipe
from hftoolkit.job.devices import Device
from hftoolkit.job.precision import resolve_precision
from hftoolkit.job.spec import Job, ResolvedModel
from hftoolkit.planning.lengths import (
    memory_lengths,
    step_lengths,
    tokenized_sample,
    trained_rows,
    with_data_longest,
)
from hftoolkit.planning.model import MemoryPlan, plan_memory
from hftoolkit.planning.timing import TimePlan, plan_time
from hftoolkit.training.strategies import STRATEGIES, LaunchPlan, Strategy, strategy_for

# What the override of the memory check is called, wherever a refusal names it.
OVERRIDE = "--skip-memory-check"
# Costs within this share of the lowest are one cost to the pick: the plan is not closer than that to a run (a batch
# split over two processes pads a little less, and plans a few percent cheaper, on no evidence a run would show).
COST_TIE = 0.1
# What a launch of several processes costs before training, which one process does not pay: the launcher's start, each
# process importing the libraries again, their rendezvous (benchmarks/plan_runs.py, `launch_calibration`). Beside
# minutes of training it is nothing; beside the seconds of a small job it decides the pick.
LAUNCH_SECONDS = 5.0


@dataclass(frozen=True)
class StrategyPlan:
    """One strategy's plan, or why the recipe can't use it."""

    name: str
    label: str
    processes: int
    precision: str | None = None  # what auto picks for this strategy on the device (None: it can't run)
    memory: MemoryPlan | None = None
    time: TimePlan | None = None
    not_possible: tuple[str, ...] = ()
    lengths: dict | None = None  # the lengths planned at: {"memory": a batch's longest, "step": a batch's mean}
    devices: int = 1  # what a run holds, and is billed for: a GPU per process, or a CPU run's whole machines
    launch_seconds: float = 0.0  # starting its processes (LAUNCH_SECONDS where there are several)

    @property
    def fits(self) -> bool:
        return not self.not_possible and self.memory is not None and self.memory.fits is not False

    @property
    def device_seconds(self) -> float | None:
        """What a run costs: the devices it holds times its planned time (the training and the start of its processes,
        else a step where the number of steps is unknown: every strategy takes the same steps); None where the
        device's speed is unknown."""
        time = self.time
        if time is None or time.train_seconds is None:
            seconds = time and time.step_seconds
        else:
            seconds = time.train_seconds + self.launch_seconds
        return None if seconds is None else self.devices * seconds

    def as_dict(self) -> dict:
        return {"strategy": self.name, "label": self.label, "processes": self.processes,
                "precision": self.precision, "fits": self.fits,
                "not_possible": list(self.not_possible), "lengths": self.lengths,
                "devices": self.devices, "launch_seconds": self.launch_seconds, "device_seconds": self.device_seconds,
                "memory": self.memory.as_dict() if self.memory else None,
                "time": self.time.as_dict() if self.time else None}

    def record(self) -> dict:
        """manifest.json's "plan" as the run starts: the strategy, the device, and the planned peak per process
        (itemized, MiB) and step time (itemized, seconds)."""
        memory, time = self.memory, self.time
        return {"strategy": self.name, "processes": self.processes,
                "planned_peak_mb": _mb(memory.peak) if memory else None,
                "planned_items_mb": {k: _mb(v) for k, v in memory.items.items()} if memory else None,
                "available_mb": _mb(memory.available) if memory else None,
                "planned_step_seconds": _round(time.step_seconds) if time else None,
                "planned_step_items_s": {k: round(v, 5) for k, v in time.items.items()} if time else None,
                "planned_lengths": self.lengths}

    def measured(self, step_seconds: float | None) -> dict:
        """What training measured beside what was planned: each process's peak (VmHWM on a CPU, the CUDA
        allocator's peaks on a GPU) and the mean step time; each peak's error against the plan. A collective call:
        every process."""
        from accelerate import PartialState
        from accelerate.utils import gather_object

        from hftoolkit.base.memory import peak_memory_mb, reserved_peak_mb

        mine = {"peak_mb": peak_memory_mb(), "reserved_mb": reserved_peak_mb()}
        peaks = gather_object([mine]) if PartialState().num_processes > 1 else [mine]
        record = {**self.record(), "measured_peak_mb": [p["peak_mb"] for p in peaks],
                  "measured_step_seconds": _round(step_seconds)}
        if any(p["reserved_mb"] is not None for p in peaks):
            record["measured_reserved_mb"] = [p["reserved_mb"] for p in peaks]
        planned = record["planned_peak_mb"]
        if planned:
            record["peak_error"] = [round(planned / p["peak_mb"] - 1, 4) for p in peaks if p["peak_mb"]]
        return record


@dataclass(frozen=True)
class Plan:
    """A recipe's plan on one device: the launch's own strategy, and every strategy beside it."""

    recipe: str
    checkpoint: str
    device: Device
    precision: str
    shape: dict
    launched: str  # the strategy the launch engages
    strategies: tuple[StrategyPlan, ...] = field(default_factory=tuple)
    lengths_from: str = "recipe"  # a step's lengths: "data" (its batches' padded length), "recipe", or "images"

    @property
    def chosen(self) -> StrategyPlan:
        return next(s for s in self.strategies if s.name == self.launched)

    @property
    def lowest_cost_fit(self) -> StrategyPlan | None:
        """The strategy that fits at the lowest cost per run: the fewest device-seconds (`device_seconds`), those
        within COST_TIE of the fewest counting as a tie; where the device's speed is unknown, the fewest devices;
        ties to the table's order (the least machinery first)."""
        fitting = [s for s in self.strategies if s.fits]
        if not fitting:
            return None
        if any(s.device_seconds is None for s in fitting):
            return min(fitting, key=lambda s: s.devices)
        lowest = min(s.device_seconds for s in fitting)
        return next(s for s in fitting if s.device_seconds <= lowest * (1 + COST_TIE))

    def as_dict(self) -> dict:
        pick = self.lowest_cost_fit
        return {"recipe": self.recipe, "checkpoint": self.checkpoint, "device": vars(self.device),
                "precision": self.precision, "model": self.shape, "launched": self.launched,
                "lowest_cost_fit": pick.name if pick else None, "lengths_from": self.lengths_from,
                "strategies": [s.as_dict() for s in self.strategies]}


def plan_recipe(recipe: Recipe, launch: LaunchPlan, device: Device) -> Plan:
    """The plan of `recipe` under `launch` on `device`, with every other strategy beside it (at the launch's process
    count, two at least); reads the model's config, and where the data and the tokenizer are at hand, the data as
    `train` reads it: its row counts (the run's time needs them unless training.max_steps is set) and what its
    batches hold (a step is planned at their padded length, as `train` plans it; memory at the recipe's lengths)."""
    job = _config_job(recipe, device)
    resolved = _resolved_with_data(recipe)
    sample = tokenized_sample(resolved) if resolved is not None else None
    train_rows, eval_rows = (trained_rows(resolved, sample), len(resolved.data["eval"])) if resolved is not None \
        else _row_counts(recipe)
    shape = model_shape_of(job)
    launched = strategy_for(launch)
    several = max(2, launch.num_processes)
    rows = []
    for name, cls in STRATEGIES.items():
        if name == launched.name:
            strategy = launched
        else:
            count = 1 if name == "single" else several
            strategy = cls(replace(launch, num_processes=count, source=f"{count} processes"))
        step_at = None if sample is None else step_lengths(replace(resolved, strategy=strategy), memory_lengths(job),
                                                              sample)
        rows.append(strategy_plan(strategy, job, shape, device, train_rows, eval_rows, step_at))
    precision = next(row.precision for row in rows if row.name == launched.name) or job.precision
    return Plan(recipe=recipe.name, checkpoint=recipe.model.checkpoint, device=device, precision=precision,
                shape=shape, launched=launched.name, strategies=tuple(rows),
                lengths_from="images" if shape["image_tokens"] else "recipe" if sample is None else "data")


def strategy_plan(strategy: Strategy, job: Job, shape: dict, device: Device | None, train_rows: int | None = None,
                  eval_rows: int | None = None, step_at: dict | None = None) -> StrategyPlan:
    """One strategy's memory and time for `job`, or the reasons it can't run the recipe; its time at
    `step_at` where given (planning/lengths.py: what the data's batches hold), else at the lengths memory is
    planned at."""
    cuda = device.kind == "cuda" if device is not None else None
    # (a GPU per process; CPU processes share their machines, which a run holds whole)
    devices = strategy.processes if cuda else max(1, strategy.processes // strategy.launch.processes_per_machine)
    head = dict(name=strategy.name, label=strategy.label, processes=strategy.processes, devices=devices,
                launch_seconds=LAUNCH_SECONDS if strategy.processes > 1 else 0.0)
    refused = tuple(strategy.problems(job.recipe, cuda=cuda, model_type=job.model.model_type))
    if refused:
        return StrategyPlan(**head, not_possible=refused)
    spread, lengths = strategy.spread(), memory_lengths(job)
    step = step_at or lengths
    precision = resolve_precision(job.recipe.training.precision, job.model.model_type, strategy, device)
    return StrategyPlan(**head, precision=precision, lengths={"memory": lengths, "step": step},
                        memory=plan_memory(shape, job.recipe, spread, device, precision, lengths),
                        time=plan_time(shape, job.recipe, spread, device, precision, step, train_rows, eval_rows))


def _resolved_with_data(recipe: Recipe) -> Job | None:
    """The recipe resolved as `train` resolves it (its tokenizer, its data read, preflight), where that can be done
    here; None for a stream (read only by training), or a checkpoint or data set not at hand (a hub id whose config
    alone is cached): then a step is planned at the recipe's lengths."""
    from hftoolkit.job.resolve import resolve_job

    if recipe.data.streaming:
        return None
    try:
        return resolve_job(recipe)
    except UserError:
        return None


def _row_counts(recipe: Recipe) -> tuple[int | None, int | None]:
    """The train and eval rows of a data set that is at hand (a local file, a builtin set, a cached hub set); None
    for a stream, or data that can't be read here (the step time is planned all the same)."""
    from hftoolkit.sources.data import load_data

    if recipe.data.streaming:
        return None, None
    try:
        splits, _ = load_data(recipe, {})
    except UserError:
        return None, None
    return len(splits["train"]), len(splits["eval"])


def model_shape_of(job: Job) -> dict:
    """The figures of the job's model, built on the meta device as its formulation builds it for training."""
    from hftoolkit.models.families import formulation
    from hftoolkit.models.loading import on_meta_device
    from hftoolkit.planning.model import model_shape

    try:
        with on_meta_device():
            model, _ = formulation(job).load_model(job)
    except (ValueError, TypeError, AttributeError, RuntimeError, KeyError) as err:  # a config that builds nothing
        said = (str(err).strip() or type(err).__name__).splitlines()[0][:200]
        raise UserError(f"model.checkpoint: transformers can't build {job.recipe.model.checkpoint} from its config "
                        f"({said}): check its config.json") from None
    return model_shape(model)


def _config_job(recipe: Recipe, device: Device) -> Job:
    """A job of the recipe's model config alone: no tokenizer, no weights, no data (a hub id whose config alone is
    cached plans as well as a local folder)."""
    from hftoolkit.job.resolve import family_of, load_config
    from hftoolkit.sources.checkpoint import checkpoint_errors, resolve_checkpoint

    path = resolve_checkpoint(recipe)
    with checkpoint_errors(recipe):
        config = load_config(recipe, path)
        family = family_of(recipe, config)
    model = ResolvedModel(checkpoint=recipe.model.checkpoint, path=path, revision=recipe.model.revision,
                          config=config, family=family, processor=None)
    names = recipe.data.label_names or ("a", "b")  # (the head's width hardly weighs: two labels stand in)
    return Job(recipe=recipe, model=model, precision=resolve_precision(recipe.training.precision, config.model_type,
                                                                       device=device),
               label_names=tuple(names))


# ---------------------------------------------------------------- train asks first


def refusal(job: Job, memory: MemoryPlan) -> str | None:
    """One line when the job is planned over the memory its processes have, naming the cheapest change that fits;
    None when it fits."""
    if memory.fits is not False:
        return None
    return (f"training: this run is planned to need {gib(memory.peak)} per process ({job.strategy.label}), more "
            f"than the {gib(memory.available)} each process has on this machine: {cheapest_change(job)} "
            f"(`hftoolkit plan` itemizes it; {OVERRIDE} trains anyway)")


def cheapest_change(job: Job) -> str:
    """The first change, in order of what it costs the run, that the plan says fits: another strategy at the same
    process count, gradient checkpointing, 4-bit weights with LoRA, then a smaller batch."""
    from hftoolkit.job.devices import this_machine

    device, strategy, recipe = this_machine(), job.strategy, job.recipe
    shape = model_shape_of(job)
    for name, cls in STRATEGIES.items():
        if name not in ("single", strategy.name):
            other = cls(replace(strategy.launch, num_processes=max(2, strategy.processes)))
            if strategy_plan(other, job, shape, device).fits:  # (fits: possible for the recipe, and within memory)
                return f"use {other.label} on {other.processes} processes"
    changes = [("training.gradient_checkpointing=true", {"training": {"gradient_checkpointing": True}}),
               ("model.quantization=4bit with lora.enabled=true",
                {"model": {"quantization": "4bit"}, "lora": {"enabled": True}})]
    batch = recipe.training.batch_size
    while batch > strategy.processes:
        batch //= 2
        changes.append((f"training.batch_size={batch}", {"training": {"batch_size": batch}}))
    for said, change in changes:
        changed = replace(job, recipe=_changed(recipe, change))
        if not strategy.problems(changed.recipe, model_type=job.model.model_type) \
                and strategy_plan(strategy, changed, model_shape_of(changed), device).fits:
            return f"set {said}"
    return "no change of strategy, checkpointing, 4-bit or batch fits it here: use a machine with more memory"


def _changed(recipe: Recipe, change: dict) -> Recipe:
    from hftoolkit.config.recipe import validate_recipe

    raw = recipe.model_dump()
    for section, values in change.items():
        raw[section].update(values)
    return validate_recipe(raw, "recipe")


def planned_job(job: Job, check: bool = True) -> Job:
    """The job with its strategy's plan on this machine, refused in one line (`check`) when it does not fit."""
    from hftoolkit.job.devices import this_machine

    data = job.data or {}
    rows = {split: len(ds) if hasattr(ds, "__len__") else None for split, ds in data.items()}
    sample = tokenized_sample(job)
    if rows.get("train") is not None:
        rows["train"] = trained_rows(job, sample)
    job = with_data_longest(job, sample)
    step = step_lengths(job, memory_lengths(job), sample)
    planned = strategy_plan(job.strategy, job, model_shape_of(job), this_machine(), rows.get("train"),
                            rows.get("eval"), step)
    said = refusal(job, planned.memory) if check and planned.memory is not None else None
    if said:
        raise UserError(said)
    return replace(job, plan=planned)


def _mb(count: float | None) -> float | None:
    return None if count is None else round(count / 2**20, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
