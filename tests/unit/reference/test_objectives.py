"""Objectives: the MLM 80/10/10 rates, BART's noising statistics, and the loss formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers

from hftoolkit.reference import objectives
from hftoolkit.reference.parity_training import mlm_batch, mlm_rates, word_level_tokenizer

# P(chosen), P([MASK] | chosen), P(another token | chosen), P(unchanged | chosen); a random token
# equals the original one time in 100 (vocabulary of 100), which moves 0.001 from "another" to "unchanged".
NOMINAL = torch.tensor([0.15, 0.8, 0.1 * 0.99, 0.1 + 0.1 * 0.01], dtype=torch.float64)
RATE_TOLERANCE = 0.01  # about 30,000 chosen tokens: 0.01 is over 4 standard errors of every rate


def test_reference_mlm_rates_are_15_80_10_10():
    ids = mlm_batch(11)
    generator = torch.Generator().manual_seed(0)
    inputs, labels = objectives.mlm_mask(ids, 4, 100, special_tokens_mask=ids < 5, generator=generator)
    rates = mlm_rates(ids, inputs, labels, 4)
    assert (rates - NOMINAL).abs().max() < RATE_TOLERANCE, f"rates {rates.tolist()} vs nominal {NOMINAL.tolist()}"


def test_collator_mlm_rates_are_15_80_10_10_too():
    ids = mlm_batch(12)
    batch = transformers.DataCollatorForLanguageModeling(word_level_tokenizer(), mlm_probability=0.15, seed=0)(
        [{"input_ids": row} for row in ids.tolist()]
    )
    rates = mlm_rates(ids, batch["input_ids"], batch["labels"], 4)
    assert (rates - NOMINAL).abs().max() < RATE_TOLERANCE


def test_mlm_never_chooses_special_tokens_and_labels_only_chosen_ones():
    ids = mlm_batch(13)[:50]
    inputs, labels = objectives.mlm_mask(ids, 4, 100, special_tokens_mask=ids < 5)
    special = ids < 5
    assert (labels[special] == -100).all() and torch.equal(inputs[special], ids[special])
    chosen = labels != -100
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])


def test_text_infilling_masks_30_percent_in_poisson_spans_one_mask_each():
    tokens = torch.arange(10, 1010)  # 1,000 distinct tokens, mask id 0
    noised, lengths = objectives.text_infilling(tokens, 0, generator=torch.Generator().manual_seed(0))
    assert sum(lengths) == math.ceil(0.3 * 1000)  # exactly 30% of the tokens go
    assert int((noised == 0).sum()) == len(lengths)  # each span, whatever its length, is one mask
    kept = noised[noised != 0]
    assert kept.numel() == 1000 - sum(lengths)
    assert torch.all(kept[1:] > kept[:-1])  # the surviving tokens keep their order
    assert 2.5 < sum(lengths[:-1]) / len(lengths[:-1]) < 3.5  # Poisson(3) mean, the last span cut to fit


def test_zero_length_spans_insert_a_mask():
    generator = torch.Generator().manual_seed(0)
    lengths = objectives.draw_span_lengths(30_000, 3.0, generator)
    assert 0 in lengths  # P(0) = e^-3, about 5%
    noised, spans = objectives.text_infilling(torch.arange(1, 201), 0, generator=torch.Generator().manual_seed(3))
    assert len(noised) == 200 - sum(spans) + len(spans)


def test_sentence_permutation_shuffles_whole_sentences_uniformly():
    full_stop = 99
    doc = torch.tensor([1, 2, full_stop, 3, full_stop, 4, 5, 6, full_stop])
    sentences = {(1, 2, 99), (3, 99), (4, 5, 6, 99)}
    generator = torch.Generator().manual_seed(0)
    seen: dict[tuple[int, ...], int] = {}
    for _ in range(3000):
        out = objectives.sentence_permutation(doc, full_stop, generator)
        assert sorted(out.tolist()) == sorted(doc.tolist())
        seen[tuple(out.tolist())] = seen.get(tuple(out.tolist()), 0) + 1
    assert len(seen) == 6  # all 3! orders
    assert all(abs(count / 3000 - 1 / 6) < 0.03 for count in seen.values())
    first = objectives.sentence_permutation(doc, full_stop, generator).tolist()
    assert any(tuple(first[: len(s)]) == s for s in sentences)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_label_smoothing_matches_torch(smoothing):
    logits, target = torch.randn(20, 7), torch.randint(7, (20,))
    ours = objectives.label_smoothed_cross_entropy(logits, target, smoothing)
    assert torch.allclose(ours, F.cross_entropy(logits, target, label_smoothing=smoothing), atol=1e-6)


def test_causal_lm_loss_scores_position_t_against_token_t_plus_1():
    vocab = 5
    labels = torch.tensor([[1, 2, 3]])
    logits = torch.full((1, 3, vocab), -20.0)
    logits[0, 0, 2] = logits[0, 1, 3] = 20.0  # a perfect next-token predictor
    assert objectives.causal_lm_loss(logits, labels) < 1e-6
    unshifted = logits.clone()
    unshifted[0, 0, 2], unshifted[0, 0, 1] = -20.0, 20.0  # predicting the current token instead
    assert objectives.causal_lm_loss(unshifted, labels) > 10
