"""The Trainer hftoolkit trains with: transformers' Trainer (or Seq2SeqTrainer) plus its mixins, each in the
module of what it does (loss.py, nonfinite.py, checkpoints.py, streaming.py, batching.py, eval_during_training.py).
`build_trainer` turns a job into that Trainer, with the callbacks the recipe asks for (docs/architecture.md,
"The Trainer")."""

from __future__ import annotations

import math
from pathlib import Path

from hftoolkit.config import tasks
from hftoolkit.evaluation.evaluate import shortest_first
from hftoolkit.job.hardware import attention_in_fp32
from hftoolkit.job.spec import Job
from hftoolkit.patches.transformers_5 import attention_in_fp32_on_cpu
from hftoolkit.runs.rundir import RunDirectory
from hftoolkit.training.batching import LengthBatching
from hftoolkit.training.checkpoints import AtomicCheckpoints
from hftoolkit.training.eval_during_training import EvalContext, EvalDuringTraining
from hftoolkit.training.frozen_weights import FrozenWeightsInBf16, holds_frozen_in_bf16
from hftoolkit.training.loss import ItemNormalizedLoss
from hftoolkit.training.nonfinite import NonFiniteGuard
from hftoolkit.training.progress import use_progress
from hftoolkit.training.pruning import pruning_callback
from hftoolkit.training.strategies import strategy_of
from hftoolkit.training.streaming import StreamPosition, row_stream


def build_trainer(job: Job, run: RunDirectory, model, processor, encoded, counter, scorer, data=None, rewards=None):
    """The Trainer for `recipe`. `data` (the raw splits) lets eval during training score generated text; `rewards`
    (workflows/rewards.py) scores task grpo's sampled answers."""
    from transformers import Trainer

    from hftoolkit.training.arguments import batch_order, training_arguments

    t, strategy = job.recipe.training, strategy_of(job)
    args = training_arguments(job, run, model, encoded, scorer, rewards)
    if job.precision == "bf16" and attention_in_fp32():
        attention_in_fp32_on_cpu()
    scoring = tasks.spec(job.recipe.task).scoring
    train = encoded["train"]
    if job.recipe.data.streaming:  # its position is saved with each checkpoint (streaming.py)
        train = row_stream(train, args.per_device_train_batch_size)
    mixins = MIXINS
    if scoring == "preference":  # TRL's trainer: its own loss, no logits for metrics
        from hftoolkit.training.preference import trainer_base

        base, loss, extra = trainer_base(job), (), dict(data_collator=counter)
    elif scoring == "rl":  # TRL's trainer samples its own batches, of answers it scores with the rewards
        from hftoolkit.training import grpo

        base, loss, mixins, extra = grpo.trainer_base(job), (), grpo.MIXINS, dict(reward_funcs=list(rewards.functions))
    elif scoring == "reward":  # the pairs' Bradley-Terry loss; metrics over the gathered pair scores
        from hftoolkit.training.reward import BradleyTerryLoss

        base, loss, extra = Trainer, (BradleyTerryLoss,), dict(compute_metrics=scorer.compute, data_collator=counter)
    else:
        base, loss = Trainer, (ItemNormalizedLoss,)
        extra = dict(compute_metrics=scorer.compute if scoring == "logits" else None,
                     preprocess_logits_for_metrics=scorer.reduce_logits, data_collator=counter)
    with strategy.building_trainer():  # (the Trainer builds its Accelerator here)
        trainer = toolkit_trainer(base, *loss, mixins=mixins)(
            model=model, args=args, train_dataset=train,
            eval_dataset=shortest_first(encoded["eval"])[0],  # read in order (LengthBatching): batches of one length
            processing_class=processor, **extra)
    trainer.batch_order = batch_order(job.recipe, encoded["train"])
    trainer.frozen_in_bf16 = holds_frozen_in_bf16(job, args.device.type)
    if scoring == "rl":
        trainer.token_counter = counter  # (TRL collates nothing: the answers are counted as they are sampled)
    use_progress(trainer)  # one progress bar instead of the Trainer's tqdm bars and printed log dicts
    trainer.nonfinite_policy, trainer.max_nonfinite_skips = t.on_nonfinite, t.max_nonfinite_skips
    trainer.nonfinite_skippable = strategy.can_skip_nonfinite
    trainer.keep_last, trainer.keep_best = t.keep_last, job.recipe.eval.keep_best
    trainer.eval_context = EvalContext(job, processor, scorer, counter, data["eval"] if data else None)
    trainer.counts_on_main = job.recipe.data.num_workers > 0  # (the collator then runs in the worker processes)
    _add_callbacks(trainer, job, counter)
    _tensorboard_into(trainer, run / "tensorboard")
    strategy.prepare(trainer, run)
    return trainer


def _add_callbacks(trainer, job: Job, counter) -> None:
    """The callbacks the run asks for: the collator's epoch, early stopping, the best checkpoint, a search's
    pruning."""
    if hasattr(counter.collate, "epoch"):  # a collator whose randomness depends on the epoch (MLM masking)
        trainer.add_callback(epoch_to_collator(counter.collate))
    if job.recipe.eval.early_stopping is not None:
        from transformers import EarlyStoppingCallback

        stop = job.recipe.eval.early_stopping
        trainer.add_callback(EarlyStoppingCallback(stop.patience, stop.threshold))
    if job.recipe.eval.keep_best:
        trainer.add_callback(best_checkpoint_found())
    pruning = pruning_callback()  # (a search trial: its evals reported to its study, which may stop it)
    if pruning is not None:
        trainer.add_callback(pruning)


def _tensorboard_into(trainer, folder: Path) -> None:
    """TensorBoard's event files go to the run directory's tensorboard/ (the Trainer's default is inside
    checkpoints/, which holds complete checkpoints only)."""
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == "TensorBoardCallback":
            callback.logging_dir = str(folder)


def best_checkpoint_found():
    """A callback that, as training begins, points the state's best checkpoint at the committed folder of
    its step: a resumed run's state names it as the interrupted run saw it (maybe from another working
    directory), and the Trainer forgets a path it cannot find."""
    from transformers import TrainerCallback

    class BestCheckpointFound(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if state.best_global_step:
                path = Path(args.output_dir) / f"checkpoint-{state.best_global_step}"
                state.best_model_checkpoint = str(path) if path.is_dir() else None

    return BestCheckpointFound()


def epoch_to_collator(collate):
    """A callback that sets `collate.epoch` to the epoch about to begin, and back to 0 for the eval after
    training. A resumed run's Trainer state holds the fractional epoch it stopped in: its floor is that epoch
    (give or take float rounding of the step fractions, hence the 1e-6)."""
    from transformers import TrainerCallback

    class EpochToCollator(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            collate.epoch = math.floor(state.epoch + 1e-6)

        def on_train_end(self, args, state, control, **kwargs):
            collate.epoch = 0

    return EpochToCollator()


# The mixins every Trainer gets (training/grpo.py has the set for trainers that sample their own batches).
MIXINS = (FrozenWeightsInBf16, NonFiniteGuard, AtomicCheckpoints, StreamPosition, LengthBatching, EvalDuringTraining)


def toolkit_trainer(base, *loss, mixins=MIXINS):
    """`base` (Trainer, Seq2SeqTrainer or one of TRL's trainers) with frozen weights cast once, the non-finite
    guard, atomic checkpoints and length-bucketed batches; `loss` the mixin that scales the loss
    (ItemNormalizedLoss: a loss scale that holds on any number of processes), none where `base` computes a loss of
    its own."""
    # (the loss mixin after EvalDuringTraining: the eval loss is final before the metrics derived from it)
    return type(f"Toolkit{base.__name__}", (*mixins, *loss, base), {})
