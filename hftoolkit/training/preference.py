"""Preference tuning (task preference) through TRL: its DPO trainer under the toolkit's Trainer mixins, its
config from the recipe's preference section, and its metrics under the names hftoolkit reports.

The pairs arrive tokenized by the formulation (models/families/preference.py) in TRL's own layout, so TRL's
tokenization is skipped. With LoRA the reference is the base with the adapter switched off (one copy of the
weights); with full fine-tuning TRL keeps a frozen copy. ORPO has no reference: its loss is TRL's own (from its
experimental ORPO trainer, whose separate data pipeline hftoolkit does not need) on the DPO trainer's batches.
KTO learns answers labelled good or bad, one at a time, with TRL's KTO trainer.
"""

from __future__ import annotations

from hftoolkit.job.spec import Job

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

    class PreferenceTrainer(KTOTrainer if method == "kto" else DPOTrainer, RenamedMetrics):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # TRL copies an adapter it is handed into a frozen "ref" adapter, the reference for an adapter trained
            # earlier. This run's adapter starts at zero (an earlier run's is merged into the base as it loads),
            # and a finished run is scored against its base: the base with the adapter switched off is that
            # reference, without a second adapter (nor its saved copy).
            if "ref" in (getattr(self.model, "peft_config", None) or {}):
                self.model.delete_adapter("ref")

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            # Tokenized already, in TRL's layout (prompt_ids, chosen_ids and rejected_ids; kto: completion_ids and
            # label). KTO estimates its KL term from mismatched answers, each batch's rotated by one, as TRL does,
            # but over the batch of all processes (TRL: of each), so that processes train as one process would.
            if method == "kto" and dataset_name == "train":  # (read in order: see arguments.batch_order)
                dataset = dataset.shuffle(seed=args.seed)
            if method == "kto" and self.calculate_KL:
                from accelerate import PartialState  # (the Trainer's accelerator is not built yet)

                batch = args.per_device_train_batch_size * PartialState().num_processes
                return dataset.map(lambda rows: {"KL_completion_ids": rows["completion_ids"][-1:]
                                                 + rows["completion_ids"][:-1]}, batched=True, batch_size=batch)
            return dataset

        def _precompute_ref_logps(self, dataset, name, batch_size):
            return dataset  # (asked for only by a method without a reference: there is nothing to compute)

        def _compute_loss(self, model, inputs, return_outputs):
            if method == "orpo":
                return orpo_loss(self, model, inputs)
            return super()._compute_loss(model, inputs, return_outputs)

        def create_model_card(self, *args, **kwargs):
            pass  # (the run directory's README.md is the toolkit's card, written once the run ends)

    return PreferenceTrainer


def orpo_loss(trainer, model, inputs):
    """ORPO (Hong et al. 2024) on a DPO batch (chosen rows, then rejected): the chosen completions' mean token NLL
    minus beta times the log-sigmoid of the odds ratio of their mean log-probabilities, TRL's odds-ratio loss. Its
    rewards, logged under DPO's names, are beta times the mean log-probabilities."""
    import warnings

    with warnings.catch_warnings():  # (its module warns on import that trl.experimental may change)
        warnings.simplefilter("ignore")
        from trl.experimental.orpo import ORPOTrainer

    completion = inputs["completion_mask"]
    mask = completion[:, 1:]  # (position t's log-probability is of token t + 1)
    labels = inputs["input_ids"].masked_fill(completion == 0, -100)
    model_inputs = {k: v for k, v in inputs.items() if k != "completion_mask"}
    outputs = model(**model_inputs, labels=labels, use_cache=False, fused_lm_head=True)
    token_logps = outputs.log_probs[:, -mask.size(1):] * mask
    chosen_tokens, _ = token_logps.chunk(2)
    chosen_mask, _ = mask.chunk(2)
    # The mean over the chosen tokens of every process's batch (gradients are averaged over processes), so that
    # processes splitting a batch train as one process would.
    tokens = trainer.accelerator.gather(chosen_mask.sum()).sum().clamp(min=1)
    nll = -chosen_tokens.sum() * trainer.accelerator.num_processes / tokens
    chosen, rejected = (token_logps.sum(1) / mask.sum(1).clamp(min=1)).chunk(2)
    losses, chosen_rewards, rejected_rewards, log_odds_ratio, _ = ORPOTrainer.odds_ratio_loss(trainer, chosen, rejected)
    mode, gather = "train" if trainer.model.training else "eval", trainer.accelerator.gather_for_metrics
    logged = {"rewards/chosen": chosen_rewards, "rewards/rejected": rejected_rewards,
              "rewards/accuracies": (chosen_rewards > rejected_rewards).float(),
              "rewards/margins": chosen_rewards - rejected_rewards, "logps/chosen": chosen.detach(),
              "logps/rejected": rejected.detach(), "nll_loss": nll.detach(), "log_odds_ratio": log_odds_ratio.detach()}
    for name, value in logged.items():
        trainer._metrics[mode][name].append(gather(value).mean().item())
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
