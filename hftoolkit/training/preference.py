"""Preference tuning (task preference) through TRL: its DPO trainer under the toolkit's Trainer mixins, its
config from the recipe's preference section, and its metrics under the names hftoolkit reports.

The pairs arrive tokenized by the formulation (models/families/preference.py) in TRL's own layout, so TRL's
tokenization is skipped. With LoRA the reference is the base with the adapter switched off (one copy of the
weights); with full fine-tuning TRL keeps a frozen copy.
"""

from __future__ import annotations

from hftoolkit.job.spec import Job

# preference.method -> TRL's DPOConfig.loss_type.
LOSS_TYPES = {"dpo": "sigmoid", "ipo": "ipo"}
# TRL's metric names -> the toolkit's (metrics.json, the log history, the report).
METRIC_NAMES = {"rewards/accuracies": "reward_accuracy", "rewards/margins": "reward_margin",
                "rewards/chosen": "reward_chosen", "rewards/rejected": "reward_rejected",
                "logps/chosen": "logps_chosen", "logps/rejected": "logps_rejected"}
# TRL's other per-step measures, left out of what hftoolkit reports.
DROPPED = ("entropy", "num_tokens", "logits/chosen", "logits/rejected", "mean_token_accuracy")


def arguments_class(job: Job):
    """(TRL's DPOConfig, the keyword arguments it adds to the TrainingArguments hftoolkit sets)."""
    from trl import DPOConfig

    p = job.recipe.preference
    return DPOConfig, dict(beta=p.beta, loss_type=[LOSS_TYPES[p.method]],
                           max_length=job.max_length + job.max_target_length)


def trainer_base():
    """TRL's DPOTrainer taking the pairs as the formulation tokenized them, its metrics renamed as they are
    logged."""
    from transformers import Trainer
    from trl import DPOTrainer

    class RenamedMetrics(Trainer):
        """Between TRL's log (which adds its averaged metrics) and the Trainer's (which records them)."""

        def log(self, logs: dict, start_time: float | None = None) -> None:
            named = renamed(logs)
            logs.clear()  # (in place: Trainer.evaluate returns the dict it logged)
            logs.update(named)
            super().log(logs, start_time)

    class PreferenceTrainer(DPOTrainer, RenamedMetrics):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # TRL copies an adapter it is handed into a frozen "ref" adapter, the reference for an adapter trained
            # earlier. This run's adapter starts at zero, and a finished run is scored against its base: the base
            # with the adapter switched off is that reference, without a second adapter (nor its saved copy).
            if "ref" in (getattr(self.model, "peft_config", None) or {}):
                self.model.delete_adapter("ref")

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset  # (tokenized already, in TRL's layout: prompt_ids, chosen_ids, rejected_ids)

        def create_model_card(self, *args, **kwargs):
            pass  # (the run directory's README.md is the toolkit's card, written once the run ends)

    return PreferenceTrainer


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
