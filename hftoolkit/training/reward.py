"""A reward model's loss (task reward): Bradley-Terry on preference pairs, -log sigmoid(r_chosen - r_rejected -
margin), the mean over the pairs of a step, as a Trainer mixin (`BradleyTerryLoss`) under the toolkit's others.

Why not TRL's RewardTrainer: its __init__ builds what the toolkit already has (the model from a name, the peft
wrapper, its own tokenization and collator), its loss is each micro-batch's mean (a step of micro-batches of unequal
size, or processes holding unequal shares, then weighs pairs unequally), and its eval metrics are means of batch
means. What it computes is a few lines: here it is the mean over every pair of the step on any number of processes
and accumulated micro-batches, and the eval's accuracy, margin and loss are computed once over every held-out pair
(models/families/reward.pair_metrics). Its batch layout is TRL's: the chosen rows, then the rejected ones.
"""

from __future__ import annotations

from hftoolkit.models.families.reward import head_scores
from hftoolkit.sources.pairs import MARGIN


def pair_losses(chosen, rejected, margin):
    """Bradley-Terry per pair: -log sigmoid(chosen - rejected - margin), in fp32 (B,)."""
    import torch

    return -torch.nn.functional.logsigmoid(chosen.float() - rejected.float() - margin.float())


def pair_scores(model, inputs: dict):
    """(chosen scores, rejected scores, margins) of a batch of pairs (2B rows, the chosen first), each (B,)."""
    chosen, rejected = head_scores(model, inputs).chunk(2)
    return chosen, rejected, inputs[MARGIN].to(chosen.device)


class BradleyTerryLoss:
    """Trainer mixin: the pairs' loss, the mean over every pair of an optimizer step, and the eval pass's pair scores.

    The step's pairs are counted over its micro-batches and processes as they are drawn (`get_batch_samples`); each
    micro-batch's loss is its pairs' sum over that count, times the processes (DDP averages gradients over them), so
    the gradients are those of the step's mean whatever the split; the Trainer is told not to divide by the
    accumulation steps again. Training logs reward_accuracy and reward_margin of the pairs since the last log.
    """

    loss_is_scaled_for_ga = True  # (transformers' switch: compute_loss already scales for accumulation)
    _step_pairs = None
    _train_sums = None  # [pairs ranked right (ties half), sum of margins, pairs] since the last log, all processes

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        import torch

        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        pairs = torch.tensor(float(sum(len(batch[MARGIN]) for batch in batches)), device=device)
        self._step_pairs = self._summed(pairs)
        return batches, items

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        chosen, rejected, margin = pair_scores(model, inputs)
        losses = pair_losses(chosen, rejected, margin)
        if model.training and self._step_pairs is not None:
            self._tally(chosen.detach(), rejected.detach())
            loss = losses.sum() * self.accelerator.num_processes / self._step_pairs.clamp(min=1)
        else:
            loss = losses.mean()
        return (loss, {"chosen": chosen, "rejected": rejected}) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """(no loss, (B, 2) chosen and rejected scores, (B,) margins): the metrics, the loss among them, are computed
        over the gathered pairs of the whole eval set (pair_metrics)."""
        import torch

        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            chosen, rejected, margin = pair_scores(model, inputs)
        return None, torch.stack([chosen, rejected], -1).float(), margin.float()

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if "loss" in logs and self._train_sums is not None:  # a training log: the pairs since the last one
            right, margins, pairs = self._train_sums.tolist()
            if pairs:
                logs.update(reward_accuracy=right / pairs, reward_margin=margins / pairs)
            self._train_sums = None
        super().log(logs, start_time)

    def _tally(self, chosen, rejected) -> None:
        import torch

        delta = (chosen - rejected).float()
        sums = self._summed(torch.stack([(delta > 0).float().sum() + 0.5 * (delta == 0).float().sum(), delta.sum(),
                                         torch.tensor(float(len(delta)), device=delta.device)]))
        self._train_sums = sums if self._train_sums is None else self._train_sums + sums

    def _summed(self, tensor):
        """`tensor` summed over the processes (every process calls this at the same point)."""
        return self.accelerator.reduce(tensor, "sum") if self.accelerator.num_processes > 1 else tensor
