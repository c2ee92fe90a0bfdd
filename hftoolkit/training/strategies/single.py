"""One process: the whole model, the whole batch, nothing to share. Every part is the protocol's default."""

from __future__ import annotations

from hftoolkit.training.strategies.base import Strategy


class Single(Strategy):
    name = "single"
    label = "one process"
