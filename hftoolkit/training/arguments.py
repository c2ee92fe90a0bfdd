"""A recipe's training settings as the Trainer takes them, decided for the machine at hand.

`training_arguments` makes the TrainingArguments; `run_record` says in metrics.json how the run trained.
Imports no torch at module level.
"""

from __future__ import annotations

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import CHECKPOINTS
from hftoolkit.config import tasks
from hftoolkit.config.recipe import Recipe
from hftoolkit.job.spec import Job
from hftoolkit.runs.rundir import RunDirectory

# training.optimizer -> the Trainer's `optim` name.
OPTIMIZERS = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit",
              "paged_adamw_8bit": "paged_adamw_8bit", "adafactor": "adafactor", "sgd": "sgd"}
# The trackers that read their project from the environment, and the variable each reads.
PROJECT_VARIABLES = {"wandb": "WANDB_PROJECT", "mlflow": "MLFLOW_EXPERIMENT_NAME", "comet_ml": "COMET_PROJECT_NAME"}


def training_arguments(job: Job, run: RunDirectory, model, encoded, scorer, rewards=None):
    """TrainingArguments for the job, in the precision it resolved: the batch split over processes, optimizer,
    schedule, checkpointing, eval and save strategies, data loader and trackers."""
    import torch
    from accelerate import PartialState
    from transformers import TrainingArguments

    from hftoolkit.training.strategies import strategy_of

    recipe, precision = job.recipe, job.precision
    t, cuda = recipe.training, torch.cuda.is_available()
    if t.gradient_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        raise UserError(f"training.gradient_checkpointing: {type(model).__name__} has no activation checkpointing "
                        "in transformers: set training.gradient_checkpointing to false")
    _tracker_project(t)
    arguments, extra = TrainingArguments, {}
    if tasks.spec(recipe.task).scoring == "preference":  # TRL's config: TrainingArguments and the loss's settings
        from hftoolkit.training.preference import arguments_class

        arguments, extra = arguments_class(job)
    elif rewards is not None:  # task grpo: TRL's GRPO (or RLOO) config, the rewards' weights among its settings
        from hftoolkit.training.grpo import arguments_class

        arguments, extra = arguments_class(job, rewards.weights)
    return arguments(
        **extra,
        output_dir=str(run / CHECKPOINTS),
        num_train_epochs=t.epochs, max_steps=t.max_steps or -1,
        # training.batch_size is the step's batch over all processes; eval.batch_size is per process.
        per_device_train_batch_size=per_process_batch(t.batch_size, PartialState().num_processes),
        per_device_eval_batch_size=recipe.eval.batch_size,
        gradient_accumulation_steps=t.gradient_accumulation, learning_rate=t.learning_rate,
        lr_scheduler_type=t.scheduler, optim=OPTIMIZERS[t.optimizer],
        # An int counts steps, a float below 1 is a share of all steps (transformers 5).
        warmup_steps=t.warmup_steps if t.warmup_steps is not None else t.warmup_ratio, weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, label_smoothing_factor=t.label_smoothing, seed=t.seed,
        bf16=precision == "bf16", fp16=precision == "fp16", **strategy_of(job).trainer_arguments(cuda),
        tf32=t.tf32 if cuda else None,  # (a run evaluated again on a CPU: nothing to switch)
        activation_checkpointing=t.gradient_checkpointing,
        # Non-reentrant checkpointing needs no input that requires grad, so it works under frozen LoRA bases.
        activation_checkpointing_kwargs={"use_reentrant": False} if t.gradient_checkpointing else None,
        torch_compile=t.compile,
        logging_steps=t.logging_steps, logging_first_step=True, report_to=list(t.report_to) or "none",
        run_name=recipe.name, **({"project": t.project} if t.project else {}),
        # Retention is AtomicCheckpoints' (by step, the best kept): the Trainer's own would delete non-atomically.
        save_total_limit=None, save_only_model=False,
        save_on_each_node=t.save_on_each_node,  # (args.should_save: who writes the run directory and checkpoints)
        **_eval_and_save_arguments(recipe, scorer),
        # Without a "length" column (images: all one size) the sampler would decode every example to measure it.
        train_sampling_strategy=batch_order(recipe, encoded["train"]),
        # A stream's position is restored from the checkpoint (streaming.py): nothing to skip by reading.
        ignore_data_skip=recipe.data.streaming,
        remove_unused_columns=False,  # our collator drops "length"; the sampler needs it first
        dataloader_num_workers=recipe.data.num_workers, dataloader_pin_memory=cuda,
        disable_tqdm=False, logging_nan_inf_filter=False,
    )


def batch_order(recipe: Recipe, train) -> str:
    """The train order, as training.sampling names it: a stream is read in its own order, and so is kto's train
    set (shuffled once as it is prepared: each answer's KL term is taken against its batch's neighbours); without a
    "length" column (images: all one size) group_by_length would decode every example to measure it."""
    t = recipe.training
    if recipe.data.streaming or (recipe.preference is not None and recipe.preference.unpaired):
        return "sequential"
    return "random" if t.sampling == "group_by_length" and "length" not in train.column_names else t.sampling


def _eval_and_save_arguments(recipe: Recipe, scorer) -> dict:
    """TrainingArguments for eval during training, early stopping and keep_best (which saves at every eval)."""
    t, every = recipe.training, recipe.eval.every
    save = {"save_strategy": "steps" if t.save_steps else "no", "save_steps": t.save_steps or 500}
    if every == "none":
        return {"eval_strategy": "no", **save}
    strategy = "epoch" if every == "epoch" else "steps"
    # Perplexity is exp(eval loss): the loss ranks checkpoints the same way and is always there.
    metric = "loss" if scorer.main == "perplexity" else scorer.main
    if recipe.eval.keep_best:
        save = {"save_strategy": strategy, "save_steps": every if strategy == "steps" else 500}
    return {"eval_strategy": strategy, "eval_steps": every if strategy == "steps" else None, **save,
            "metric_for_best_model": metric, "greater_is_better": scorer.greater_is_better,
            "load_best_model_at_end": recipe.eval.keep_best,
            # The early-stopping count lives in the checkpoint's trainer state: a resumed run goes on counting.
            "restore_callback_states_from_checkpoint": recipe.eval.early_stopping is not None}


def run_record(job: Job, trainer) -> dict:
    """What metrics.json says about how the run trained: the precision used, the CPU features behind it and,
    with eval.keep_best, the step (and metric) of the checkpoint whose weights the run kept."""
    from hftoolkit.job.hardware import cpu_record

    record = {"precision": job.precision, "cpu": cpu_record()}
    if job.recipe.eval.keep_best:
        record.update(best_step=trainer.state.best_global_step, best_metric=trainer.state.best_metric)
    return record


def _tracker_project(training) -> None:
    """training.project for the trackers that read it from the environment (trackio reads TrainingArguments')."""
    import os

    if training.project:
        for tracker in training.report_to:
            if tracker in PROJECT_VARIABLES:
                os.environ[PROJECT_VARIABLES[tracker]] = training.project


def per_process_batch(batch_size: int, num_processes: int) -> int:
    """training.batch_size split over the processes (a batch that does not divide is refused by `Strategy.problems`).
    training.batch_size is the batch of one optimizer step over all processes (before gradient accumulation), so a
    recipe trains the same way on 1 or N processes; eval.batch_size is per process (a memory knob: it does not
    change which examples are scored)."""
    if batch_size % num_processes:
        raise UserError(f"training.batch_size: {batch_size} does not split evenly over {num_processes} processes: "
                        f"set it to a multiple of {num_processes}")
    return batch_size // num_processes
