"""Evals during training (eval.every) that report the task's own metrics, as the final eval does
(`EvalDuringTraining`, a Trainer mixin)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hftoolkit.config import tasks
from hftoolkit.job.spec import Job


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
