"""Data parallel (PyTorch DDP, or gloo between CPU processes): every process holds the whole model, its optimizer
states and gradients, and takes batch_size / N of each step; the gradients are averaged across processes. The only
spread that accepts 8-bit weights. On several machines it is the same strategy: the machines are the launch's."""

from __future__ import annotations

from hftoolkit.training.strategies.base import Strategy


class DDP(Strategy):
    name = "ddp"
    label = "DDP"
