"""Training on several processes: starting them, refusing what cannot work, and the parts of
training that must know how many processes there are.

- `hftoolkit train RECIPE --num-processes N` (or `--accelerate-config FILE`, or a recipe's
  training.accelerate_config) starts itself again under `accelerate launch`; a process that a
  launcher already started (accelerate, torchrun, mpirun) never relaunches. On several machines
  (`--num-machines M --machine-rank R --main-process-ip IP`, or the config's keys) each machine runs
  the same command with its own rank; N counts the processes of all machines together.
- `check` refuses, with a reason, combinations that cannot work: a batch that does not split
  evenly over the processes, 8-bit weights under DeepSpeed ZeRO-3 or FSDP, and so on.
- `generate_everywhere` runs generation-based eval once per example across the processes.

training.batch_size is the batch of one optimizer step over all processes (before gradient
accumulation), so a recipe trains the same way on 1 or N processes; eval.batch_size is per
process (a memory knob: it does not change which examples are scored).
Imports no torch at module level: the launching process stays light.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from hftoolkit.config.recipe import Recipe, RecipeError, read_yaml_mapping
from hftoolkit.errors import UserError
from hftoolkit.processes import (
    PARENT_VARIABLE,
    REASONS_VARIABLE,
    STOP_SIGNALS,
    Stopped,
    first_reason,
    sharding_launched,
    under_launcher,
)

# The command the user typed, handed to the relaunched processes for manifest.json.
COMMAND_VARIABLE = "HFTOOLKIT_COMMAND"
LAUNCH_OPTIONS = ("--num-processes", "--accelerate-config", "--num-machines", "--machine-rank", "--main-process-ip",
                  "--main-process-port")
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


@dataclass
class LaunchPlan:
    """How the training processes run: how many, and how the model is spread over them."""

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

    @property
    def shards_parameters(self) -> bool:
        """FSDP and ZeRO-3 split every weight across the processes: a forward pass needs all of them."""
        return self.distributed == "FSDP" or (self.distributed == "DEEPSPEED" and self.zero_stage == 3)

    @property
    def sharding(self) -> str | None:
        """"FSDP" or "DEEPSPEED" when the launch engages one (as processes.sharding_launched reads it in each
        launched process), else None."""
        return self.distributed if self.distributed in ("FSDP", "DEEPSPEED") else None

    @property
    def relaunch(self) -> bool:
        return not self.launched and (self.config is not None or self.num_processes > 1 or self.num_machines > 1)


# ---------------------------------------------------------------- where we run


def command_line() -> list[str]:
    """The command as the user typed it (before a relaunch), for manifest.json."""
    recorded = os.environ.get(COMMAND_VARIABLE)
    return json.loads(recorded) if recorded else list(sys.argv)


def plan_launch(recipe: Recipe, num_processes: int | None, accelerate_config: Path | None,
                source: str = "recipe", machines: Machines = Machines()) -> LaunchPlan:
    """The plan for this `hftoolkit train` call, checked against the recipe (raises RecipeError)."""
    if under_launcher():
        plan = plan_from_environment()
        if machines.given():
            raise UserError(f"{machines.given()[0]}: this process was started by a launcher already (one of "
                            f"{plan.num_processes}); give the machines to that launcher, or drop the option")
        if accelerate_config is not None:
            raise UserError(f"--accelerate-config: this process was started by a launcher already (one of "
                            f"{plan.num_processes}); give the config to that launcher, or drop --accelerate-config")
        if num_processes not in (None, plan.num_processes):
            raise UserError(f"--num-processes {num_processes}: this process is one of {plan.num_processes} that a "
                            "launcher started already; drop --num-processes or launch that many")
    else:
        config = accelerate_config or (Path(recipe.training.accelerate_config)
                                       if recipe.training.accelerate_config else None)
        origin = "--accelerate-config" if accelerate_config else "training.accelerate_config"
        plan = plan_from_config(config, num_processes, origin if config else "--num-processes", machines)
    problems = [*check_machines(plan), *(f"{source}: {p}" for p in check(recipe, plan))]
    if problems:
        raise RecipeError(problems)
    return plan


def plan_from_config(config: Path | None, num_processes: int | None, source: str = "--accelerate-config",
                     machines: Machines = Machines()):
    """The plan an accelerate config file (or none) describes; `num_processes` and `machines` override the
    file's."""
    if config is None:
        n, m = num_processes or 1, machines.num_machines or 1
        return _on_machines(LaunchPlan(num_processes=n, distributed="MULTI_GPU" if n > 1 or m > 1 else "NO",
                                       source=source), {}, machines)
    config = Path(config)
    data = read_yaml_mapping(config, source, f"accelerate config {config} not "
                             "found: check the path (the shipped ones are in recipes/accelerate/)", "the config",
                             f"{config} is not a mapping of accelerate settings: write it with `accelerate config`")
    deepspeed = data.get("deepspeed_config") or {}
    plan = LaunchPlan(num_processes=num_processes or int(data.get("num_processes") or 1),
                      distributed=str(data.get("distributed_type", "NO")).upper(),
                      zero_stage=deepspeed.get("zero_stage"), mixed_precision=str(data.get("mixed_precision", "no")),
                      config=config, source=f"{source} {config}")
    return _on_machines(plan, data, machines)


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
    if not plan.main_process_ip:
        problems.append(f"--main-process-ip: {m} machines meet at machine 0's address, and none was given: pass the "
                        "address the other machines reach machine 0 at (the same on every machine)")
    return problems


def plan_from_environment() -> LaunchPlan:
    """The plan of a process a launcher started, read from the variables accelerate and torchrun set."""
    env = os.environ
    world = int(env.get("WORLD_SIZE") or env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE") or 1)
    distributed = sharding_launched() or ("MULTI_GPU" if world > 1 else "NO")
    stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    here = int(env.get("LOCAL_WORLD_SIZE") or world)  # torchrun's processes on this machine
    return LaunchPlan(num_processes=world, distributed=distributed, zero_stage=int(stage) if stage else None,
                      mixed_precision=env.get("ACCELERATE_MIXED_PRECISION", "no"), source="the launcher",
                      launched=True, num_machines=max(1, world // here), machine_rank=int(env.get("GROUP_RANK") or 0),
                      main_process_ip=env.get("MASTER_ADDR"))


# ---------------------------------------------------------------- what cannot work


def check(recipe: Recipe, plan: LaunchPlan) -> list[str]:
    """Every reason this recipe cannot train as planned, each a `key: what, why, what to do` sentence."""
    problems = []
    n, t = plan.num_processes, recipe.training
    if t.batch_size % n:
        problems.append(f"training.batch_size: {t.batch_size} examples per step do not split evenly over {n} "
                        f"processes ({plan.source}): set it to a multiple of {n}, each process then takes "
                        f"batch_size / {n}")
    quantized = recipe.model.quantization != "none"
    # QLoRA under FSDP: 4-bit weights stored in the training dtype (bnb_4bit_quant_storage, models/loading.py) are
    # floating tensors FSDP can shard; 8-bit weights are int8 tensors with their scales beside them, which it can't.
    fsdp_qlora = plan.distributed == "FSDP" and recipe.model.quantization == "4bit"
    if quantized and plan.shards_parameters and not fsdp_qlora:
        how = "FSDP" if plan.distributed == "FSDP" else "DeepSpeed ZeRO-3"
        also = " (4-bit weights can: set model.quantization to 4bit)" if plan.distributed == "FSDP" else ""
        problems.append(f"model.quantization: {recipe.model.quantization} (bitsandbytes) weights cannot be sharded "
                        f"across processes, which {how} ({plan.source}) does to every weight{also}: use DDP "
                        "(--num-processes N or recipes/accelerate/ddp.yaml) or DeepSpeed ZeRO-2, or set "
                        "model.quantization to none")
    if fsdp_qlora and not _has_cuda():
        # On 2 CPU processes the first step's gradient norm came out infinite in 4 of 10 runs, with FSDP's
        # reshard after forward on or off (bitsandbytes' CPU 4-bit path under FSDP2, not found further; one process
        # with the same storage trains normally, and the other 6 runs finished).
        problems.append(f"model.quantization: 4bit under FSDP ({plan.source}) trains on GPUs only; on CPU processes "
                        "its first gradients come out infinite in some runs: use DDP (--num-processes N) for 4-bit on "
                        "the CPU, or set model.quantization to none for FSDP")
    if plan.mixed_precision != "no":  # (auto is resolved, importing torch, only when there is something to compare)
        from hftoolkit.job.machine import resolve_precision
        from hftoolkit.sources.checkpoint import model_type_of

        # Before the relaunch nothing is loaded: a local checkpoint's type is read from its files, a hub id's not.
        precision = resolve_precision(t.precision, model_type_of(recipe.model.checkpoint, recipe.model.gguf_file))
        wanted = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}[precision]
        if plan.mixed_precision != wanted:
            auto = "" if t.precision == precision else f" (auto picks {precision} on this machine)"
            problems.append(f"training.precision: {precision} disagrees with mixed_precision "
                            f"{plan.mixed_precision!r} of {plan.source}{auto}: set mixed_precision: 'no' in the "
                            "config (the recipe's training.precision decides)")
    if plan.distributed == "DEEPSPEED" and not plan.launched and not _installed("deepspeed"):
        problems.append(f"{plan.source} uses DeepSpeed, which is not installed: pip install "
                        "'hftoolkit[deepspeed]', or use ddp.yaml or fsdp.yaml")
    elif plan.distributed == "DEEPSPEED" and not _has_cuda():
        problems += _deepspeed_cpu_precision(recipe, plan)
    return problems


def _deepspeed_cpu_precision(recipe: Recipe, plan: LaunchPlan) -> list[str]:
    """DeepSpeed's CPU processes keep TrainingArguments' use_cpu off (training/zero.py), and transformers then
    refuses bf16 and fp16: said here in one line instead of its traceback from every process."""
    from hftoolkit.job.machine import resolve_precision
    from hftoolkit.sources.checkpoint import model_type_of

    t = recipe.training
    precision = resolve_precision(t.precision, model_type_of(recipe.model.checkpoint, recipe.model.gguf_file))
    if precision == "fp32":
        return []
    auto = f" (auto picks {precision} on this machine)" if t.precision != precision else ""
    return [f"training.precision: {precision}{auto} under DeepSpeed ({plan.source}) on CPU processes is refused by "
            "transformers without a GPU: set training.precision: fp32, or use fsdp.yaml or ddp.yaml"]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def what_ran(trainer, precision: str) -> dict:
    """How the run was spread, as accelerate resolved it (manifest.json's "distributed"): its type, the processes
    and machines, what was sharded, the precision, and each process's device. A collective call: every process."""
    import os

    from accelerate.utils import gather_object

    state = trainer.accelerator.state
    kind = state.distributed_type.name
    asked = sharding_launched()
    if asked and kind != asked:  # never trained as plain DDP while the config says otherwise
        raise UserError(f"the launch asked for {asked}, but accelerate set the processes up as {kind}: this "
                        "combination of machine and libraries is not supported; use --num-processes N for DDP")
    stage = getattr(getattr(state, "deepspeed_plugin", None), "zero_stage", None)
    sharding = "FSDP" if kind == "FSDP" else f"ZeRO-{stage}" if kind == "DEEPSPEED" else None
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or state.num_processes)  # (torchrun's processes per machine)
    devices = gather_object([str(state.device)]) if state.num_processes > 1 else [str(state.device)]
    return {"type": kind, "processes": state.num_processes, "machines": max(1, state.num_processes // local),
            "sharding": sharding, "precision": precision, "devices": devices}


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------- relaunching


def launch_command(plan: LaunchPlan, argv: list[str], cuda: bool) -> tuple[list[str], dict[str, str]]:
    """`accelerate launch` (through training/launcher.py) of `hftoolkit <argv minus the launch options>`, and the
    environment to give it."""
    cmd = [sys.executable, "-m", "hftoolkit.training.launcher"]
    if plan.config is not None:
        cmd += ["--config_file", str(plan.config)]
    cmd += ["--num_processes", str(plan.num_processes)]
    if plan.config is None:
        cmd += ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
    elif plan.distributed == "MULTI_CPU" and plan.num_processes > 1:
        # accelerate 1.15 starts a MULTI_CPU config's processes only through mpirun; torchrun does it
        # too, and ACCELERATE_USE_CPU below keeps each process on the CPU with gloo.
        cmd += ["--multi_gpu"]
    if plan.num_machines > 1:  # as resolved from the options and the config, which they override
        cmd += ["--num_machines", str(plan.num_machines), "--machine_rank", str(plan.machine_rank),
                "--main_process_ip", str(plan.main_process_ip), "--main_process_port", str(plan.main_process_port)]
    elif plan.main_process_port is None:  # port 0: a free one, so that runs on one machine never share a port
        cmd += ["--num_machines", "1", "--main_process_port", "0"]
    cmd += ["-m", "hftoolkit", *strip_launch_options(argv)]
    env = {**os.environ, COMMAND_VARIABLE: json.dumps(["hftoolkit", *argv]), PARENT_VARIABLE: str(os.getpid())}
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets for several processes, without its banner
    if not cuda:  # (a DeepSpeed process drops it again for DeepSpeed's CPU accelerator: training/zero.py)
        env["ACCELERATE_USE_CPU"] = "true"  # without it the processes look for GPUs (and each thinks it is rank 0)
    return cmd, env


def strip_launch_options(argv: list[str]) -> list[str]:
    """argv without --num-processes and --accelerate-config (the relaunched processes must not relaunch)."""
    return _split_launch_options(argv)[0]


def launch_options(argv: list[str]) -> list[str]:
    """The launch options of argv (--num-processes N, --accelerate-config FILE, the machines'), as typed."""
    return _split_launch_options(argv)[1]


def _split_launch_options(argv: list[str]) -> tuple[list[str], list[str]]:
    rest, options, taking = [], [], False
    for arg in argv:
        if taking:
            options.append(arg)
            taking = False
        elif arg in LAUNCH_OPTIONS:
            options.append(arg)
            taking = True
        elif arg.startswith(tuple(f"{o}=" for o in LAUNCH_OPTIONS)):
            options.append(arg)
        else:
            rest.append(arg)
    return rest, options


def relaunch(plan: LaunchPlan, argv: list[str], run_dir: Path | None = None) -> int:
    """Run the training processes under accelerate's launcher; returns their exit status.

    The launcher starts in a session of its own and this process hands it the stop signals it gets (a closed
    terminal, Ctrl-C, a scheduler's SIGTERM), once; the training processes end with the launcher, and it with this
    process (training/launcher.py). A failed launch is said in one line: the reason that explains the others
    (processes.first_reason). What the launcher logged is appended to the run's train.log.
    """
    import tempfile

    import torch

    from hftoolkit.training.launcher import LOG_NAME

    cuda = torch.cuda.is_available()
    here = plan.num_processes // plan.num_machines
    if cuda and plan.config is None and here > torch.cuda.device_count():
        raise UserError(f"--num-processes {plan.num_processes}: this machine has {torch.cuda.device_count()} GPU(s), "
                        "one process each: lower --num-processes, or spread them with --num-machines")
    cmd, env = launch_command(plan, argv, cuda)
    where = f" of {plan.num_processes} on machine {plan.machine_rank}" if plan.num_machines > 1 else ""
    print(f"launching {here} process{'es' if here > 1 else ''}{where}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="hftoolkit-launch-") as reasons:
        process = subprocess.Popen(cmd, env={**env, REASONS_VARIABLE: reasons}, start_new_session=True)
        status, stopped = _wait_passing_signals(process)
        _keep_log(Path(reasons) / LOG_NAME, run_dir)
        reason = None if stopped or status == 0 else (
            first_reason(reasons) or f"the launch ended with exit status {status} and no training process said why: "
                                     "see the lines above, and the run directory's train.log if it has one")
    if stopped is not None:  # (the main training process has said where the run stopped)
        stop = Stopped(stopped)
        stop.said = True
        raise stop
    if reason is not None:
        error = UserError(reason)
        error.exit_code = status
        raise error
    return status


def _wait_passing_signals(process: subprocess.Popen) -> tuple[int, int | None]:
    """Wait for `process`, handing it the first stop signal this process gets; (its exit status, that signal)."""
    import signal

    stopped = []

    def hand_on(signum, frame):
        if not stopped and process.poll() is None:
            process.send_signal(signum)
        stopped.append(signum)

    previous = {sig: signal.signal(sig, hand_on) for sig in STOP_SIGNALS}
    try:
        return process.wait(), (stopped[0] if stopped else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _keep_log(log: Path, run_dir: Path | None) -> None:
    """The launcher's log, appended to the run's train.log (when the run wrote one)."""
    if run_dir is not None and log.is_file() and log.stat().st_size and (Path(run_dir) / "train.log").is_file():
        with open(Path(run_dir) / "train.log", "a", encoding="utf-8") as out:
            out.write("\n--- the launcher (accelerate launch, torchrun) ---\n" + log.read_text(errors="replace"))


def end_processes() -> None:
    """Wait for every process, then close the process group.

    Closing it explicitly matters on gloo: left to interpreter exit, its threads sometimes
    abort the process (SIGABRT, seen in about 2 of 5 two-process CPU runs).
    """
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
