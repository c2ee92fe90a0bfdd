"""The launch: how many processes on how many machines, and the accelerate config that spreads the model over
them; planned from the command's options (and the config file), or read back in a process a launcher started.

This is the one module that reads the launch from the environment (`plan_from_environment`, `this_process`; the
rank variables through base/ranks.py): everything after it reads the `LaunchPlan`, or the strategy made from it
(`strategy_for`), on the `Job`.
Imports no torch: the launching process stays light.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hftoolkit.base import ranks
from hftoolkit.config.recipe import read_yaml_mapping
from hftoolkit.config.shipped import find_recipe

if TYPE_CHECKING:
    from hftoolkit.config.recipe import Recipe

# accelerate's (and torchrun's) port when a config names none; every machine must name the same one.
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Machines:
    """--num-machines, --machine-rank, --main-process-ip and --main-process-port as typed (None: not given,
    the accelerate config's value or the default then holds)."""

    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None

    def given(self) -> list[str]:
        return [f"--{name.replace('_', '-')}" for name, value in vars(self).items() if value is not None]


@dataclass(frozen=True)
class LaunchPlan:
    """How the training processes run: how many, on how many machines, and how the model is spread over them."""

    num_processes: int = 1
    distributed: str = "NO"  # NO, MULTI_GPU (DDP), MULTI_CPU, DEEPSPEED, FSDP, as accelerate names them
    zero_stage: int | None = None
    mixed_precision: str = "no"
    config: Path | None = None  # the accelerate config file, when one was named
    source: str = "--num-processes"  # what to name in an error message
    launched: bool = False  # already running under a launcher
    num_machines: int = 1  # num_processes counts the processes of all machines together
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    ram_efficient_loading: bool = False  # FSDP: only the first process reads the checkpoint

    @property
    def relaunch(self) -> bool:
        return not self.launched and (self.config is not None or self.num_processes > 1 or self.num_machines > 1)

    @property
    def processes_per_machine(self) -> int:
        return max(1, self.num_processes // self.num_machines)


@dataclass(frozen=True)
class ThisProcess:
    """Where this process stands in its launch: its global rank and its machine's."""

    rank: int = 0
    machine: int = 0


def plan_from_config(config: Path | None, num_processes: int | None, source: str = "--accelerate-config",
                     machines: Machines = Machines()) -> LaunchPlan:
    """The plan an accelerate config file (or none) describes; `num_processes` and `machines` override the
    file's."""
    if config is None:
        n, m = num_processes or 1, machines.num_machines or 1
        return _on_machines(LaunchPlan(num_processes=n, distributed="MULTI_GPU" if n > 1 or m > 1 else "NO",
                                       source=source), {}, machines)
    config = find_recipe(config)  # (a shipped one by its name too: accelerate/ddp)
    data = read_yaml_mapping(config, source, f"accelerate config {config} not found: check the path, or name a "
                             "shipped one (`hftoolkit recipes` lists them under accelerate/)", "the config",
                             f"{config} is not a mapping of accelerate settings: write it with `accelerate config`")
    deepspeed, fsdp = data.get("deepspeed_config") or {}, data.get("fsdp_config") or {}
    plan = LaunchPlan(num_processes=num_processes or int(data.get("num_processes") or 1),
                      distributed=str(data.get("distributed_type", "NO")).upper(),
                      zero_stage=deepspeed.get("zero_stage"), mixed_precision=str(data.get("mixed_precision", "no")),
                      config=config, source=f"{source} {config}",
                      ram_efficient_loading=bool(fsdp.get("fsdp_cpu_ram_efficient_loading", False)))
    return _on_machines(plan, data, machines)


def plan_from_options(recipe: Recipe, accelerate_config: Path | None, num_processes: int | None,
                      machines: Machines = Machines()) -> LaunchPlan:
    """The launch a command's options name, with no launcher yet: the config --accelerate-config names, else the
    recipe's training.accelerate_config, else --num-processes; each said by its own name in the errors."""
    named = recipe.training.accelerate_config
    config = accelerate_config or (Path(named) if named else None)
    origin = "--accelerate-config" if accelerate_config else "training.accelerate_config"
    return plan_from_config(config, num_processes, origin if config else "--num-processes", machines)


def _on_machines(plan: LaunchPlan, config: dict, machines: Machines) -> LaunchPlan:
    """`plan` spread over the machines the options name, else the config's (accelerate's key names)."""
    def pick(name, default=None):
        given = getattr(machines, name)
        return given if given is not None else config.get(name, default)

    count = int(pick("num_machines", 1) or 1)
    port = pick("main_process_port")
    return replace(plan, num_machines=count, machine_rank=int(pick("machine_rank", 0) or 0),
                   main_process_ip=pick("main_process_ip"),
                   main_process_port=int(port) if port is not None else DEFAULT_PORT if count > 1 else None)


def launch_config_file(path: Path) -> str | None:
    """One line saying that `path` is an accelerate launch config, not a recipe (for `validate`); None otherwise."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return None
    if not isinstance(raw, dict) or {"name", "task", "model", "data"} & set(raw) \
            or not {"distributed_type", "compute_environment"} & set(raw):
        return None
    return (f"{path}: an accelerate launch config, not a recipe: name it in a recipe's "
            "training.accelerate_config, or pass it to `hftoolkit train --accelerate-config`")


def check_machines(plan: LaunchPlan) -> list[str]:
    """Why the machines of `plan` cannot form one run, each an `option: what, what to do` sentence."""
    m, n = plan.num_machines, plan.num_processes
    if m == 1 or plan.launched:  # (a launcher has formed the run already)
        return []
    problems = []
    if n % m:
        problems.append(f"--num-processes {n}: counts the processes of all {m} machines together, so it must split "
                        f"evenly over them: pass a multiple of {m} (one process per machine: {m})")
    if not 0 <= plan.machine_rank < m:
        problems.append(f"--machine-rank {plan.machine_rank}: the machines of a {m}-machine run are numbered 0 to "
                        f"{m - 1}: give each machine its own rank, 0 on the main machine")
    if plan.main_process_port is not None and not 1 <= plan.main_process_port <= 65535:
        problems.append(f"--main-process-port {plan.main_process_port}: a TCP port is 1 to 65535: name a free port "
                        "on machine 0, the same on every machine")
    if not plan.main_process_ip:
        problems.append(f"--main-process-ip: {m} machines meet at machine 0's address, and none was given: pass the "
                        "address the other machines reach machine 0 at (the same on every machine)")
    return problems


# ---------------------------------------------------------------- read back in a launched process


def current_launch() -> LaunchPlan:
    """This process's launch: the launcher's, or a single process when none started it."""
    return plan_from_environment() if ranks.under_launcher() else LaunchPlan(source="a single process")


def sharding_launched() -> str | None:
    """"DEEPSPEED" or "FSDP" when `accelerate launch` started this process with such a config (it says so in
    these variables), else None."""
    for kind in ("DEEPSPEED", "FSDP"):
        if os.environ.get(f"ACCELERATE_USE_{kind}", "").lower() == "true":
            return kind
    return None


def plan_from_environment() -> LaunchPlan:
    """The plan of a process a launcher started, read from the variables accelerate and torchrun set."""
    env = os.environ
    world = ranks.world_size()
    distributed = sharding_launched() or ("MULTI_GPU" if world > 1 else "NO")
    stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    here = ranks.local_world_size()  # torchrun's processes on this machine
    return LaunchPlan(num_processes=world, distributed=distributed, zero_stage=int(stage) if stage else None,
                      mixed_precision=env.get("ACCELERATE_MIXED_PRECISION", "no"), source="the launcher",
                      launched=True, num_machines=max(1, world // here), machine_rank=ranks.machine_rank(),
                      main_process_ip=env.get("MASTER_ADDR"),
                      ram_efficient_loading=env.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "").lower() == "true")


def this_process() -> ThisProcess:
    """This process's global rank and machine rank, as the launcher set them (0 and 0 without a launcher)."""
    return ThisProcess(rank=ranks.rank(), machine=ranks.machine_rank())
