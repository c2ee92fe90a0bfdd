"""LayerNorm and RMSNorm, written out.

LayerNorm (Ba et al., 2016) normalises one token's feature vector:
    mu = mean(x),  sigma^2 = mean((x - mu)^2)       (biased variance, over features)
    LayerNorm(x) = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta
The course's worked example: [5, 10, -5, 25] -> [-0.346, 0.115, -1.270, 1.501].

RMSNorm (Zhang & Sennrich, 2019) skips the centring and the shift:
    RMSNorm(x) = gamma * x / sqrt(mean(x^2) + eps)
T5 calls it T5LayerNorm (transformers/models/t5/modeling_t5.py); LLaMA uses it too.

Mirrors torch.nn.LayerNorm and torch.nn.RMSNorm.
"""

from __future__ import annotations

import torch
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(dim=-1, keepdim=True)
        var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)  # divide by d, not d - 1
        return self.weight * (x - mu) / torch.sqrt(var + self.eps) + self.bias


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma; no beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt((x**2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * x / rms
