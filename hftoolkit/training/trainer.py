"""The Trainer hftoolkit trains with: transformers' Trainer (or Seq2SeqTrainer) plus six mixins.

- `ItemNormalizedLoss`: the loss of a step is the mean over its labelled items on any number of
  processes and accumulated micro-batches.
- `NonFiniteGuard`: a NaN or infinite loss or gradient norm never reaches the weights (below).
- `AtomicCheckpoints`: a checkpoint folder is complete or absent (checkpoints.py has the file work).
- `StreamPosition`: a stream's position saved with each checkpoint and restored on resume (streaming.py).
- `LengthBatching`: training batches of nearly one length (batching.py), eval sets read in order (a stream
  is read in its own order: the Trainer takes no sampler for it).
- `EvalDuringTraining`: evals during training (eval.every) report the task's own metrics.

`build_trainer` turns a recipe into the Trainer (its TrainingArguments come from arguments.py) with the
callbacks it asks for (early stopping, the best checkpoint); `toolkit_trainer` adds the mixins.

The non-finite guard, in detail:

Checked once per optimizer update, after the gradients are accumulated and clipped and
before `optimizer.step()`. The recipe's training.on_nonfinite says what happens:

- stop (default): training ends with an error naming the step, what was not finite, and the
  last good checkpoint (its weights are usable; the failed run keeps its log).
- skip: the update is dropped. The gradients are discarded (torch optimizers leave a
  parameter without a gradient untouched: no moment update, no step count, no weight
  decay) and the learning-rate schedule does not advance, exactly as for an fp16 overflow,
  so weights and optimizer state are what they were before the step. Up to
  training.max_nonfinite_skips updates in a row are dropped; the next one in a row stops
  training as `stop` would. Each dropped update is logged as `nonfinite_skips` (the total).

Under fp16 with a gradient scaler, an infinite gradient norm is the scaler's business (it
skips the step and lowers the scale); the guard then judges the loss only, and a dropped
update is left to the scaler, which sees the non-finite gradients and skips it. Under DeepSpeed,
which owns the gradients, `skip` stops as `stop` does. A dropped update adds nothing to the
logged loss (a NaN there would make every later logged loss NaN).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from hftoolkit.config import tasks
from hftoolkit.errors import UserError
from hftoolkit.evaluation.evaluate import shortest_first
from hftoolkit.job.spec import Job
from hftoolkit.runs.rundir import RunDirectory
from hftoolkit.training.batching import LengthBucketSampler
from hftoolkit.training.checkpoints import PICKLED_ARGS, STAGING_PREFIX, commit, latest_checkpoint, rotate, test_pause
from hftoolkit.training.progress import use_progress
from hftoolkit.training.strategies import strategy_of
from hftoolkit.training.streaming import StreamPosition, row_stream


def build_trainer(job: Job, run: RunDirectory, model, processor, encoded, counter, scorer, data=None):
    """The Trainer for `recipe`. `data` (the raw splits) lets eval during training score generated text."""
    from transformers import Trainer

    from hftoolkit.training.arguments import training_arguments

    t, args, strategy = job.recipe.training, training_arguments(job, run, model, encoded, scorer), strategy_of(job)
    train = encoded["train"]
    if job.recipe.data.streaming:  # its position is saved with each checkpoint (streaming.py)
        train = row_stream(train, args.per_device_train_batch_size)
    with strategy.building_trainer():  # (the Trainer builds its Accelerator here)
        trainer = toolkit_trainer(Trainer)(
            model=model, args=args, train_dataset=train,
            eval_dataset=shortest_first(encoded["eval"])[0],  # read in order (LengthBatching): batches of one length
            data_collator=counter, processing_class=processor,
            compute_metrics=scorer.compute if tasks.spec(job.recipe.task).scoring == "logits" else None,
            preprocess_logits_for_metrics=scorer.reduce_logits)
    use_progress(trainer)  # one progress bar instead of the Trainer's tqdm bars and printed log dicts
    trainer.nonfinite_policy, trainer.max_nonfinite_skips = t.on_nonfinite, t.max_nonfinite_skips
    trainer.nonfinite_skippable = strategy.can_skip_nonfinite
    trainer.keep_last, trainer.keep_best = t.keep_last, job.recipe.eval.keep_best
    trainer.eval_context = EvalContext(job, processor, scorer, counter, data["eval"] if data else None)
    trainer.counts_on_main = job.recipe.data.num_workers > 0  # (the collator then runs in the worker processes)
    if hasattr(counter.collate, "epoch"):  # a collator whose randomness depends on the epoch (MLM masking)
        trainer.add_callback(epoch_to_collator(counter.collate))
    if job.recipe.eval.early_stopping is not None:
        from transformers import EarlyStoppingCallback

        stop = job.recipe.eval.early_stopping
        trainer.add_callback(EarlyStoppingCallback(stop.patience, stop.threshold))
    if job.recipe.eval.keep_best:
        trainer.add_callback(best_checkpoint_found())
    _tensorboard_into(trainer, run / "tensorboard")
    strategy.prepare(trainer, run)
    return trainer


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


def toolkit_trainer(base):
    """`base` (Trainer or Seq2SeqTrainer) with the non-finite guard, atomic checkpoints, length-bucketed
    batches and a loss scale that holds on any number of processes."""
    mixins = (ItemNormalizedLoss, NonFiniteGuard, AtomicCheckpoints, StreamPosition, LengthBatching,
              EvalDuringTraining)
    return type(f"Toolkit{base.__name__}", (*mixins, base), {})


# ---------------------------------------------------------------- loss scale


class ItemNormalizedLoss:
    """Trainer mixin: the training loss of a step is the mean over every labelled item of that step,
    whatever the number of processes and of accumulated micro-batches.

    Why: the Trainer counts the labelled items of the whole step (all micro-batches, gathered over
    processes) as `num_items_in_batch`, and for a model whose forward takes **kwargs it assumes the
    model divided its loss sum by that count. It then skips the division by the accumulation steps
    and multiplies by the number of processes (DDP averages gradients, and a sum was wanted).
    BERT's and T5's heads (and most task heads) ignore the count and return their own batch mean, so
    the loss and the gradients both come out num_processes x gradient_accumulation too large
    (tests/test_distributed.py compares 1 and 2 processes). Here every model is called without the count,
    so every model returns
    its mean over its own labelled items, and the mean is turned into that share of the step's sum.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:
            # Eval: each batch's own mean, over its real rows only (gather_for_metrics then drops the
            # duplicate rows and weighs each batch's mean by its real examples). The gathered item count
            # would count the duplicates, and scale the mean by the process count.
            inputs = self._without_padding_rows(inputs)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch=None)
        if (num_items_in_batch is None or "labels" not in inputs or self.label_smoother is not None
                or self.compute_loss_func is not None or self.args.n_gpu > 1):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)  # these honour the count
        outputs = model(**inputs)
        items = self._labelled_items(inputs)
        if items == 0:  # a micro-batch without a labelled item adds nothing (its mean would be 0/0)
            loss = outputs["logits"].sum() * 0.0
        else:
            loss = outputs["loss"] * (items / num_items_in_batch)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())  # DDP averages: make it a sum
        return (loss, outputs) if return_outputs else loss

    def _without_padding_rows(self, inputs):
        """The last eval step with its padding rows' labels set to -100, so the loss leaves them out.

        To give every process a full batch, accelerate repeats the first examples at the end of the
        last step; gather_for_metrics keeps the first `remainder` rows of that step, in process
        order, so this process's real rows are the first remainder - rank x batch of its batch.
        """
        state = self.accelerator.gradient_state
        if self.args.world_size == 1 or not state.end_of_dataloader or state.remainder <= 0 or "labels" not in inputs:
            return inputs
        labels = inputs["labels"]
        real = min(max(state.remainder - self.args.process_index * len(labels), 0), len(labels))
        if real in (0, len(labels)):  # all real, or all padding (dropped whole: any finite loss will do)
            return inputs
        masked = labels.clone()
        masked[real:] = -100
        return {**inputs, "labels": masked}

    def _labelled_items(self, inputs):
        """Counted as the Trainer counts them: causal LMs predict from position 1 on."""
        labels = inputs.get("shift_labels")
        if labels is None:
            labels = inputs["labels"][..., 1:] if getattr(self, "_loss_shifts_labels", False) else inputs["labels"]
        return labels.ne(-100).sum()



# ---------------------------------------------------------------- non-finite guard


class NonFiniteError(UserError):
    """Training produced a NaN or infinite loss or gradient norm (the CLI exits non-zero)."""


class NonFiniteGuard:
    """Trainer mixin: set `nonfinite_policy` and `max_nonfinite_skips` after construction."""

    nonfinite_policy = "stop"
    nonfinite_skippable = True  # (the strategy says: build_trainer)
    max_nonfinite_skips = 3
    nonfinite_skips = 0
    _skips_in_a_row = 0
    _bad_loss: float | None = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        value = float(loss)
        if math.isfinite(value):
            return loss
        if self._bad_loss is None:
            self._bad_loss = value
        # A NaN added to the Trainer's running loss would make every later logged loss NaN; a
        # dropped update adds nothing instead (stop raises before anything is logged).
        return loss.new_zeros(()) if self.nonfinite_policy == "skip" else loss

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm)
        self._judge_update(model, grad_norm)
        return grad_norm

    def _judge_update(self, model, grad_norm) -> None:
        scaler = getattr(self.accelerator, "scaler", None)
        problem = None
        if self._bad_loss is not None:
            problem = f"the loss is {self._bad_loss}"
        elif grad_norm is not None and scaler is None and not math.isfinite(float(grad_norm)):
            problem = f"the gradient norm is {float(grad_norm)}"
        self._bad_loss = None
        if self.args.world_size > 1:  # every process must take the same decision
            problem = _any_process(self.accelerator, problem)
        if problem is None:
            self._skips_in_a_row = 0
            self._drop_update(False)
            return
        step = self.state.global_step + 1
        # Where the strategy owns the gradients and the step (DeepSpeed), an update can't be dropped: it stops instead.
        can_skip = self.nonfinite_policy == "skip" and self.nonfinite_skippable
        if can_skip and self._skips_in_a_row < self.max_nonfinite_skips:
            self._skips_in_a_row += 1
            self.nonfinite_skips += 1
            self._drop_update(True)
            self.log({"nonfinite_skips": self.nonfinite_skips, "nonfinite_step": step})
            return
        in_a_row = (f" after {self._skips_in_a_row} skipped updates in a row (training.max_nonfinite_skips)"
                    if can_skip else "")
        remedy = ("" if self.nonfinite_policy == "skip"
                  else ", or drop such updates: --resume --set training.on_nonfinite=skip")
        raise NonFiniteError(f"training step {step}: {problem}{in_a_row}; {self._last_good()}; "
                             f"lower training.learning_rate or check the data and train again{remedy}")

    def _drop_update(self, drop: bool) -> None:
        """Drop (or allow) this step's update: discard the gradients and hold the schedule."""
        if getattr(self.accelerator, "scaler", None) is not None:
            return  # a non-finite loss has non-finite gradients: the scaler skips the step and lowers its scale
        if drop:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
        if hasattr(self.optimizer, "_is_overflow"):
            # accelerate's flag for "this step did not happen": the Trainer then leaves the scheduler alone
            self.optimizer._is_overflow = drop

    def _last_good(self) -> str:
        checkpoints_dir = Path(self.args.output_dir)
        last = latest_checkpoint(checkpoints_dir)
        if last is None:
            return "no checkpoint was saved before it (set training.save_steps to keep some)"
        return f"the last good checkpoint is {last}"


def _any_process(accelerator, problem: str | None) -> str | None:
    import torch

    flag = torch.tensor([0.0 if problem is None else 1.0], device=accelerator.device)
    if accelerator.reduce(flag, reduction="sum").item() > 0:
        return problem or "another process saw a non-finite loss or gradient norm"
    return None


# ---------------------------------------------------------------- checkpoints and batches


class AtomicCheckpoints:
    """Trainer mixin: `_save_checkpoint` stages into a hidden folder, fsyncs, renames, then rotates.

    Set `keep_last` (None: keep all) and `keep_best` after construction. With keep_best the checkpoint of
    the best eval so far (state.best_global_step) is never rotated away, and the trainer state records
    its committed folder, not the staging folder the save wrote into: a resumed run finds it there.
    """

    _staging_root: str | None = None
    keep_last: int | None = None
    keep_best = False

    def _get_output_dir(self, trial):
        return self._staging_root or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        from transformers.trainer import TRAINER_STATE_NAME

        final_dir = Path(super()._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
        staging_root = final_dir.parent / f"{STAGING_PREFIX}{final_dir.name}"
        if self.args.should_save and staging_root.exists():
            shutil.rmtree(staging_root)  # left by a run killed while saving this step
        self.accelerator.wait_for_everyone()
        self._staging_root = str(staging_root)
        try:
            super()._save_checkpoint(model, trial)  # writes staging_root/checkpoint-N (every rank its RNG file)
        finally:
            self._staging_root = None
        best = self._best_checkpoint(final_dir)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            staged = staging_root / final_dir.name
            if self.state.best_model_checkpoint != (None if best is None else str(best)):
                self.state.best_model_checkpoint = None if best is None else str(best)
                self.state.save_to_json(str(staged / TRAINER_STATE_NAME))
            (staged / PICKLED_ARGS).unlink(missing_ok=True)
            test_pause("HFTOOLKIT_TEST_PAUSE_IN_SAVE", self.state.global_step)
            commit(staged, final_dir)
            staging_root.rmdir()
            if self.keep_last:
                rotate(final_dir.parent, keep_last=self.keep_last, keep=best if self.keep_best else None)
            test_pause("HFTOOLKIT_TEST_PAUSE_AFTER_SAVE", self.state.global_step)
        self.state.best_model_checkpoint = None if best is None else str(best)
        self.accelerator.wait_for_everyone()

    def _best_checkpoint(self, saving: Path) -> Path | None:
        """The committed folder of the best checkpoint so far (`saving` is the one being saved), or None."""
        step = self.state.best_global_step
        if not step:
            return None
        path = saving.parent / f"checkpoint-{step}"
        return path if path == saving or path.is_dir() else None


class LengthBatching:
    """Trainer mixin: the bucketed train order for group_by_length, and eval sets read in their own order."""

    def _get_train_sampler(self, train_dataset=None):
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler).__name__ == "LengthGroupedSampler":
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            return LengthBucketSampler(sampler.lengths, sampler.batch_size, seed)
        return sampler

    def _get_eval_sampler(self, eval_dataset):
        from torch.utils.data import SequentialSampler

        if eval_dataset is None or self.args.world_size > 1:
            return None  # (several processes: accelerate shards the set in order)
        return SequentialSampler(eval_dataset)




# ---------------------------------------------------------------- eval during training


@dataclass
class EvalContext:
    """What eval during training needs beyond the Trainer's own pass: `raw_eval` is the eval split before
    preprocessing (its texts and targets, for generation-scored tasks)."""

    job: Job
    processor: object
    scorer: object
    counter: object
    raw_eval: object = None


class EvalDuringTraining:
    """Trainer mixin: evals run during training (eval.every) report the task's own metrics.

    - generation-scored tasks (translation, summarization): the eval split is generated and scored, as the
      final eval does, so that early stopping and keep_best see BLEU or ROUGE;
    - perplexity tasks: perplexity beside the eval loss;
    - eval batches are left out of the training token counts, and an epoch-dependent collator (MLM masks)
      masks as in epoch 0, so every eval scores the same masked tokens as the final one.

    With data.num_workers > 0 the collator runs in the loader's worker processes, so the training tokens
    are counted here, on the main process, as each batch arrives (`counts_on_main`).
    """

    eval_context: EvalContext | None = None
    counts_on_main = False

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.counts_on_main and self.eval_context is not None:
            _tally(self.eval_context.counter, inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        context = self.eval_context
        if not self.is_in_train or context is None:
            return super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                           metric_key_prefix)
        counter = context.counter
        counts = (counter.real, counter.total, counter.samples, counter.attention_flops)
        epoch = getattr(counter.collate, "epoch", None)
        if epoch is not None:
            counter.collate.epoch = 0
        try:
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
            output.metrics.update(self._task_metrics(context, output.metrics, metric_key_prefix))
        finally:
            counter.real, counter.total, counter.samples, counter.attention_flops = counts
            if epoch is not None:
                counter.collate.epoch = epoch
        return output

    def _task_metrics(self, context: EvalContext, metrics: dict, prefix: str) -> dict:
        task = tasks.spec(context.job.recipe.task)
        if task.main_metric == "perplexity" and f"{prefix}_loss" in metrics:
            return {f"{prefix}_perplexity": math.exp(min(metrics[f"{prefix}_loss"], 50))}
        if task.scoring != "generation" or context.raw_eval is None:
            return {}
        from hftoolkit.evaluation.evaluate import eval_inputs, references
        from hftoolkit.evaluation.generation import generate_everywhere
        from hftoolkit.models.families import formulation

        raw, model = context.raw_eval, self.model
        was_training = model.training
        model.eval()
        try:
            outputs = generate_everywhere(formulation(context.job), context.job, model, context.processor,
                                          eval_inputs(raw, len(raw), task.columns[0]))
        finally:
            model.train(was_training)
        scores = context.scorer.compute([o["text"] for o in outputs], references(context.job, raw, len(raw)))
        return {f"{prefix}_{name}": value for name, value in scores.items()}


def _tally(counter, batch) -> None:
    """Count a training batch into `counter` (a throughput.TokenCounter) as it does when it collates one."""
    first = next((v for v in batch.values() if hasattr(v, "shape") and v.dim()), None)
    counter.count(batch, len(first) if first is not None else 0)
