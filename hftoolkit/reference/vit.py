"""ViT: an image cut into P x P patches, each flattened and projected, read by a pre-LN encoder.

    (B, C, H, W) -> N = (H/P)(W/P) patches of C*P*P values -> Linear -> (B, N, d)
    prepend a learned [CLS] vector, add learned position embeddings (N + 1 of them)
    h = pre-LN block(h)   x n_layers  (no mask: every patch sees every patch)
    out = LN(h); pooled = tanh(W out[CLS] + b)

The course's arithmetic: 224 x 224 x 3 with 16 x 16 patches -> (224/16)^2 = 196
patches of 16*16*3 = 768 values. HF implements the projection as a Conv2d with
kernel = stride = P; on non-overlapping patches that is exactly a Linear layer on
the flattened patch, which is how it is written here (the weight map flattens the
kernel, channel-major, matching `patchify`).

Mirrors ViTModel in transformers/models/vit/modeling_vit.py; Dosovitskiy et al., 2021.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hftoolkit.reference.attention import ATTENTION_WEIGHT_MAPS
from hftoolkit.reference.blocks import BlockConfig, TransformerBlock
from hftoolkit.reference.feedforward import FFN_WEIGHT_MAPS
from hftoolkit.reference.norm import LayerNorm
from hftoolkit.reference.weight_map import Rule, WeightMap


@dataclass
class ViTConfig:
    image_size: int = 16
    patch_size: int = 4
    n_channels: int = 3
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 64
    act: str = "gelu"
    eps: float = 1e-12

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def from_hf(cls, hf: Any) -> ViTConfig:
        """Read the fields that matter from a transformers.ViTConfig."""
        return cls(
            image_size=hf.image_size,
            patch_size=hf.patch_size,
            n_channels=hf.num_channels,
            d_model=hf.hidden_size,
            n_layers=hf.num_hidden_layers,
            n_heads=hf.num_attention_heads,
            d_ff=hf.intermediate_size,
            act=hf.hidden_act,
            eps=hf.layer_norm_eps,
        )


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C*P*P): patches in row-major order, each flattened channel-first."""
    B, C, H, W = images.shape
    P = patch_size
    if H % P or W % P:
        raise ValueError(f"Image size {H}x{W} is not a multiple of the patch size {P}; resize or crop first.")
    x = images.view(B, C, H // P, P, W // P, P)  # (B, C, rows, P, cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, rows, cols, C, P, P)
    return x.reshape(B, (H // P) * (W // P), C * P * P)  # (B, N, C*P*P)


class ViT(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        c = config
        self.patch_size = c.patch_size
        self.patch_embed = nn.Linear(c.n_channels * c.patch_size**2, c.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.position = nn.Parameter(torch.zeros(1, c.n_patches + 1, c.d_model))  # +1 for [CLS]
        block = BlockConfig(c.d_model, c.n_heads, c.d_ff, c.act, pre_norm=True, eps=c.eps)
        self.blocks = nn.ModuleList(TransformerBlock(block) for _ in range(c.n_layers))
        self.ln_f = LayerNorm(c.d_model, c.eps)
        self.pooler = nn.Linear(c.d_model, c.d_model)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images: (B, C, H, W). Returns the last hidden state (B, N+1, d) and the pooled [CLS] (B, d)."""
        h = self.patch_embed(patchify(images, self.patch_size))  # (B, N, d)
        cls = self.cls_token.expand(h.shape[0], -1, -1)  # (B, 1, d)
        h = torch.cat([cls, h], dim=1) + self.position  # (B, N+1, d)
        for block in self.blocks:
            h = block(h)
        h = self.ln_f(h)
        return h, torch.tanh(self.pooler(h[:, 0]))


VIT_LAYER_WEIGHT_MAP = WeightMap(
    "ViTLayer",
    ATTENTION_WEIGHT_MAPS["ViTAttention"].prefixed("attention.", "attn.").rules
    + (Rule("layernorm_before.{w}", "ln_attn.{w}"), Rule("layernorm_after.{w}", "ln_ffn.{w}"))
    + FFN_WEIGHT_MAPS["ViTMLP"].prefixed("mlp.", "ffn.").rules,
)

VIT_WEIGHT_MAP = WeightMap(
    "ViTModel",
    (
        Rule("embeddings.cls_token", "cls_token"),
        Rule("embeddings.position_embeddings", "position"),
        Rule("embeddings.patch_embeddings.projection.{w}", "patch_embed.{w}", "conv2d"),
        Rule("layernorm.{w}", "ln_f.{w}"),
        Rule("pooler.dense.{w}", "pooler.{w}"),
    )
    + VIT_LAYER_WEIGHT_MAP.prefixed("layers.{i}.", "blocks.{i}.").rules,
)
