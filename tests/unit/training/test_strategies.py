"""How a run is spread has one home: the launch is read in strategies/launch.py, turned into one strategy object
(training/strategies/), put on the Job, and asked from there."""

from __future__ import annotations

import re

import pytest

from tests.helpers import RECIPES, ROOT

PACKAGE = ROOT / "hftoolkit"
HOME = (PACKAGE / "training" / "strategies", PACKAGE / "patches")
# What reads the launch back: accelerate's and torchrun's variables, and the Trainer's own flags.
LAUNCH_READS = re.compile(r"ACCELERATE_USE_(FSDP|DEEPSPEED|\{)|ACCELERATE_DEEPSPEED_|FSDP_CPU|LOCAL_WORLD_SIZE|"
                          r"GROUP_RANK|is_fsdp_enabled|is_deepspeed_enabled|distributed_type|sharding_launched")


def _outside_home():
    return [p for p in PACKAGE.rglob("*.py") if not any(home in p.parents for home in HOME)]


def test_no_module_but_the_strategies_reads_the_launch():
    readers = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in _outside_home()
               for m in LAUNCH_READS.finditer(p.read_text(encoding="utf-8"))]
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


def test_a_launched_process_reads_its_strategy_from_the_launchers_variables(monkeypatch):
    from hftoolkit.training.strategies import strategy_for
    from hftoolkit.training.strategies.launch import current_launch

    for variable, value in (("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2"), ("ACCELERATE_USE_DEEPSPEED", "true"),
                            ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3"), ("GROUP_RANK", "1")):
        monkeypatch.setenv(variable, value)
    strategy = strategy_for(current_launch())
    assert (strategy.name, strategy.processes, strategy.launch.num_machines) == ("zero3", 4, 2)
    assert strategy.sharding == "DEEPSPEED" and strategy.shards_parameters and not strategy.can_skip_nonfinite


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
