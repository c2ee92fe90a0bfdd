"""Preference tuning (task preference) through TRL: its DPO trainer under the toolkit's Trainer mixins, its
config from the recipe's preference section, and its metrics under the names hftoolkit reports.

The pairs arrive tokenized by the formulation (models/families/preference.py) in TRL's own layout, so TRL's
tokenization is skipped (patches/trl_1_16.py holds every step into TRL's own code). With LoRA the reference is the
base with the adapter switched off (one copy of the weights); with full fine-tuning TRL keeps a frozen copy. ORPO
has no reference: its loss is TRL's own (from its experimental ORPO trainer, whose separate data pipeline hftoolkit
does not need) on the DPO trainer's batches. KTO learns answers labelled good or bad, one at a time, with TRL's
KTO trainer.
"""

from __future__ import annotations

from hftoolkit.job.spec import Job
from hftoolkit.patches import trl_1_16
from hftoolkit.sources.labels import IGNORE_INDEX

# preference.method -> TRL's DPOConfig.loss_type (ORPO's loss is computed here: it has none; KTO has its trainer).
LOSS_TYPES = {"dpo": "sigmoid", "ipo": "ipo"}
# TRL's metric names -> the toolkit's (metrics.json, the log history, the report).
METRIC_NAMES = {"rewards/accuracies": "reward_accuracy", "rewards/margins": "reward_margin",
                "rewards/chosen": "reward_chosen", "rewards/rejected": "reward_rejected",
                "logps/chosen": "logps_chosen", "logps/rejected": "logps_rejected"}
# TRL's other per-step measures, left out of what hftoolkit reports.
DROPPED = ("entropy", "num_tokens", "logits/chosen", "logits/rejected", "mean_token_accuracy")


def arguments_class(job: Job):
    """(TRL's DPOConfig or KTOConfig, the keyword arguments it adds to the TrainingArguments hftoolkit sets)."""
    p, lengths = job.recipe.preference, dict(max_length=job.max_length + job.max_target_length)
    if p.method == "kto":
        from trl import KTOConfig

        return KTOConfig, dict(beta=p.beta, desirable_weight=p.desirable_weight,
                               undesirable_weight=p.undesirable_weight, **lengths)
    from trl import DPOConfig

    # Without a reference, "precomputed" reference log-probabilities keep TRL from loading a copy of the model;
    # the trainer below skips their pass over the data.
    return DPOConfig, dict(beta=p.beta, loss_type=[LOSS_TYPES.get(p.method, "sigmoid")],
                           precompute_ref_log_probs=p.method not in LOSS_TYPES, **lengths)


def trainer_base(job: Job):
    """TRL's DPOTrainer (KTOTrainer for kto) taking the examples as the formulation tokenized them, its metrics
    renamed as they are logged; for ORPO, with TRL's odds-ratio loss in place of DPO's."""
    from transformers import Trainer
    from trl import DPOTrainer, KTOTrainer

    method = job.recipe.preference.method

    class RenamedMetrics(Trainer):
        """Between TRL's log (which adds its averaged metrics) and the Trainer's (which records them)."""

        def log(self, logs: dict, start_time: float | None = None) -> None:
            named = renamed(logs)
            logs.clear()  # (in place: Trainer.evaluate returns the dict it logged)
            logs.update(named)
            super().log(logs, start_time)

    class PreferenceTrainer(trl_1_16.TokenizedPreference, KTOTrainer if method == "kto" else DPOTrainer,
                            RenamedMetrics):
        loss_in_place = orpo_loss if method == "orpo" else None

        def create_model_card(self, *args, **kwargs):
            pass  # (the run directory's README.md is the toolkit's card, written once the run ends)

    return PreferenceTrainer


def orpo_loss(trainer, model, inputs):
    """ORPO (Hong et al. 2024) on a DPO batch (chosen rows, then rejected): the chosen completions' mean token NLL
    minus beta times the log-sigmoid of the odds ratio of their mean log-probabilities, TRL's odds-ratio loss. Its
    rewards, logged under DPO's names, are beta times the mean log-probabilities."""
    completion = inputs["completion_mask"]
    mask = completion[:, 1:]  # (position t's log-probability is of token t + 1)
    labels = inputs["input_ids"].masked_fill(completion == 0, IGNORE_INDEX)
    model_inputs = {k: v for k, v in inputs.items() if k != "completion_mask"}
    token_logps = trl_1_16.fused_log_probs(model, model_inputs, labels)[:, -mask.size(1):] * mask
    chosen_tokens, _ = token_logps.chunk(2)
    chosen_mask, _ = mask.chunk(2)
    # The mean over the chosen tokens of every process's batch (gradients are averaged over processes), so that
    # processes splitting a batch train as one process would.
    tokens = trainer.accelerator.gather(chosen_mask.sum()).sum().clamp(min=1)
    nll = -chosen_tokens.sum() * trainer.accelerator.num_processes / tokens
    chosen, rejected = (token_logps.sum(1) / mask.sum(1).clamp(min=1)).chunk(2)
    losses, chosen_rewards, rejected_rewards, log_odds_ratio, _ = trl_1_16.odds_ratio_loss(trainer, chosen, rejected)
    gather = trainer.accelerator.gather_for_metrics
    logged = {"rewards/chosen": chosen_rewards, "rewards/rejected": rejected_rewards,
              "rewards/accuracies": (chosen_rewards > rejected_rewards).float(),
              "rewards/margins": chosen_rewards - rejected_rewards, "logps/chosen": chosen.detach(),
              "logps/rejected": rejected.detach(), "nll_loss": nll.detach(), "log_odds_ratio": log_odds_ratio.detach()}
    for name, value in logged.items():
        trl_1_16.log_metric(trainer, name, gather(value).mean().item())
    return nll - losses.mean()


def renamed(logs: dict) -> dict:
    """`logs` with TRL's metric names replaced by the toolkit's (an eval_ prefix kept) and its other measures
    left out."""
    out = {}
    for key, value in logs.items():
        prefix = "eval_" if key.startswith("eval_") else ""
        name = key.removeprefix(prefix)
        if name in DROPPED:
            continue
        out[prefix + METRIC_NAMES.get(name, name)] = value
    return out
