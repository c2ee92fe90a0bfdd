"""The training loss of a step as the mean over its labelled items, on any number of processes and accumulated
micro-batches (`ItemNormalizedLoss`, a Trainer mixin)."""

from __future__ import annotations


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
