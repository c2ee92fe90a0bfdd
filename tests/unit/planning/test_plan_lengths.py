"""The lengths a step is planned at (planning/lengths.py): a batch's padded length under each order, and train's
plan at the data's lengths rather than the recipe's."""

from __future__ import annotations

import json

import pytest

import hftoolkit.planning.lengths as plan_lengths
from hftoolkit.planning.lengths import padded
from tests.helpers import RECIPES, train_recipe


def test_random_batches_pad_to_the_expected_longest_of_their_rows():
    lengths = [10] * 99 + [100]
    # a batch of 32 holds the one long row with probability 1 - (99/100)^32, and pads every row to it then
    assert padded(lengths, 32, "random") == pytest.approx(10 + 90 * (1 - 0.99**32))
    assert padded(lengths, 1, "random") == pytest.approx(sum(lengths) / 100), "a row alone pads nothing"
    assert padded([7] * 50, 8, "random") == 7


def test_sorted_batches_pad_to_their_own_longest_and_a_packed_batch_pads_nothing():
    lengths = list(range(1, 65))
    assert padded(lengths, 8, "group_by_length") == pytest.approx(sum(range(8, 65, 8)) / 8)
    assert padded(lengths, 8, "packed") == pytest.approx(32.5)
    assert padded(lengths, 8, "packed") < padded(lengths, 8, "group_by_length") < padded(lengths, 8, "random")


def test_training_draws_from_its_formulation_s_rows_a_packed_text_s_blocks_not_its_documents():
    """A causal LM's documents packed into blocks of data.max_length are as many rows as their blocks: the plan's
    steps count those, scaled from the sample where the split was too large to tokenize whole."""
    from types import SimpleNamespace

    from hftoolkit.planning.lengths import SAMPLE_ROWS, trained_rows

    def job(rows: int):
        return SimpleNamespace(data={"train": range(rows)})

    assert trained_rows(job(1350), range(455)) == 455, "1,350 documents in 455 blocks"
    assert trained_rows(job(1350), range(1350)) == 1350, "a row per example"
    assert trained_rows(job(10_000), range(2 * SAMPLE_ROWS)) == 20_000, "two blocks a sampled document"
    assert trained_rows(job(1350), None) == 1350, "no sample: the split's rows"


def _planned(tmp_path, recipe: str, *sets: str) -> dict:
    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    train_recipe(RECIPES / recipe, run, "training.max_steps=1", *sets)
    return json.loads((run / "manifest.json").read_text())["plan"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe, lengths", [
    ("encoder-classification.yaml", ("data.max_length=64", "data.max_length=256")),
    ("seq2seq-translation-t5.yaml", ("data.max_length=64", "data.max_length=256")),
])
def test_train_plans_a_step_at_the_data_s_lengths_whatever_the_recipe_allows(tmp_path, recipe, lengths):
    short, long = (_planned(tmp_path, recipe, length) for length in lengths)
    assert short["planned_lengths"]["step"] == long["planned_lengths"]["step"], \
        "the builtin set's rows are shorter than 64 tokens"
    assert 0 < short["planned_lengths"]["step"]["max_length"] < 64
    # (the builtin sets are tokenized whole: no batch is longer than their longest row)
    assert short["planned_lengths"]["memory"] == long["planned_lengths"]["memory"]
    assert short["planned_lengths"]["step"]["max_length"] <= long["planned_lengths"]["memory"]["max_length"] < 64
    assert short["planned_peak_mb"] == long["planned_peak_mb"]


@pytest.mark.slow
def test_memory_is_planned_at_the_recipe_s_lengths_where_the_split_is_too_large_to_tokenize_whole(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.setattr(plan_lengths, "WHOLE_SPLIT_ROWS", 16)
    monkeypatch.setattr(plan_lengths, "SAMPLE_ROWS", 16)
    short, long = (_planned(tmp_path, "encoder-classification.yaml", f"data.max_length={n}") for n in (64, 256))
    assert long["planned_lengths"]["memory"]["max_length"] == 256, "a sample's longest bounds no batch"
    assert short["planned_peak_mb"] < long["planned_peak_mb"], "memory is planned at what a batch can reach"


@pytest.mark.slow
def test_a_denoising_run_is_planned_at_its_longest_text_and_clean_target(tmp_path):
    """BART's noised input is the text less the masked spans' tokens: neither reaches the recipe's 96 tokens."""
    planned = _planned(tmp_path, "seq2seq-denoise.yaml")
    memory, step = planned["planned_lengths"]["memory"], planned["planned_lengths"]["step"]
    assert step["max_length"] <= memory["max_length"] < 96
    assert step["max_target_length"] <= memory["max_target_length"] < 96
    assert memory["max_length"] <= memory["max_target_length"] + 2, "masking only shortens a text"


def test_a_grpo_step_is_planned_at_its_prompts_tokens_padded_as_its_batch_s_prompts_pad(tmp_path):
    """TRL samples each prompt's answers after the prompt, left-padded to the longest of the step's prompts: the
    arithmetic questions are a few tokens, whatever data.max_length allows."""
    planned = _planned(tmp_path, "decoder-grpo.yaml", "data.max_length=256")
    memory, step = planned["planned_lengths"]["memory"], planned["planned_lengths"]["step"]
    assert 0 < step["max_length"] <= memory["max_length"] < 64
    assert planned["planned_step_items_s"]["sampling"] > 0


@pytest.mark.slow
def test_a_prompted_decoder_step_is_planned_at_its_rows_with_logits_at_their_answers(tmp_path):
    planned = _planned(tmp_path, "decoder-preference.yaml", "task=instruction", "preference=null",
                       "data.train=builtin:instructions",
                       "data.max_length=200", "data.max_target_length=200")["planned_lengths"]["step"]
    assert 0 < planned["max_target_length"] < planned["max_length"] + planned["max_target_length"] < 400
