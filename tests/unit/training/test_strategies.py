"""How a run is spread has one home: the launch is read in strategies/launch.py, turned into one strategy object
(training/strategies/), put on the Job, and asked from there."""

from __future__ import annotations

import re

import pytest

from tests.helpers import RECIPES, ROOT

PACKAGE = ROOT / "hftoolkit"
HOME = (PACKAGE / "training" / "strategies", PACKAGE / "patches")
# What reads the launch back: accelerate's variables, and the Trainer's own flags (the rank variables: base/ranks.py).
LAUNCH_READS = re.compile(r"ACCELERATE_USE_(FSDP|DEEPSPEED|\{)|ACCELERATE_DEEPSPEED_|FSDP_CPU|"
                          r"is_fsdp_enabled|is_deepspeed_enabled|distributed_type|sharding_launched")
# The rank variables torchrun and mpirun set, named as a string: read in base/ranks.py only.
RANK_READS = re.compile(r"[\"'](LOCAL_RANK|RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|OMPI_COMM_WORLD_\w+|PMI_\w+)"
                        r"[\"']")


def _outside_home():
    return [p for p in PACKAGE.rglob("*.py") if not any(home in p.parents for home in HOME)]


def test_no_module_but_the_strategies_reads_the_launch():
    readers = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in _outside_home()
               for m in LAUNCH_READS.finditer(p.read_text(encoding="utf-8"))]
    assert readers == []


def test_no_module_but_base_ranks_reads_the_rank_variables():
    readers = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in PACKAGE.rglob("*.py")
               if p != PACKAGE / "base" / "ranks.py" for m in RANK_READS.finditer(p.read_text(encoding="utf-8"))]
    assert readers == []


def test_the_strategy_classes_are_named_only_by_their_table():
    """A new strategy is one module and one line in STRATEGIES: nothing else imports a strategy's module."""
    named = re.compile(r"strategies\.(single|ddp|fsdp|zero) import|\b(Single|DDP|FSDP|ZeRO2|ZeRO3)\(")
    users = [str(p.relative_to(PACKAGE)) for p in _outside_home() if named.search(p.read_text(encoding="utf-8"))]
    assert users == []


@pytest.mark.parametrize("config, name, shards", [
    (None, "single", False), ("cpu-2proc.yaml", "ddp", False), ("ddp.yaml", "ddp", False),
    ("fsdp.yaml", "fsdp", True), ("deepspeed-zero2.yaml", "zero2", False), ("deepspeed-zero3.yaml", "zero3", True)])
def test_each_launch_config_makes_its_strategy(config, name, shards):
    from hftoolkit.training.strategies import strategy_for
    from hftoolkit.training.strategies.launch import plan_from_config

    strategy = strategy_for(plan_from_config(RECIPES / "accelerate" / config if config else None, None))
    assert (strategy.name, strategy.shards_parameters) == (name, shards)


def test_the_accelerate_config_is_the_options_then_the_recipes_each_named_as_given():
    """train and plan choose the launch config alike: --accelerate-config over training.accelerate_config, and an
    error names the one that was used."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training.strategies.launch import plan_from_options

    zero3, fsdp = RECIPES / "accelerate" / "deepspeed-zero3.yaml", RECIPES / "accelerate" / "fsdp.yaml"
    plain = load_recipe(RECIPES / "encoder-classification.yaml", [])
    named = load_recipe(RECIPES / "encoder-classification.yaml", [f"training.accelerate_config={zero3}"])
    assert plan_from_options(plain, None, 3).source == "--num-processes"
    assert (plan_from_options(plain, None, 3).num_processes, plan_from_options(plain, None, 3).config) == (3, None)
    assert plan_from_options(named, None, None).source == f"training.accelerate_config {zero3}"
    assert plan_from_options(named, fsdp, None).source == f"--accelerate-config {fsdp}"
    assert (plan_from_options(named, None, None).distributed, plan_from_options(named, fsdp, None).distributed) == (
        "DEEPSPEED", "FSDP")


def test_a_launched_process_reads_its_strategy_from_the_launchers_variables(monkeypatch):
    from hftoolkit.training.strategies import strategy_for
    from hftoolkit.training.strategies.launch import current_launch

    for variable, value in (("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2"), ("ACCELERATE_USE_DEEPSPEED", "true"),
                            ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3"), ("GROUP_RANK", "1")):
        monkeypatch.setenv(variable, value)
    strategy = strategy_for(current_launch())
    assert (strategy.name, strategy.processes, strategy.launch.num_machines) == ("zero3", 4, 2)
    assert strategy.sharding == "DEEPSPEED" and strategy.shards_parameters and not strategy.can_skip_nonfinite
    assert strategy.launch.machine_rank == 1


@pytest.mark.parametrize("variables, rank, world, main", [
    ({}, 0, 1, True),
    ({"RANK": "3", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"}, 3, 4, False),  # torchrun's first
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, 0, 2, True),  # mpirun (Open MPI)
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "RANK": ""}, 1, 2, False),  # MPICH; an empty variable is not set
])
def test_every_reader_of_the_rank_reads_it_the_same_way(monkeypatch, tmp_path, variables, rank, world, main):
    """The console's main-process test, the launch read back and a failed process's reason agree on the rank."""
    import json

    from hftoolkit.base import ranks
    from hftoolkit.base.lifecycle import REASONS_VARIABLE, record_reason
    from hftoolkit.training.strategies.launch import plan_from_environment, this_process

    for name in (*ranks.RANK_VARIABLES, *ranks.WORLD_SIZE_VARIABLES, "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(REASONS_VARIABLE, str(tmp_path))
    assert (ranks.rank(), ranks.world_size(), ranks.is_main_process()) == (rank, world, main)
    assert this_process().rank == rank and plan_from_environment().num_processes == world
    assert record_reason("boom")
    assert [json.loads(p.read_text())["rank"] for p in tmp_path.glob("*.json")] == [rank]


def test_copies_of_the_shared_embedding_become_the_module_itself_only_where_they_compute_the_same():
    from transformers import BartConfig, BartForConditionalGeneration

    from hftoolkit.training.strategies.fsdp import one_module_per_shared_embedding

    model = BartForConditionalGeneration(BartConfig(d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=64,
                                                    encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                                    decoder_attention_heads=2, scale_embedding=True))
    shared = model.get_input_embeddings()
    model.model.decoder.embed_tokens.embed_scale = 2.0  # (another scale: it computes something else)
    one_module_per_shared_embedding(model)
    assert model.model.encoder.embed_tokens is shared and model.model.decoder.embed_tokens is not shared
    assert model.model.decoder.embed_tokens.weight is shared.weight and model.lm_head.weight is shared.weight
