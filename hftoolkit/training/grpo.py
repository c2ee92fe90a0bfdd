"""Online RL (task grpo) through TRL: its GRPO trainer (RLOO's for rl.method rloo) under the toolkit's checkpoint
and non-finite mixins, its config from the recipe's rl section.

rl.method picks TRL's loss: grpo, dapo and dr_grpo are its loss types of those names, gspo is grpo's loss with one
importance ratio per answer (importance_sampling_level "sequence"), rloo is TRL's RLOO trainer. training.batch_size
counts sampled answers (batch_size / num_generations prompts a step), as TRL's per-device batch does.

The reference for the KL term (rl.beta > 0): with LoRA, the base with the adapter switched off (TRL's copy of the
adapter into a "ref" adapter is deleted, as for preference tuning); with full fine-tuning, a frozen copy of the
loaded model (TRL would read the checkpoint again from its path, which a GGUF file, an installed checkpoint or
an earlier run's merged adapter does not give back).

Answers are sampled afresh every rl.num_iterations steps, and a checkpoint falls only there (recipe.py), so a run
resumed from one samples what the uninterrupted run did: TRL's sampler is seeded, and the Trainer restores the
random state of the step.
"""

from __future__ import annotations

from hftoolkit.job.spec import Job
from hftoolkit.training.checkpoints import AtomicCheckpoints
from hftoolkit.training.nonfinite import NonFiniteGuard

# rl.method -> TRL's GRPOConfig (loss_type, importance_sampling_level); rloo has its own trainer.
LOSSES = {"grpo": ("grpo", "token"), "dapo": ("dapo", "token"), "dr_grpo": ("dr_grpo", "token"),
          "gspo": ("grpo", "sequence")}


def arguments_class(job: Job, weights: list[float]):
    """(TRL's GRPOConfig or RLOOConfig, the keyword arguments it adds to the TrainingArguments hftoolkit sets)."""
    rl = job.recipe.rl
    epsilon, epsilon_high = rl.clipping
    common = dict(num_generations=rl.num_generations, max_completion_length=rl.max_completion_length,
                  temperature=rl.temperature, top_p=rl.top_p, beta=rl.beta, epsilon=epsilon,
                  epsilon_high=epsilon_high, num_iterations=rl.num_iterations,
                  mask_truncated_completions=rl.mask_truncated_completions, reward_weights=list(weights),
                  use_vllm=rl.generation == "vllm", use_transformers_continuous_batching=rl.generation == "continuous",
                  shuffle_dataset=True, log_completions=False,
                  # The log-probabilities of an answer are those of the model that sampled it, and the reference's
                  # those of the same weights: without dropout, so that the ratio and the KL start at 1 and 0.
                  disable_dropout=True)
    if rl.generation == "vllm":
        common.update(vllm_mode="colocate")
    if rl.method == "rloo":
        from trl import RLOOConfig

        return RLOOConfig, dict(common, normalize_advantages=rl.reward_scaling == "batch")
    from trl import GRPOConfig

    loss_type, level = LOSSES[rl.method]
    return GRPOConfig, dict(common, loss_type=loss_type, importance_sampling_level=level,
                            scale_rewards=rl.reward_scaling)


def trainer_base(job: Job):
    """TRL's GRPOTrainer (RLOOTrainer for rloo), its reference as this module's docstring says."""
    from trl import GRPOTrainer, RLOOTrainer

    from hftoolkit.patches import trl_1_16

    class RLTrainer(RLOOTrainer if job.recipe.rl.method == "rloo" else GRPOTrainer):
        def __init__(self, *args, model, **kwargs):
            with trl_1_16.reference_copied(model, job.recipe.rl.beta):
                super().__init__(*args, model=model, **kwargs)
            if "ref" in (getattr(self.model, "peft_config", None) or {}):
                self.model.delete_adapter("ref")  # (this run's adapter starts at zero: the base is the reference)

        def create_model_card(self, *args, **kwargs):
            pass  # (the run directory's README.md is the toolkit's card, written once the run ends)

    return RLTrainer


class SampledBatches:
    """Trainer mixin for TRL's GRPO and RLOO, which sample their batches themselves: each step's prompts and
    answers are counted as it prepares them (for metrics.json's throughput), and manifest.json says how."""

    token_counter = None  # (set by build_trainer)
    batch_order = "random"

    def _prepare_inputs(self, generation_batch):
        import torch

        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self.token_counter is not None:
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            self.token_counter.count({"attention_mask": mask}, len(mask))
        return inputs

    def batch_order_record(self) -> dict:
        return {"sampling": f"prompts shuffled, each sampled {self.num_generations} times", "layout": "padded"}


# The toolkit mixins of a trainer that samples its own batches (trainer.MIXINS has the others).
MIXINS = (NonFiniteGuard, AtomicCheckpoints, SampledBatches)
