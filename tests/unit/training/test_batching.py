"""The batch order: length buckets for training (reproducible by seed and epoch; one kind of example a batch where
length follows the kind), eval shortest first."""

from __future__ import annotations

import random

import pytest

from hftoolkit.evaluation.evaluate import shortest_first
from hftoolkit.training.batching import LengthBucketSampler

BATCH = 32


@pytest.fixture(scope="session")
def lengths():
    """1,000 lengths skewed short like SST-2 phrases (3 to 64 tokens): 31 full batches and one of 8."""
    rng = random.Random(0)
    return [min(64, 3 + int(rng.expovariate(1 / 10))) for _ in range(1000)]


def padding(order: list[int], lengths: list[int]) -> float:
    batches = [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
    total = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1 - sum(lengths) / total


def test_every_example_once_in_an_order_fixed_by_seed_and_epoch(lengths):
    sampler = LengthBucketSampler(lengths, BATCH, seed=0)
    first = list(sampler)
    assert sorted(first) == list(range(len(lengths)))
    assert list(sampler) == first, "a resumed run must see the same batches"
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(second) == sorted(first) and second != first, "each epoch draws a new order"
    assert list(LengthBucketSampler(lengths, BATCH, seed=1)) != first


def test_batches_pad_as_little_as_a_full_sort_far_less_than_transformers_megabatches(lengths):
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    ours = padding(list(LengthBucketSampler(lengths, BATCH, seed=0)), lengths)
    floor = padding(sorted(range(len(lengths)), key=lambda i: -lengths[i]), lengths)
    theirs = padding(get_length_grouped_indices(lengths, BATCH, generator=torch.Generator().manual_seed(0)), lengths)
    assert ours == pytest.approx(floor) and ours < theirs / 3, (ours, floor, theirs)


def test_longest_batch_first_short_batch_last_and_batches_shuffled(lengths):
    order = list(LengthBucketSampler(lengths, BATCH, seed=0))
    assert max(lengths[i] for i in order[:BATCH]) == max(lengths), "out of memory shows at step 1"
    assert sorted(lengths[i] for i in order[-8:]) == sorted(lengths)[:8], "the short batch stays last"
    longest = [max(lengths[i] for i in order[s:s + BATCH]) for s in range(BATCH, len(order) - 8, BATCH)]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True), "batches come in random order"


def test_length_buckets_hold_one_kind_where_length_follows_the_kind_and_random_batches_both():
    """Why random order is the default: short labels and long passages sorted by length never meet in a batch."""
    rng = random.Random(1)
    kinds = [rng.randrange(2) for _ in range(2000)]
    lengths = [rng.randint(3, 12) if kind == 0 else rng.randint(30, 60) for kind in kinds]

    def mixed_share(order):
        batches = [order[i:i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH)]
        return sum(len({kinds[i] for i in b}) == 2 for b in batches) / len(batches)

    shuffled = list(range(len(lengths)))
    rng.shuffle(shuffled)
    assert mixed_share(list(LengthBucketSampler(lengths, BATCH, seed=0))) < 0.05
    assert mixed_share(shuffled) == 1.0


def test_shortest_first_returns_the_order_that_maps_results_back():
    from datasets import Dataset

    data = Dataset.from_dict({"text": ["a b c", "a", "a b"], "length": [3, 1, 2]})
    ordered, order = shortest_first(data)
    assert ordered["length"] == [1, 2, 3]
    assert [ordered["text"][i] for i in order.argsort()] == data["text"]
    images = Dataset.from_dict({"label": [0, 1]})
    assert shortest_first(images) == (images, None)
