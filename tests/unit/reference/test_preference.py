"""Preference losses: what a reader of the DPO, IPO, ORPO and KTO papers would check of reference/preference.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hftoolkit.reference import objectives, preference


def four_logps(n: int = 6) -> tuple[torch.Tensor, ...]:
    """policy chosen, policy rejected, reference chosen, reference rejected: summed log-probs, float64."""
    return tuple(-10 - 50 * torch.rand(n, dtype=torch.float64) for _ in range(4))


# --- sequence log-probs --------------------------------------------------------------------------


def test_sequence_logps_scores_only_the_completion_and_shifts_by_one():
    logits = torch.randn(2, 6, 11)
    labels = torch.randint(11, (2, 6))
    labels[:, :3] = -100  # a three-token prompt
    full = preference.sequence_logps(logits, labels)
    moved = logits.clone()
    moved[:, 0] += 5 * torch.randn(11)  # position 0 predicts token 1, a prompt token: not scored
    assert torch.allclose(preference.sequence_logps(moved, labels), full)
    moved[:, 2] += 5 * torch.randn(11)  # position 2 predicts token 3, the first completion token
    assert not torch.allclose(preference.sequence_logps(moved, labels), full)


def test_sequence_logps_is_minus_the_causal_lm_loss_times_the_token_count():
    logits, labels = torch.randn(1, 8, 13), torch.randint(13, (1, 8))
    labels[0, :2] = -100
    tokens = int((labels[:, 1:] != -100).sum())
    expected = -objectives.causal_lm_loss(logits, labels) * tokens
    assert torch.allclose(preference.sequence_logps(logits, labels), expected.reshape(1), atol=1e-5)
    average = preference.sequence_logps(logits, labels, average=True)
    assert torch.allclose(average, expected.reshape(1) / tokens, atol=1e-6)


# --- DPO -----------------------------------------------------------------------------------------


def test_dpo_loss_is_log_2_when_the_policy_is_the_reference():
    chosen, rejected, _, _ = four_logps()
    loss = preference.dpo_loss(chosen, rejected, chosen, rejected, beta=0.1)
    assert torch.allclose(loss, torch.full_like(loss, math.log(2)))


def test_dpo_gradient_raises_the_chosen_and_lowers_the_rejected_log_prob():
    chosen, rejected, ref_chosen, ref_rejected = four_logps()
    chosen.requires_grad_(True)
    rejected.requires_grad_(True)
    preference.dpo_loss(chosen, rejected, ref_chosen, ref_rejected).sum().backward()
    assert (chosen.grad < 0).all()  # descent moves against the gradient: chosen goes up
    assert (rejected.grad > 0).all()  # and rejected goes down
    assert torch.allclose(chosen.grad, -rejected.grad)  # one logit, beta * h, drives both


def test_dpo_loss_is_minus_log_sigmoid_of_the_reward_margin():
    logps = four_logps()
    rewards = preference.implicit_rewards(*logps, beta=0.5)
    assert torch.allclose(preference.dpo_loss(*logps, beta=0.5), -F.logsigmoid(rewards.margin))


def test_reward_accuracy_counts_pairs_whose_chosen_reward_is_higher():
    chosen = torch.tensor([-1.0, -5.0, -3.0])
    rejected = torch.tensor([-2.0, -4.0, -3.0])  # higher, lower, a tie
    zeros = torch.zeros(3)
    rewards = preference.implicit_rewards(chosen, rejected, zeros, zeros, beta=0.1)
    assert rewards.accuracy.tolist() == [1.0, 0.0, 0.0]  # a tie is not a win
    assert torch.allclose(rewards.margin, torch.tensor([0.1, -0.1, 0.0]))


def test_rewards_are_detached():
    chosen = torch.tensor([-3.0], requires_grad=True)
    rewards = preference.implicit_rewards(chosen, chosen, torch.zeros(1), torch.zeros(1), beta=0.1)
    assert not rewards.chosen.requires_grad


# --- IPO -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.1, 0.5, 2.0])
def test_ipo_minimum_is_zero_at_h_equal_one_over_two_tau(tau):
    h = torch.linspace(-2 / tau, 3 / tau, 5001, dtype=torch.float64)
    zeros = torch.zeros_like(h)
    loss = preference.ipo_loss(h, zeros, zeros, zeros, tau=tau)  # log-ratio h on the chosen side only
    target = 1 / (2 * tau)
    assert abs(float(h[loss.argmin()]) - target) < 1e-3 / tau
    at_target = preference.ipo_loss(torch.tensor([target]), *[torch.zeros(1)] * 3, tau=tau)
    assert float(at_target) == pytest.approx(0.0, abs=1e-12)


def test_ipo_penalizes_overshooting_the_target_where_dpo_keeps_rewarding_it():
    tau = 0.1
    h = torch.tensor([1 / (2 * tau), 2 / (2 * tau)], requires_grad=True)  # on the target, then past it
    zeros = torch.zeros(2)
    ipo = preference.ipo_loss(h, zeros, zeros, zeros, tau=tau)
    dpo = preference.dpo_loss(h, zeros, zeros, zeros, beta=tau)
    assert ipo[1] > ipo[0]  # IPO pulls h back to 1/(2 tau) ...
    assert dpo[1] < dpo[0]  # ... DPO's loss still falls: its optimum is h -> infinity


def test_ipo_per_token_form_divides_each_log_ratio_by_its_length():
    logps = four_logps()
    lengths_c, lengths_r = torch.randint(1, 40, (6,)), torch.randint(1, 40, (6,))
    per_token = preference.ipo_loss(*logps, tau=0.1, chosen_lengths=lengths_c, rejected_lengths=lengths_r)
    chosen, rejected, ref_chosen, ref_rejected = logps
    manual = preference.ipo_loss((chosen - ref_chosen) / lengths_c, (rejected - ref_rejected) / lengths_r,
                                 torch.zeros(6), torch.zeros(6), tau=0.1)
    assert torch.allclose(per_token, manual)
    ones = torch.ones(6, dtype=torch.long)
    assert torch.allclose(preference.ipo_loss(*logps, chosen_lengths=ones, rejected_lengths=ones),
                          preference.ipo_loss(*logps))  # length 1: the paper's form
    with pytest.raises(ValueError, match="both"):
        preference.ipo_loss(*logps, chosen_lengths=ones)


# --- ORPO ----------------------------------------------------------------------------------------


def test_log_odds_of_probability_one_half_is_zero_and_matches_the_definition():
    p = torch.tensor([0.5, 0.1, 0.9, 0.999], dtype=torch.float64)
    assert torch.allclose(preference.log_odds(p.log()), (p / (1 - p)).log())
    assert float(preference.log_odds(torch.tensor(math.log(0.5)))) == pytest.approx(0.0, abs=1e-12)


def test_log_odds_stays_accurate_in_float32_when_p_is_near_one():
    mean_logp = torch.tensor([-1e-6, -1e-9])  # P within 1e-6 of 1: exp() rounds to 1 in float32
    exact = preference.log_odds(mean_logp.double())
    ours = preference.log_odds(mean_logp)
    assert torch.isfinite(ours).all()
    assert torch.allclose(ours.double(), exact, rtol=1e-5)


def test_odds_ratio_loss_is_log_2_for_identical_completions():
    mean_logps = -3 * torch.rand(5, dtype=torch.float64)
    loss = preference.odds_ratio_loss(mean_logps, mean_logps)
    assert torch.allclose(loss, torch.full_like(loss, math.log(2)))
    nll = torch.tensor(1.7, dtype=torch.float64)
    assert float(preference.orpo_loss(nll, mean_logps, mean_logps, lam=0.25)) == pytest.approx(1.7 + 0.25 * math.log(2))


def test_odds_ratio_gradient_raises_chosen_and_lowers_rejected_and_needs_no_reference():
    chosen = (-0.5 - torch.rand(4, dtype=torch.float64)).requires_grad_(True)
    rejected = (-0.5 - torch.rand(4, dtype=torch.float64)).requires_grad_(True)
    preference.odds_ratio_loss(chosen, rejected).sum().backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()


# --- KTO -----------------------------------------------------------------------------------------


def test_kto_reference_point_is_the_mean_log_ratio_clamped_at_zero_and_detached():
    policy = torch.tensor([-10.0, -12.0], requires_grad=True)
    assert float(preference.kto_reference_point(policy, torch.tensor([-11.0, -12.0]))) == pytest.approx(0.5)
    z0 = preference.kto_reference_point(policy, torch.tensor([-9.0, -11.0]))  # mean log-ratio -1
    assert float(z0) == 0.0
    assert not z0.requires_grad  # no gradient flows through the reference point


def test_kto_desirable_loss_falls_and_undesirable_loss_rises_with_the_log_ratio():
    r = torch.linspace(-5, 5, 11, dtype=torch.float64)
    zeros = torch.zeros_like(r)
    z0 = torch.tensor(0.7, dtype=torch.float64)
    good = preference.kto_loss(r, zeros, torch.ones(11, dtype=torch.bool), z0, beta=0.5)
    bad = preference.kto_loss(r, zeros, torch.zeros(11, dtype=torch.bool), z0, beta=0.5)
    assert (good.diff() < 0).all() and (bad.diff() > 0).all()


def test_kto_loss_is_half_of_lambda_at_the_reference_point():
    z0 = torch.tensor(1.5, dtype=torch.float64)
    r = torch.full((2,), 1.5, dtype=torch.float64)  # r equals z0: sigma(0) = 1/2
    desirable = torch.tensor([True, False])
    loss = preference.kto_loss(r, torch.zeros(2, dtype=torch.float64), desirable, z0, desirable_weight=1.0,
                               undesirable_weight=1.33)
    assert torch.allclose(loss, torch.tensor([0.5, 0.665], dtype=torch.float64))
