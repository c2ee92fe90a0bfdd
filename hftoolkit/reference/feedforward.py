"""The position-wise feed-forward network and its gated variants.

Plain (Vaswani et al., 2017, eq. 2), applied to every position alone:
    FFN(x) = W_down act(W_up x + b_up) + b_down,   d_model -> d_ff (usually 4 d_model) -> d_model
with act = ReLU (the original Transformer, T5), GELU (BERT, ViT, BART) or the
tanh approximation of GELU that GPT-2 uses ("gelu_new" in transformers).

Gated (Shazeer, 2020, "GLU Variants Improve Transformer"):
    FFN(x) = W_down (act(W_gate x) * (W_up x))
GLU gates with a sigmoid (Dauphin et al., 2017), SwiGLU with Swish/SiLU (LLaMA),
GEGLU with GELU (T5 v1.1). The gate costs a third matrix, so gated FFNs usually
shrink d_ff to about 2/3 * 4 d_model to keep the parameter count.

Mirrors T5DenseActDense, ViTMLP, GPT2MLP, T5DenseGatedActDense and LlamaMLP in
transformers, and torch.nn.functional.glu.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from hftoolkit.reference.weight_map import Rule, WeightMap


def gelu(x: torch.Tensor) -> torch.Tensor:
    """x * Phi(x), Phi the standard normal CDF (Hendrycks & Gimpel, 2016)."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation, used by GPT-2 and BERT's original TF code."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": lambda x: x.clamp(min=0),
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "sigmoid": torch.sigmoid,  # the gate of GLU
    "silu": lambda x: x * torch.sigmoid(x),  # Swish with beta = 1: the gate of SwiGLU
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; use one of {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """W_down act(W_up x + b_up) + b_down."""

    def __init__(self, d_model: int, d_ff: int, act: str = "relu", bias: bool = True):
        super().__init__()
        self.act = activation(act)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))  # (B, T, d) -> (B, T, d_ff) -> (B, T, d)


class GatedFeedForward(nn.Module):
    """W_down (act(W_gate x) * W_up x): GLU with act="sigmoid", SwiGLU with "silu", GEGLU with "gelu"."""

    def __init__(self, d_model: int, d_ff: int, act: str = "silu", bias: bool = False):
        super().__init__()
        self.act = activation(act)
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))  # the gate scales each hidden unit


# Where each library's FFN keeps W_up, W_gate and W_down.
FFN_WEIGHT_MAPS = {
    "T5DenseActDense": WeightMap("T5DenseActDense", (Rule("wi.weight", "up.weight"), Rule("wo.weight", "down.weight"))),
    "ViTMLP": WeightMap("ViTMLP", (Rule("fc1.{w}", "up.{w}"), Rule("fc2.{w}", "down.{w}"))),
    "GPT2MLP": WeightMap(
        "GPT2MLP", (Rule("c_fc.{w}", "up.{w}", "conv1d"), Rule("c_proj.{w}", "down.{w}", "conv1d"))
    ),
    "T5DenseGatedActDense": WeightMap(
        "T5DenseGatedActDense",
        (Rule("wi_0.weight", "gate.weight"), Rule("wi_1.weight", "up.weight"), Rule("wo.weight", "down.weight")),
    ),
    "LlamaMLP": WeightMap(
        "LlamaMLP",
        (
            Rule("gate_proj.weight", "gate.weight"),
            Rule("up_proj.weight", "up.weight"),
            Rule("down_proj.weight", "down.weight"),
        ),
    ),
}
