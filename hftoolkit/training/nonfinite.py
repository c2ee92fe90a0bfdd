"""The non-finite guard: a NaN or infinite loss or gradient norm never reaches the weights (`NonFiniteGuard`, a
Trainer mixin). training.on_nonfinite stops the run, or drops up to training.max_nonfinite_skips updates in a row
(docs/architecture.md, "The Trainer")."""

from __future__ import annotations

import math
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.training.checkpoints import latest_checkpoint


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
