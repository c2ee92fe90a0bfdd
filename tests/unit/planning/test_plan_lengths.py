"""The lengths a step is planned at (planning/lengths.py): a batch's padded length under each order, and train's
plan at the data's lengths rather than the recipe's."""

from __future__ import annotations

import json

import pytest

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


def _planned(tmp_path, recipe: str, *sets: str) -> dict:
    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    train_recipe(RECIPES / recipe, run, "training.max_steps=1", *sets)
    return json.loads((run / "manifest.json").read_text())["plan"]


@pytest.mark.parametrize("recipe, lengths", [
    ("encoder-classification.yaml", ("data.max_length=64", "data.max_length=256")),
    ("seq2seq-translation-t5.yaml", ("data.max_length=64", "data.max_length=256")),
])
def test_train_plans_a_step_at_the_data_s_lengths_whatever_the_recipe_allows(tmp_path, recipe, lengths):
    short, long = (_planned(tmp_path, recipe, length) for length in lengths)
    assert short["planned_lengths"]["step"] == long["planned_lengths"]["step"], \
        "the builtin set's rows are shorter than 64 tokens"
    assert 0 < short["planned_lengths"]["step"]["max_length"] < 64
    assert long["planned_lengths"]["memory"]["max_length"] == 256
    assert short["planned_peak_mb"] < long["planned_peak_mb"], "memory is planned at what a batch can reach"


def test_a_prompted_decoder_step_is_planned_at_its_rows_with_logits_at_their_answers(tmp_path):
    planned = _planned(tmp_path, "decoder-preference.yaml", "task=instruction", "preference=null",
                       "data.train=builtin:instructions",
                       "data.max_length=200", "data.max_target_length=200")["planned_lengths"]["step"]
    assert 0 < planned["max_target_length"] < planned["max_length"] + planned["max_target_length"] < 400
