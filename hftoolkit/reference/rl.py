"""Reward learning and online RL from their papers: the Bradley-Terry reward loss, GRPO's and RLOO's advantages,
the clipped surrogate with its KL term, and the ways a token loss is averaged.

Conventions follow TRL's RewardTrainer, GRPOTrainer and RLOOTrainer (proven equal in parity_rl.py): rewards of the
G completions of a prompt sit next to each other (row i belongs to group i // G), per-token tensors are
(B, T) over the completion only, and `mask` is 1 on a completion's tokens and 0 on its padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hftoolkit.reference.preference import PairRewards

SCALINGS = ("group", "batch", "none")
AGGREGATIONS = ("grpo", "bnpo", "dr_grpo", "dapo")
STD_EPS = 1e-4  # TRL adds it to the std; it keeps a group of equal rewards at advantage 0 instead of 0 / 0


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_coefficient: float | None = None,
) -> torch.Tensor:
    """-log sigma(r(x, y_c) - r(x, y_r) - m): the reward model's ranking loss, per pair (the batch loss is its mean).

    The Bradley-Terry model P(y_c > y_r) = sigma(r_c - r_r) (Bradley & Terry 1952) trained by maximum likelihood,
    as Ouyang et al. 2022 (InstructGPT) eq. 1; the margin m(r) per pair is Touvron et al. 2023 (Llama 2) eq. 2:
    a pair rated far apart must be separated by more. center_coefficient adds c * (r_c + r_r)^2 (Eisenstein et
    al. 2023), which pins the rewards' mean near 0; TRL's `center_rewards_coefficient`.
    """
    gap = chosen - rejected if margin is None else chosen - rejected - margin
    loss = -F.logsigmoid(gap)
    if center_coefficient is not None:
        loss = loss + center_coefficient * (chosen + rejected) ** 2
    return loss


def ranking_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pairwise accuracy, mean margin) of a reward model's scores: the share of pairs ranked right, mean r_c - r_r.

    The two measurements DPO's implicit rewards are logged with (preference.PairRewards); as in TRL, the margin
    reported is r_c - r_r, with no pair's required margin m subtracted.
    """
    pairs = PairRewards(chosen.detach(), rejected.detach())
    return pairs.accuracy.mean(), pairs.margin.mean()


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be one flat tensor of whole groups of {group_size}; got {tuple(rewards.shape)}")
    return rewards.view(-1, group_size)  # (prompts, G)


def _std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The sample standard deviation (Bessel-corrected, as TRL's nanstd); 0 where a single value has none."""
    count = values.numel() if dim is None else values.shape[dim]
    if count < 2:
        return torch.zeros_like(values.sum() if dim is None else values.sum(dim))
    return values.std() if dim is None else values.std(dim=dim)


def group_relative_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """GRPO's outcome advantage A_i = (r_i - mean(r)) / std(r) over the G completions of one prompt.

    Shao et al. 2024 (DeepSeekMath), section 4.1.2: one advantage per completion, given to each of its tokens.
    `scale` is TRL's scale_rewards: "group" divides by the group's std (the paper), "batch" by the std of every
    reward in the batch (the centring stays per group), "none" does not divide (Liu et al. 2025, Dr. GRPO:
    the std weights a question by how hard it is). rewards is (prompts * G,), groups contiguous.
    """
    if scale not in SCALINGS:
        raise ValueError(f"scale must be one of {SCALINGS}; got {scale!r}")
    grouped = _groups(rewards, group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "none":
        return centred
    std = _std(grouped, dim=1).repeat_interleave(group_size) if scale == "group" else _std(rewards)
    return centred / (std + STD_EPS)


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int, normalize: bool = False) -> torch.Tensor:
    """RLOO: A_i = r_i - 1/(G-1) * sum_{j != i} r_j, the mean of the other completions of the prompt as baseline.

    Ahmadian et al. 2024 ("Back to Basics: Revisiting REINFORCE Style Optimization ..."), the RLOO estimator
    (after Kool et al. 2019): the baseline leaves the sample out, so it does not depend on the sample it judges.
    normalize=True then standardises over the whole batch (TRL's normalize_advantages). A group of one has no
    other sample: its advantage is 0.
    """
    grouped = _groups(rewards, group_size)
    if group_size < 2:
        advantages = torch.zeros_like(rewards)
    else:
        baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (prompts, G): the others' mean
        advantages = (grouped - baseline).reshape(-1)
    if normalize:
        advantages = (advantages - advantages.mean()) / (_std(advantages) + STD_EPS)
    return advantages


def kl_penalized_rewards(
    rewards: torch.Tensor, logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """r(x, y) - beta * log(pi(y|x) / pi_ref(y|x)): RLOO's KL penalty, folded into the reward before the baseline.

    Ahmadian et al. 2024 (RLOO) optimise the KL-regularised RLHF reward of a whole sequence: its log-ratio is the
    sum of the per-token ones (k1, which can be negative, unlike GRPO's k3), under the policy that sampled. It is
    part of the reward, a measurement: detached, as TRL computes it under no_grad. logps, ref_logps are (B, T).
    """
    return rewards - beta * ((logps - ref_logps) * mask).sum(dim=-1).detach()


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) ~ pi_ref/pi - log(pi_ref/pi) - 1: Shao et al. 2024, eq. 4 (Schulman 2020's k3).

    Unbiased under samples of pi and never negative, unlike log(pi / pi_ref) itself.
    """
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def token_log_ratio(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """log pi(o_t) / pi_old(o_t) per token (B, T): the importance ratio of PPO and GRPO (Shao et al. 2024, eq. 3)."""
    return logps - old_logps


def sequence_log_ratio(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log s_i = 1/|y_i| * sum_t log pi(y_t) / pi_old(y_t): GSPO's sequence ratio, one per sequence (B, 1).

    Zheng et al. 2025 (GSPO), section 4.1: s_i = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|), the length-normalised
    likelihood ratio, so every token of a sequence is clipped together. An empty completion counts as length 1.
    """
    return (((logps - old_logps) * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).unsqueeze(-1)


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float = 0.2, epsilon_high: float | None = None
) -> torch.Tensor:
    """-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), the loss to minimise, per token (or per sequence).

    PPO's clipped objective (Schulman et al. 2017, eq. 7) as GRPO uses it (Shao et al. 2024, eq. 3), with DAPO's
    clip-higher (Yu et al. 2025, section 3.1): a larger eps_high lets unlikely tokens with A > 0 rise further.
    log_ratio is (B, T), GSPO's (B, 1) or a sequence's (B,); advantages (B,) are one per sequence.
    """
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    ratio = torch.exp(log_ratio)
    if advantages.dim() < log_ratio.dim():
        advantages = advantages.unsqueeze(-1)  # (B, 1): every token of a sequence shares its advantage
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(ratio * advantages, clipped * advantages)


def aggregate(
    per_token_loss: torch.Tensor, mask: torch.Tensor, how: str = "grpo", max_completion_length: int | None = None
) -> torch.Tensor:
    """One scalar from per-token losses (B, T), as TRL's loss_type names the choice.

    "grpo": each sequence's mean over its tokens, then the mean over sequences (Shao et al. 2024, eq. 3's
    1/G sum_i 1/|o_i| sum_t): a token of a short completion weighs more. "bnpo" and "dapo": the sum over every
    token / the number of tokens (DAPO's token-level loss, Yu et al. 2025, section 3.3; TRL's two differ only in
    which batch counts the tokens, which here is this one). "dr_grpo": the sum / (B * max_completion_length), a
    constant, so that the length does not rescale the gradient (Liu et al. 2025, Dr. GRPO).
    """
    if how not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}; got {how!r}")
    masked = per_token_loss * mask  # a (B, 1) sequence-level loss broadcasts over the tokens here
    if how == "grpo":
        return (masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).mean()
    if how == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo divides by batch * max_completion_length: pass max_completion_length")
        return masked.sum() / (masked.shape[0] * max_completion_length)
    return masked.sum() / mask.sum().clamp(min=1)


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    importance: str = "token",
    aggregation: str = "grpo",
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """GRPO's loss, -J_GRPO of Shao et al. 2024 eq. 3: the clipped surrogate plus beta * the k3 KL, per token, then
    aggregated. importance="sequence" is GSPO (Zheng et al. 2025); the KL term stays per token either way.

    logps, old_logps, ref_logps and mask are (B, T) over the completions; advantages (B,).
    """
    if importance == "token":
        log_ratio = token_log_ratio(logps, old_logps)
    elif importance == "sequence":
        log_ratio = sequence_log_ratio(logps, old_logps, mask)
    else:
        raise ValueError(f"importance must be 'token' or 'sequence'; got {importance!r}")
    per_token = clipped_surrogate(log_ratio, advantages, epsilon_low, epsilon_high)
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps, the reference model's per-token log-probs")
        per_token = per_token + beta * k3_kl(logps, ref_logps)
    return aggregate(per_token, mask, aggregation, max_completion_length)


def rloo_loss(
    logps: torch.Tensor,
    old_sequence_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
) -> torch.Tensor:
    """RLOO's policy loss as TRL's RLOOTrainer runs it: the clipped surrogate on each whole sequence, then the mean.

    The ratio is pi(y|x) / pi_old(y|x) of the summed log-probs (no length normalisation, unlike GSPO), since RLOO
    treats a completion as one action (Ahmadian et al. 2024); on-policy (ratio 1) this is REINFORCE with the
    leave-one-out baseline, the clip only matters when a batch is reused. old_sequence_logps is (B,).
    """
    log_ratio = (logps * mask).sum(dim=-1) - old_sequence_logps  # (B,)
    return clipped_surrogate(log_ratio, advantages, epsilon_low, epsilon_high).mean()
