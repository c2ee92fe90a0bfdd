"""The ways a run is spread over its processes, one module each, behind one protocol (`base.Strategy`).

`strategy_for` turns the launch (`launch.LaunchPlan`) into the strategy the `Job` carries; nothing after it reads
the launch from the environment, or asks the Trainer whether FSDP or DeepSpeed is engaged (docs/architecture.md,
"The strategy protocol", says how to add one).
"""

from __future__ import annotations

from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.ranks import under_launcher
from hftoolkit.config.recipe import Recipe, RecipeError
from hftoolkit.training.strategies.base import Strategy
from hftoolkit.training.strategies.ddp import DDP
from hftoolkit.training.strategies.fsdp import FSDP
from hftoolkit.training.strategies.launch import (
    LaunchPlan,
    Machines,
    check_machines,
    plan_from_environment,
    plan_from_options,
)
from hftoolkit.training.strategies.single import Single
from hftoolkit.training.strategies.zero import ZeRO2, ZeRO3

# Cheapest to run first: `plan` names the first one that fits.
STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (Single, DDP, ZeRO2, FSDP, ZeRO3)}


def strategy_of(job) -> Strategy:
    """The job's strategy; one process for a job resolved without one (eval, predict: a Trainer that only scores)."""
    return job.strategy if job.strategy is not None else Single(LaunchPlan(source="a single process"))


def strategy_for(launch: LaunchPlan) -> Strategy:
    """The strategy a launch engages: accelerate's distributed type (and ZeRO stage), or one process."""
    if launch.distributed == "FSDP":
        return FSDP(launch)
    if launch.distributed == "DEEPSPEED":
        return ZeRO3(launch) if launch.zero_stage == 3 else ZeRO2(launch)
    return DDP(launch) if launch.num_processes > 1 else Single(launch)


def launch_strategy(recipe: Recipe, num_processes: int | None, accelerate_config: Path | None,
                    source: str = "recipe", machines: Machines | None = None) -> Strategy:
    """The strategy of this `hftoolkit train` call, built once from its launch (`.launch`) and checked against the
    recipe (raises RecipeError): the CLI makes it, and the run carries it on its Job."""
    from hftoolkit.sources.checkpoint import model_type_of

    machines = machines or Machines()
    if under_launcher():
        plan = plan_from_environment()
        _refuse_relaunch_options(plan, num_processes, accelerate_config, machines)
    else:
        plan = plan_from_options(recipe, accelerate_config, num_processes, machines)
    strategy = strategy_for(plan)
    # Before the job is resolved, the model type a local checkpoint's files say (none for a hub id), read only where
    # `auto` precision meets a launch config's mixed_precision; the plan asks again with the job's
    # (planning/plan.strategy_plan).
    model_type = model_type_of(recipe.model.checkpoint, recipe.model.gguf_file) \
        if plan.mixed_precision != "no" else None
    problems = [*check_machines(plan), *(f"{source}: {p}" for p in strategy.problems(recipe, model_type=model_type))]
    if problems:
        raise RecipeError(problems)
    return strategy


def _refuse_relaunch_options(plan: LaunchPlan, num_processes: int | None, accelerate_config: Path | None,
                             machines: Machines) -> None:
    if machines.given():
        raise UserError(f"{machines.given()[0]}: this process was started by a launcher already (one of "
                        f"{plan.num_processes}); give the machines to that launcher, or drop the option")
    if accelerate_config is not None:
        raise UserError(f"--accelerate-config: this process was started by a launcher already (one of "
                        f"{plan.num_processes}); give the config to that launcher, or drop --accelerate-config")
    if num_processes not in (None, plan.num_processes):
        raise UserError(f"--num-processes {num_processes}: this process is one of {plan.num_processes} that a "
                        "launcher started already; drop --num-processes or launch that many")


__all__ = ["STRATEGIES", "LaunchPlan", "Machines", "Strategy", "launch_strategy", "strategy_for", "strategy_of"]
