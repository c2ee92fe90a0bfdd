"""Decoding: beam search gives generate's sequences, and the pieces behave as their definitions say."""

from __future__ import annotations

import pytest
import torch

from hftoolkit.reference import decoding
from hftoolkit.reference.parity_models import beam_search_pair, gpt2_pair


@pytest.mark.parametrize("num_beams", [2, 5])
@pytest.mark.parametrize("length_penalty", [0.5, 1.5])
def test_beam_search_sequences_equal_generate(num_beams, length_penalty):
    ours, library = beam_search_pair(length_penalty, num_beams=num_beams, max_new_tokens=8)
    assert torch.equal(ours, library), f"reference {ours.tolist()} vs generate {library.tolist()}"


def test_length_penalty_changes_which_hypothesis_wins():
    """Otherwise the beam-search parity rows would not be testing the length normalisation."""
    short, _ = beam_search_pair(0.0)
    long, _ = beam_search_pair(2.0)
    assert not torch.equal(short, long)
    assert (long != -1).sum() > (short != -1).sum()  # a larger penalty exponent favours longer outputs


def test_one_beam_is_greedy():
    ours, _ = gpt2_pair(0.5)
    prompt = torch.tensor([5, 17, 42])
    with torch.no_grad():
        greedy = decoding.greedy_decode(ours, prompt[None], 6)[0]
        beam = decoding.beam_search(ours, prompt, num_beams=1, max_new_tokens=6)
    assert torch.equal(greedy, beam)


def test_top_k_keeps_exactly_k_tokens():
    logits = torch.randn(3, 50)
    kept = torch.isfinite(decoding.top_k_filter(logits, 7))
    assert (kept.sum(dim=-1) == 7).all()
    assert torch.equal(kept, logits >= logits.topk(7).values[:, -1:])


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = torch.isfinite(decoding.top_p_filter(probs.log(), 0.75))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.75 <= 0.8
    kept = torch.isfinite(decoding.top_p_filter(probs.log(), 0.01))
    assert kept.tolist() == [[True, False, False, False]]  # the top token always stays


def test_sampling_with_top_k_1_is_greedy():
    logits = torch.randn(4, 30)
    assert torch.equal(decoding.sample_next_token(logits, top_k=1), logits.argmax(dim=-1))
