"""A LoRA run's frozen weights held in bf16 while it trains under bf16 autocast on a CPU (`FrozenWeightsInBf16`, a
Trainer mixin).

Autocast casts each linear layer's fp32 weight to bf16 at every forward pass, and keeps the cast only for weights
that train: a LoRA run's frozen base weights are copied again at every step, and each copy is held for the backward
pass. Cast once as training begins, the products see the very same bf16 weights (autocast rounds as `.to` does):
the same numbers, without the copies. Whatever runs outside autocast meanwhile (an eval's generation, a save) gets
the fp32 weights back for its duration, and the end of training restores them for good.
"""

from __future__ import annotations

import contextlib
from collections import Counter


def holds_frozen_in_bf16(job, device: str) -> bool:
    """Whether a run's Trainer holds its frozen weights in bf16: bf16 on a CPU, in one process, and the Trainer's
    own steps. Not TRL's trainers, which generate and score references inside their steps, outside autocast; not
    under checkpointing, whose recomputed layers hold no cast weights between steps, so the copies would add
    memory; not under compile, whose graphs are left as they are."""
    from hftoolkit.config import tasks
    from hftoolkit.training.strategies import strategy_of

    t = job.recipe.training
    return job.precision == "bf16" and device == "cpu" and strategy_of(job).name == "single" \
        and tasks.spec(job.recipe.task).scoring not in ("preference", "rl") \
        and not t.compile and not t.gradient_checkpointing


class FrozenWeightsInBf16:
    """Trainer mixin: with `frozen_in_bf16` set (`holds_frozen_in_bf16`), the frozen fp32 weights of plain linear
    layers are swapped for bf16 copies while `train` runs."""

    frozen_in_bf16 = False
    _frozen_swaps: list = []

    def train(self, *args, **kwargs):
        if not self.frozen_in_bf16:
            return super().train(*args, **kwargs)
        self._frozen_swaps = frozen_linear_weights(self.model)
        _swap(self._frozen_swaps, 1)
        try:
            return super().train(*args, **kwargs)
        finally:
            _swap(self._frozen_swaps, 0)
            self._frozen_swaps = []

    def evaluation_loop(self, *args, **kwargs):
        with self._frozen_in_fp32():
            return super().evaluation_loop(*args, **kwargs)

    def save_model(self, *args, **kwargs):
        with self._frozen_in_fp32():
            return super().save_model(*args, **kwargs)

    @contextlib.contextmanager
    def _frozen_in_fp32(self):
        swaps = self._frozen_swaps
        _swap(swaps, 0)
        try:
            yield
        finally:
            _swap(swaps, 1)


def frozen_linear_weights(model) -> list[tuple]:
    """(layer, fp32 weight, its bf16 copy) for every plain nn.Linear whose fp32 weight is frozen and used by no
    other module (a head tied to the embeddings stays fp32: the embeddings' output must not change dtype).
    Quantized layers subclass nn.Linear and are left alone."""
    import torch

    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    swaps = []
    for module in model.modules():
        if type(module) is not torch.nn.Linear:
            continue
        weight = module.weight
        if weight.dtype == torch.float32 and not weight.requires_grad and uses[id(weight)] == 1:
            swaps.append((module, weight, torch.nn.Parameter(weight.detach().to(torch.bfloat16),
                                                             requires_grad=False)))
    return swaps


def _swap(swaps: list[tuple], which: int) -> None:
    """Each layer's weight set to its fp32 original (0) or its bf16 copy (1)."""
    for module, *weights in swaps:
        module._parameters["weight"] = weights[which]
