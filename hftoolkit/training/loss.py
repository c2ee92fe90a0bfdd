"""The loss as the mean over labelled items: a training step's over its items on any number of processes and
accumulated micro-batches, and the eval loss over every item of the eval set (`ItemNormalizedLoss`, a Trainer
mixin)."""

from __future__ import annotations

from hftoolkit.sources.labels import IGNORE_INDEX


class ItemNormalizedLoss:
    """Trainer mixin: the training loss of a step is the mean over every labelled item of that step,
    whatever the number of processes and of accumulated micro-batches.

    Why: the Trainer counts the labelled items of the whole step (all micro-batches, gathered over
    processes) as `num_items_in_batch`, and for a model whose forward takes **kwargs it assumes the
    model divided its loss sum by that count. It then skips the division by the accumulation steps
    and multiplies by the number of processes (DDP averages gradients, and a sum was wanted).
    BERT's and T5's heads (and most task heads) ignore the count and return their own batch mean, so
    the loss and the gradients both come out num_processes x gradient_accumulation too large
    (tests/e2e/test_distributed.py compares 1 and 2 processes). Here every model is called without the count,
    so every model returns
    its mean over its own labelled items, and the mean is turned into that share of the step's sum.

    The eval loss is the mean over every labelled item of the eval set (an answer's tokens, a class label), as
    TRL and the Trainer's token-averaged losses define it: the Trainer's own figure is the mean over examples of
    their batch's mean, which weighs a short example's tokens more, and so depends on how the set is batched
    (eval batches run shortest first).
    """

    _eval_sums = None  # [loss sum, items] over this process's eval batches, while an evaluation loop runs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:
            # Eval: each batch's own mean over its real rows (the gathered item count would count the rows
            # accelerate repeats to fill the last step), added to the eval set's sums as that batch's sum.
            inputs, real = self._without_padding_rows(inputs)
            result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch=None)
            if self._eval_sums is not None and real and "labels" in inputs:
                items = self._labelled_items(inputs)
                self._eval_sums[0] += (result[0] if return_outputs else result).detach().float() * items
                self._eval_sums[1] += items
            return result
        if (num_items_in_batch is None or "labels" not in inputs or self.label_smoother is not None
                or self.compute_loss_func is not None or self.args.n_gpu > 1):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)  # these honour the count
        items = self._labelled_items(inputs)
        if items == 0:  # a micro-batch without a labelled item adds nothing (its mean would be 0/0)
            outputs = model(**inputs)
            loss = outputs["logits"].sum() * 0.0
        elif self._projects_labelled_only(model):
            outputs, mean = _labelled_logits_loss(model, inputs)
            loss = mean * (items / num_items_in_batch)
        else:
            outputs = model(**inputs)
            loss = outputs["loss"] * (items / num_items_in_batch)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())  # DDP averages: make it a sum
        return (loss, outputs) if return_outputs else loss

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        """The Trainer's loop, its loss replaced by the sum over every process's labelled items over their count."""
        import torch

        self._eval_sums = [torch.zeros((), device=self.args.device), torch.zeros((), device=self.args.device)]
        try:
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
            total, items = self.accelerator.reduce(torch.stack(self._eval_sums).double(), "sum").tolist()
        finally:
            self._eval_sums = None
        if items > 0 and f"{metric_key_prefix}_loss" in output.metrics:
            output.metrics[f"{metric_key_prefix}_loss"] = total / items
        return output

    def _projects_labelled_only(self, model) -> bool:
        """Whether training projects onto the vocabulary only where a token is predicted: a causal LM with the
        standard next-token loss whose forward takes a boolean logits_to_keep (transformers'
        slice_logits_to_keep). Elsewhere the model computes its own logits and loss."""
        known = getattr(self, "_labelled_only", None)
        if known is None:
            import sys

            base = self.accelerator.unwrap_model(model)
            base = base.get_base_model() if hasattr(base, "get_base_model") else base
            module = sys.modules.get(type(base).__module__)
            known = self._labelled_only = bool(getattr(self, "_loss_shifts_labels", False)
                                               and getattr(module, "slice_logits_to_keep", None) is not None)
        return known

    def _without_padding_rows(self, inputs):
        """(inputs, whether any row is real): the last eval step with its padding rows' labels set to -100, so the
        loss leaves them out.

        To give every process a full batch, accelerate repeats the first examples at the end of the
        last step; gather_for_metrics keeps the first `remainder` rows of that step, in process
        order, so this process's real rows are the first remainder - rank x batch of its batch.
        """
        state = self.accelerator.gradient_state
        if self.args.world_size == 1 or not state.end_of_dataloader or state.remainder <= 0 or "labels" not in inputs:
            return inputs, True
        labels = inputs["labels"]
        real = min(max(state.remainder - self.args.process_index * len(labels), 0), len(labels))
        if real in (0, len(labels)):  # all real, or all padding (left out of the sums: any finite loss will do)
            return inputs, real > 0
        masked = labels.clone()
        masked[real:] = IGNORE_INDEX
        return {**inputs, "labels": masked}, True

    def _labelled_items(self, inputs):
        """Counted as the Trainer counts them: causal LMs predict from position 1 on."""
        labels = inputs.get("shift_labels")
        if labels is None:
            labels = inputs["labels"][..., 1:] if getattr(self, "_loss_shifts_labels", False) else inputs["labels"]
        return labels.ne(IGNORE_INDEX).sum()


def _labelled_logits_loss(model, inputs):
    """(outputs, mean next-token cross-entropy over the labelled positions), the vocabulary projection and its
    softmax computed at those positions only: where a prompt's or padding's position predicts nothing, its
    logits are never made (the model's own loss computes them at every position, then ignores most)."""
    import torch

    labels = inputs["labels"]
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:].ne(IGNORE_INDEX)  # position t predicts label t + 1
    outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, logits_to_keep=keep)
    logits = outputs["logits"]
    targets = labels[:, 1:][keep[:, :-1]]
    mean = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets)
    return outputs, mean
