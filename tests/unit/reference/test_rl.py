"""Reward learning and online RL: what a reader of the Bradley-Terry, GRPO, RLOO, GSPO and DAPO papers would check
of reference/rl.py. Its equality with TRL's trainers is the "rl" group of the parity table, run by test_parity.py."""

from __future__ import annotations

import math

import pytest
import torch

from hftoolkit.reference import rl

G = 4


def rewards(prompts: int = 3) -> torch.Tensor:
    return torch.randn(prompts * G, dtype=torch.float64)


def ragged_mask(lengths: list[int], width: int = 6) -> torch.Tensor:
    return (torch.arange(width) < torch.tensor(lengths)[:, None]).double()


# --- the reward model ----------------------------------------------------------------------------


def test_bradley_terry_loss_is_log_2_for_a_tie_and_falls_as_the_chosen_pulls_ahead():
    tie = rl.bradley_terry_loss(torch.zeros(3), torch.zeros(3))
    assert torch.allclose(tie, torch.full((3,), math.log(2)))
    gaps = torch.tensor([-1.0, 0.0, 1.0, 4.0])
    losses = rl.bradley_terry_loss(gaps, torch.zeros(4))
    assert (losses.diff() < 0).all()
    assert torch.allclose(losses, torch.log1p(torch.exp(-gaps)))  # -log sigma(x) = log(1 + e^-x)


def test_a_margin_asks_the_chosen_to_lead_by_that_much():
    chosen, rejected = torch.tensor([2.0]), torch.tensor([1.0])
    at_the_margin = rl.bradley_terry_loss(chosen, rejected, margin=torch.tensor([1.0]))
    assert torch.allclose(at_the_margin, torch.tensor(math.log(2)))  # a lead of exactly the margin is a tie
    assert rl.bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5])) < math.log(2)


def test_centering_penalises_rewards_whose_sum_drifts_from_zero():
    chosen, rejected = torch.tensor([3.0]), torch.tensor([2.0])
    plain = rl.bradley_terry_loss(chosen, rejected)
    assert torch.allclose(rl.bradley_terry_loss(chosen, rejected, center_coefficient=0.01), plain + 0.01 * 25)
    assert torch.allclose(rl.bradley_terry_loss(chosen - 2.5, rejected - 2.5, center_coefficient=0.01), plain)


def test_ranking_metrics_count_the_pairs_ranked_right_and_average_the_gap():
    accuracy, margin = rl.ranking_metrics(torch.tensor([1.0, 2.0, 0.0, 5.0]), torch.tensor([0.0, 3.0, 0.0, 1.0]))
    assert accuracy == 0.5  # a tie is not ranked right
    assert margin == pytest.approx((1 - 1 + 0 + 4) / 4)


# --- advantages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", rl.SCALINGS)
def test_the_advantages_of_a_group_sum_to_zero(scale):
    advantages = rl.group_relative_advantages(rewards(), G, scale).view(-1, G)
    assert torch.allclose(advantages.sum(dim=1), torch.zeros(3, dtype=torch.float64), atol=1e-12)


def test_group_scaling_gives_each_group_unit_std_and_batch_scaling_one_divisor():
    r = rewards()
    grouped = rl.group_relative_advantages(r, G, "group").view(-1, G)
    assert torch.allclose(grouped.std(dim=1), torch.ones(3, dtype=torch.float64), atol=1e-3)  # the 1e-4 shrinks it
    centred = rl.group_relative_advantages(r, G, "none")
    assert torch.allclose(rl.group_relative_advantages(r, G, "batch"), centred / (r.std() + rl.STD_EPS))


@pytest.mark.parametrize("scale", rl.SCALINGS)
def test_a_group_of_equal_rewards_teaches_nothing(scale):
    r = rewards()
    r[:G] = 0.7
    zero = torch.zeros(G, dtype=torch.float64)
    assert torch.allclose(rl.group_relative_advantages(r, G, scale)[:G], zero, atol=1e-12)  # 0.7's mean rounds
    assert torch.allclose(rl.leave_one_out_advantages(r, G)[:G], zero, atol=1e-12)


def test_advantages_refuse_a_partial_group_or_an_unknown_scaling():
    with pytest.raises(ValueError, match="whole groups"):
        rl.group_relative_advantages(torch.randn(7), G)
    with pytest.raises(ValueError, match="scale must be one of"):
        rl.group_relative_advantages(torch.randn(8), G, scale="global")


def test_the_rloo_baseline_leaves_the_sample_itself_out():
    r = rewards(prompts=1)
    advantages = rl.leave_one_out_advantages(r, G)
    for i in range(G):
        others = torch.cat([r[:i], r[i + 1:]])
        assert advantages[i] == pytest.approx(float(r[i] - others.mean()))
    raised = r.clone()
    raised[0] += 1.0  # the sample's own reward moves its advantage one for one: it is not in its baseline
    assert rl.leave_one_out_advantages(raised, G)[0] == pytest.approx(float(advantages[0] + 1.0))
    assert torch.allclose(advantages, G / (G - 1) * (r - r.mean()))  # the same, as a rescaled group mean


def test_the_rloo_kl_penalty_lowers_the_reward_by_beta_times_the_summed_log_ratio():
    logps, ref = -torch.rand(2, 5, dtype=torch.float64), -torch.rand(2, 5, dtype=torch.float64)
    mask = ragged_mask([5, 2], width=5)
    r = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert torch.equal(rl.kl_penalized_rewards(r, logps, ref, mask, beta=0.0), r)
    expected = r - 0.1 * torch.stack([(logps[0] - ref[0]).sum(), (logps[1, :2] - ref[1, :2]).sum()])
    assert torch.allclose(rl.kl_penalized_rewards(r, logps, ref, mask, beta=0.1), expected)


# --- the clipped objective -----------------------------------------------------------------------


def test_within_the_clip_range_the_clipped_objective_is_the_unclipped_one():
    ratios = torch.tensor([0.81, 0.95, 1.0, 1.1, 1.27], dtype=torch.float64)  # inside [1 - 0.2, 1 + 0.28]
    advantages = torch.tensor([1.0, -2.0, 0.5, -1.0, 3.0], dtype=torch.float64)
    loss = rl.clipped_surrogate(ratios.log(), advantages, epsilon_low=0.2, epsilon_high=0.28)
    assert torch.allclose(loss, -ratios * advantages)


def test_outside_the_range_the_clip_stops_the_gradient_only_in_the_direction_of_the_advantage():
    log_ratio = torch.tensor([1.5, 1.5, 0.5, 0.5], dtype=torch.float64).log().requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    rl.clipped_surrogate(log_ratio, advantages, 0.2, 0.28).sum().backward()
    # ratio 1.5 with A > 0 and ratio 0.5 with A < 0 went far enough: clipped, no gradient; the other two are the
    # pessimistic side of the min and keep theirs
    assert log_ratio.grad[0] == 0 and log_ratio.grad[2] == 0
    assert log_ratio.grad[1] != 0 and log_ratio.grad[3] != 0


def test_clip_higher_lets_a_token_with_positive_advantage_rise_further():
    log_ratio = torch.tensor([1.25], dtype=torch.float64).log()
    one = torch.ones(1, dtype=torch.float64)
    assert rl.clipped_surrogate(log_ratio, one, 0.2) == -1.2  # symmetric: capped at 1 + 0.2
    assert torch.allclose(rl.clipped_surrogate(log_ratio, one, 0.2, 0.28), -torch.tensor([1.25], dtype=torch.float64))


def test_k3_kl_is_zero_at_the_reference_and_positive_elsewhere():
    logps = -torch.rand(50, dtype=torch.float64)
    assert torch.equal(rl.k3_kl(logps, logps), torch.zeros_like(logps))
    assert (rl.k3_kl(logps, logps + torch.randn(50, dtype=torch.float64)) >= 0).all()


def test_with_beta_zero_the_kl_term_vanishes():
    logps, old, ref = (-torch.rand(4, 6, dtype=torch.float64) for _ in range(3))
    mask, advantages = ragged_mask([6, 3, 1, 5]), torch.randn(4, dtype=torch.float64)
    without = rl.grpo_loss(logps, old, advantages, mask, ref, beta=0.0)
    assert without == rl.grpo_loss(logps, old, advantages, mask, ref - 5, beta=0.0)  # the reference is not read
    assert without == rl.aggregate(rl.clipped_surrogate(logps - old, advantages), mask)
    assert rl.grpo_loss(logps, old, advantages, mask, ref, beta=0.04) > without  # k3 > 0 adds to the loss


def test_gspo_has_one_ratio_per_sequence_the_mean_over_its_tokens():
    logps, old = -torch.rand(3, 6, dtype=torch.float64), -torch.rand(3, 6, dtype=torch.float64)
    mask = ragged_mask([6, 2, 4])
    ratio = rl.sequence_log_ratio(logps, old, mask)
    assert ratio.shape == (3, 1)
    assert ratio[1, 0] == pytest.approx(float((logps[1, :2] - old[1, :2]).mean()))
    moved = logps.clone()
    moved[1, 2:] += 3.0  # the padding of sequence 1
    assert torch.equal(rl.sequence_log_ratio(moved, old, mask), ratio)


# --- aggregation ---------------------------------------------------------------------------------


def test_dapo_and_grpo_aggregation_differ_when_lengths_differ_and_agree_when_equal():
    per_token = torch.rand(2, 6, dtype=torch.float64)
    ragged = ragged_mask([6, 1])
    assert rl.aggregate(per_token, ragged, "grpo") != pytest.approx(float(rl.aggregate(per_token, ragged, "dapo")))
    full = torch.ones(2, 6, dtype=torch.float64)
    assert rl.aggregate(per_token, full, "grpo") == pytest.approx(float(rl.aggregate(per_token, full, "dapo")))


def test_grpo_aggregation_weighs_a_short_sequence_token_more_than_dapo_does():
    per_token = torch.zeros(2, 6, dtype=torch.float64)
    per_token[1, 0] = 1.0  # the one token of the short sequence
    mask = ragged_mask([6, 1])
    assert rl.aggregate(per_token, mask, "grpo") == pytest.approx(0.5)  # its sequence's mean is 1, of 2 sequences
    assert rl.aggregate(per_token, mask, "dapo") == pytest.approx(1 / 7)  # one of 7 tokens


def test_dr_grpo_divides_by_a_constant_and_needs_the_length():
    per_token, mask = torch.rand(3, 6, dtype=torch.float64), ragged_mask([6, 2, 4])
    dapo = rl.aggregate(per_token, mask, "dapo")
    assert rl.aggregate(per_token, mask, "dr_grpo", max_completion_length=8) == pytest.approx(
        float(dapo * mask.sum() / (3 * 8)))
    with pytest.raises(ValueError, match="max_completion_length"):
        rl.aggregate(per_token, mask, "dr_grpo")

