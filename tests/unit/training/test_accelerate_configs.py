"""The launcher configs in recipes/accelerate/ load and launch the way `accelerate launch` reads them.

Every check goes through accelerate's own code (its config loader, its launch-argument
validation, its environment builders and plugins), so a key accelerate does not know or a
value it rejects fails here rather than on a GPU server. Nothing here imports transformers.
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

from tests.helpers import ROOT

CONFIG_DIR = ROOT / "recipes" / "accelerate"
CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))
EXPECTED = {"ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3", "multi-node", "cpu-2proc"}


def _ids(paths):
    return [str(p.relative_to(CONFIG_DIR)) for p in paths]


def _config(name: str) -> Path:
    return CONFIG_DIR / f"{name}.yaml"


def _launch_args(path: Path):
    """Parse and validate `accelerate launch --config_file PATH script.py` as the launcher does."""
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(path), "script.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    return args, defaults, mp_from_config


def _launch_env(path: Path) -> dict:
    """The environment accelerate would give each training process for this config."""
    args, defaults, mp_from_config = _launch_args(path)
    # Machine rank 0 checks that its port is free; other tests may hold 29500 right now.
    with mock.patch("accelerate.utils.launch.is_port_in_use", return_value=False):
        if args.use_deepspeed:
            fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
            args.deepspeed_fields_from_accelerate_config = ",".join(fields)
            _, env = prepare_deepspeed_cmd_env(args)
        else:
            env = prepare_multi_gpu_env(args)
    return env


def test_all_expected_configs_are_shipped():
    assert EXPECTED <= {p.stem for p in CONFIGS}, f"missing from {CONFIG_DIR}: {EXPECTED - {p.stem for p in CONFIGS}}"


@pytest.mark.parametrize("path", CONFIGS, ids=_ids(CONFIGS))
def test_loads_with_accelerates_loader(path):
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig)
    # A recipe's precision (fp16/bf16) decides mixed precision; a config that forced one
    # would silently override it for DeepSpeed and FSDP.
    assert config.mixed_precision == "no", f"{path.name}: set mixed_precision: 'no'; the recipe chooses precision"


@pytest.mark.parametrize("path", CONFIGS, ids=_ids(CONFIGS))
def test_starts_with_the_command_that_uses_it(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("# "), f"{path.name}: first line must be a comment with the command"
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    rel = path.relative_to(ROOT).as_posix()
    commands = [ln for ln in header if "hftoolkit train" in ln and rel in ln]
    assert commands, f"{path.name}: its leading comment gives no `hftoolkit train` command using {rel}"


@pytest.mark.parametrize("path", CONFIGS, ids=_ids(CONFIGS))
def test_accepted_by_accelerate_launch(path):
    args, defaults, _ = _launch_args(path)
    assert args.num_processes >= 2, f"{path.name}: a launcher config is for more than one process"
    assert args.num_processes % args.num_machines == 0, f"{path.name}: num_processes is the total over machines"
    env = _launch_env(path)
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"


@pytest.mark.parametrize("name", ["ddp", "multi-node"])
def test_ddp_configs_use_all_gpus_of_each_machine(name):
    config = load_config_from_file(str(_config(name)))
    assert config.distributed_type == DistributedType.MULTI_GPU
    assert config.gpu_ids == "all"
    assert not config.use_cpu


def test_fsdp_is_fsdp2_full_shard():
    path = _config("fsdp")
    config = load_config_from_file(str(path))
    assert config.distributed_type == DistributedType.FSDP
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_reshard_after_forward"] is True  # FSDP2's FULL_SHARD
    env = _launch_env(path)
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
    with mock.patch.dict(os.environ, env, clear=True):
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True
    assert plugin.state_dict_type.name == "FULL_STATE_DICT"
    assert plugin.cpu_offload.__class__.__name__ == "OffloadPolicy"  # no CPU offload
    # Transformer-block wrapping with no class list: the model's _no_split_modules decide.
    assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert plugin.transformer_cls_names_to_wrap is None
    assert plugin.activation_checkpointing is False
    # RAM-efficient loading: the main process reads the weights, the others receive them as they are sharded.
    # (accelerate launch refuses it without sync_module_states, which FSDP2 itself no longer reads.)
    assert env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true" and env["FSDP_SYNC_MODULE_STATES"] == "true"
    assert plugin.cpu_ram_efficient_loading is True


@pytest.mark.parametrize("name,stage", [("deepspeed-zero2", 2), ("deepspeed-zero3", 3)])
def test_deepspeed_stage_and_trainer_owned_values(name, stage):
    path = _config(name)
    config = load_config_from_file(str(path))
    assert config.distributed_type == DistributedType.DEEPSPEED
    assert config.deepspeed_config["zero_stage"] == stage
    # Left out so the Trainer fills them from the recipe; a fixed value that disagrees
    # with the recipe is a DeepSpeed config mismatch error at startup.
    for key in ("gradient_accumulation_steps", "gradient_clipping", "deepspeed_config_file"):
        assert key not in config.deepspeed_config, f"{path.name}: remove deepspeed_config.{key}"
    env = _launch_env(path)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    with mock.patch.dict(os.environ, env, clear=True):
        plugin = DeepSpeedPlugin()
    ds = plugin.deepspeed_config
    assert ds["zero_optimization"]["stage"] == stage
    assert ds["gradient_accumulation_steps"] == "auto"
    assert ds["gradient_clipping"] == "auto"
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "none"
    if stage == 3:
        assert plugin.zero3_init_flag is True
        assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_multi_node_is_two_machines_with_a_rendezvous():
    path = _config("multi-node")
    config = load_config_from_file(str(path))
    assert config.num_machines == 2
    assert config.machine_rank == 0
    assert config.main_process_ip and config.main_process_port
    assert config.num_processes % config.num_machines == 0
    assert config.num_processes > config.num_machines  # total over machines, not per machine
    args, _, _ = _launch_args(path)
    with mock.patch("accelerate.utils.launch.is_port_in_use", return_value=False):
        prepare_multi_gpu_env(args)
    assert int(args.nnodes) == 2
    assert int(args.nproc_per_node) == config.num_processes // 2
    assert args.node_rank == 0
    # Machine 1 is the same file with --machine-rank 1 (hftoolkit passes it to accelerate as --machine_rank 1).
    header = path.read_text(encoding="utf-8")
    for key in ("main_process_ip", "main_process_port", "machine_rank", "num_machines", "num_processes"):
        assert re.search(rf"^# .*\b{key}\b", header, re.M), f"multi-node.yaml: explain {key} in a comment"
    assert "--machine-rank 1" in header
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(path), "--machine_rank", "1", "script.py"])
    args, _, _ = _validate_launch_command(args)
    prepare_multi_gpu_env(args)  # machine 1 does not check the port
    assert args.node_rank == 1


def test_cpu_config_is_two_processes_on_the_cpu():
    config = load_config_from_file(str(_config("cpu-2proc")))
    assert config.use_cpu is True
    assert config.num_processes == 2
    assert config.num_machines == 1
    args, _, _ = _launch_args(_config("cpu-2proc"))
    # torchrun starts the processes (a MULTI_CPU config would start one without mpirun).
    assert args.multi_gpu and not args.cpu


PROBE = """
import torch
import torch.distributed as dist
from accelerate import Accelerator

accelerator = Accelerator()
total = torch.tensor([accelerator.process_index + 1.0])
dist.all_reduce(total)
print(f"PROBE rank={accelerator.process_index} world={accelerator.num_processes} "
      f"type={accelerator.distributed_type.value} backend={accelerator.state.backend} sum={total.item():g}",
      flush=True)
# Without this, gloo's threads sometimes abort the interpreter at exit (SIGABRT, rc != 0);
# a training script ends the same way (Trainer.end()).
accelerator.end_training()
"""


@pytest.mark.slow
def test_cpu_config_launches_two_communicating_processes(tmp_path):
    """Really launch with the shipped config: two ranks on gloo that can all-reduce."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch",
           "--config_file", str(_config("cpu-2proc")), str(probe)]
    result = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # Both ranks share one pipe, so their lines may interleave: find the reports anywhere.
    lines = sorted(re.findall(r"PROBE rank=\d+ world=\d+ type=\w+ backend=\w+ sum=[\d.]+", result.stdout))
    assert lines == [
        "PROBE rank=0 world=2 type=MULTI_CPU backend=gloo sum=3",
        "PROBE rank=1 world=2 type=MULTI_CPU backend=gloo sum=3",
    ], output[-4000:]


def test_configs_are_plain_yaml_mappings():
    for path in CONFIGS:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert isinstance(data, dict), path.name
        assert data.get("compute_environment") == "LOCAL_MACHINE", path.name
