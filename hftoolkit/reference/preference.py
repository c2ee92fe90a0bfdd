"""Preference-tuning losses from their papers: DPO, IPO, ORPO and KTO, on sequence log-probabilities.

Every loss takes log pi(y|x) of whole completions (`sequence_logps`), summed or averaged over
the completion's tokens, and returns one loss per pair (or per example for KTO), unreduced.
TRL's trainers are the library they are proven equal to (parity_preference.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hftoolkit.reference.objectives import IGNORE_INDEX


def sequence_logps(
    logits: torch.Tensor, labels: torch.Tensor, average: bool = False, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """log pi(y|x) = sum_t log p(y_t | x, y_<t) over the labelled tokens; logits (B, T, V), labels (B, T) unshifted.

    The prompt and padding carry ignore_index, so only the completion counts. With average=True the
    sum is divided by the number of completion tokens (the per-token mean IPO's length form and ORPO use).
    """
    predictions = logits[:, :-1].log_softmax(dim=-1)  # (B, T-1, V): position t predicts token t + 1
    targets = labels[:, 1:]  # (B, T-1)
    keep = targets != ignore_index
    picked = predictions.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)  # (B, T-1); -100 -> any id, dropped
    total = (picked * keep).sum(dim=-1)
    return total / keep.sum(dim=-1) if average else total


@dataclass(frozen=True)
class PairRewards:
    """DPO's implicit rewards r = beta * log(pi / pi_ref), per pair, and what trainers log from them."""

    chosen: torch.Tensor
    rejected: torch.Tensor

    @property
    def accuracy(self) -> torch.Tensor:
        return (self.chosen > self.rejected).to(self.chosen.dtype)  # 1 where the chosen one is ranked first

    @property
    def margin(self) -> torch.Tensor:
        return self.chosen - self.rejected


def implicit_rewards(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> PairRewards:
    """r(x, y) = beta * log(pi(y|x) / pi_ref(y|x)): Rafailov et al. 2023, eq. 5 without its beta * log Z(x).

    log Z(x) depends on the prompt only, so it cancels within a pair. Rewards are measurements, not
    part of the graph: detached, as trainers log them.
    """
    return PairRewards(
        beta * (policy_chosen - ref_chosen).detach(), beta * (policy_rejected - ref_rejected).detach()
    )


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
) -> torch.Tensor:
    """DPO, Rafailov et al. 2023, eq. 7: -log sigma(beta * [log pi(y_w)/pi_ref(y_w) - log pi(y_l)/pi_ref(y_l)]).

    Inputs are summed completion log-probs, one per pair; returns the per-pair loss (the paper's
    expectation is its mean).
    """
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * h)


def ipo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    tau: float = 0.1,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """IPO, Azar et al. 2023 ("A General Theoretical Paradigm ..."), eq. 17: (h - 1/(2 tau))^2, per pair.

    h = log[pi(y_w) pi_ref(y_l) / (pi(y_l) pi_ref(y_w))]. Without lengths this is the paper's form on
    summed log-probs. With chosen_lengths and rejected_lengths (completion token counts) each log-ratio
    is first divided by its completion's length, the per-token form TRL uses (its DPOTrainer says the
    paper's reported results correspond to it): summed log-ratios grow with length, and the squared
    loss would make tau mean something different for long and short completions.
    """
    chosen_ratio, rejected_ratio = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    if (chosen_lengths is None) != (rejected_lengths is None):
        raise ValueError("Pass both chosen_lengths and rejected_lengths, or neither.")
    if chosen_lengths is not None:
        chosen_ratio = chosen_ratio / chosen_lengths.clamp(min=1)  # an empty completion counts as one token
        rejected_ratio = rejected_ratio / rejected_lengths.clamp(min=1)
    h = chosen_ratio - rejected_ratio
    return (h - 1 / (2 * tau)) ** 2


def log_odds(mean_logps: torch.Tensor) -> torch.Tensor:
    """log odds(y|x) = log(P / (1 - P)) = log P - log(1 - P), with P = exp(mean per-token log-prob) as in ORPO.

    log(1 - P) is computed as log(-expm1(log P)): log1p(-exp(log P)) loses its digits when P is
    near 1, where exp(log P) rounds to 1 before the subtraction.
    """
    return mean_logps - torch.log(-torch.expm1(mean_logps))


def odds_ratio_loss(chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor) -> torch.Tensor:
    """L_OR = -log sigma(log[odds(y_w|x) / odds(y_l|x)]): Hong et al. 2024 (ORPO), eq. 7, per pair.

    Inputs are the mean per-token log-probs of the completions (the paper's length-normalized P(y|x)).
    """
    return -F.logsigmoid(log_odds(chosen_mean_logps) - log_odds(rejected_mean_logps))


def orpo_loss(
    chosen_nll: torch.Tensor, chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor, lam: float = 0.1
) -> torch.Tensor:
    """L_ORPO = L_SFT + lambda * L_OR: Hong et al. 2024, eq. 6, as a batch mean.

    chosen_nll is L_SFT, the causal-LM loss on the chosen sequences (a scalar); no reference model.
    """
    return chosen_nll + lam * odds_ratio_loss(chosen_mean_logps, rejected_mean_logps).mean()


def kto_reference_point(policy_kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's z0 = KL(pi(y'|x) || pi_ref(y'|x)), estimated on mismatched (x, y') pairs of the batch.

    Ethayarajh et al. 2024, section 4.1: the mean log-ratio over the batch, clamped at 0 (a KL
    is not negative, the estimate can be) and detached: the paper does not backpropagate through z0.
    """
    return (policy_kl_logps - ref_kl_logps).mean().clamp(min=0).detach()


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    z0: torch.Tensor,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """KTO, Ethayarajh et al. 2024 (the loss of section 4.1, eq. 7 in the version TRL cites): lambda_y - v(x, y).

    r = log pi(y|x)/pi_ref(y|x); v = lambda_D sigma(beta (r - z0)) for a desirable y and
    lambda_U sigma(beta (z0 - r)) for an undesirable one. Unpaired: one loss per example, in order;
    `desirable` is a bool tensor of the same length.
    """
    r = policy_logps - ref_logps
    weight = torch.full_like(r, undesirable_weight).masked_fill(desirable, desirable_weight)  # lambda_y, in r's dtype
    value = torch.sigmoid(beta * torch.where(desirable, r - z0, z0 - r))
    return weight * (1 - value)  # lambda_y - lambda_y * sigma(...) = lambda_y - v(x, y)
