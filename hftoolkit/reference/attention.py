"""Scaled dot-product attention, its masks, multi-head attention with W_O, and cross-attention.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V          (Vaswani et al., 2017, eq. 1)

The course prints the scale as `/ d_k`: the square root was lost when the page
was turned into text; the worked example ("scale by sqrt(4) = 2") uses the root.

Masks here are boolean, True where a query may look at a key, of any shape that
broadcasts to (B, nh, T, S). Blocked scores are set to the most negative float
rather than -inf: the softmax gives the same zeros wherever a row has at least
one visible key, and a fully masked row (a padded query in a padded batch) gives
a uniform row instead of NaN. The HF modules do the same with an additive mask
(transformers/models/bert/modeling_bert.py, `eager_attention_forward`).

Mirrors: torch.nn.functional.scaled_dot_product_attention; BertSelfAttention,
GPT2Attention and BartAttention in transformers (their eager paths).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hftoolkit.reference.weight_map import Rule, WeightMap


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) with 1 for real tokens and 0 for padding -> (B, 1, 1, S) bool: no query looks at padding."""
    return attention_mask.bool()[:, None, None, :]


def causal_mask(query_length: int, key_length: int | None = None) -> torch.Tensor:
    """(1, 1, T, S) bool, lower triangular: position i sees keys j <= i (the course's M_ij = 0 if j <= i)."""
    key_length = query_length if key_length is None else key_length
    return torch.ones(query_length, key_length, dtype=torch.bool).tril()[None, None]


def attention_weights(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Row-wise softmax of (already scaled) scores, blocked positions set to zero weight."""
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias, masked) v.

    Args:
        q: (B, nh, T, hs) queries; k, v: (B, nh, S, hs) keys and values.
        mask: bool, True = may attend, broadcastable to (B, nh, T, S).
        bias: additive scores, e.g. T5's relative position bias (1, nh, T, S).
        scale: defaults to 1/sqrt(hs); T5 passes 1.0.

    Returns:
        The output (B, nh, T, hs) and the attention weights (B, nh, T, S).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, S)
    if bias is not None:
        scores = scores + bias
    weights = attention_weights(scores, mask)  # (B, nh, T, S), rows sum to 1
    return weights @ v, weights  # (B, nh, T, hs)


class MultiHeadAttention(nn.Module):
    """h heads of attention in parallel, concatenated and mixed by the output projection W_O.

    Self-attention when `context` is None; cross-attention when `context` is the
    encoder's output: queries come from `x`, keys and values from `context`.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pick a divisor.")
        self.n_heads, self.head_size = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W_Q
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W_K
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # W_V
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)  # W_O

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (B, nh, T, hs): each head sees its own hs = d / nh slice."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)

    def forward(
        self, x: torch.Tensor, context: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (B, T, d); context: (B, S, d) or None; mask: bool broadcastable to (B, nh, T, S)."""
        source = x if context is None else context
        q = self.split_heads(self.q_proj(x))  # (B, nh, T, hs)
        k = self.split_heads(self.k_proj(source))  # (B, nh, S, hs)
        v = self.split_heads(self.v_proj(source))  # (B, nh, S, hs)
        out, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, nh, T, hs)
        B, _, T, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T, -1)  # (B, T, nh * hs): heads concatenated
        return self.o_proj(out)  # (B, T, d)


# Where each library keeps W_Q, W_K, W_V and W_O (keys relative to its attention module).
ATTENTION_WEIGHT_MAPS = {
    "BertAttention": WeightMap(
        "BertAttention",
        (
            Rule("self.query.{w}", "q_proj.{w}"),
            Rule("self.key.{w}", "k_proj.{w}"),
            Rule("self.value.{w}", "v_proj.{w}"),
            Rule("output.dense.{w}", "o_proj.{w}"),
        ),
        ignore=(("output.LayerNorm.{w}", "the residual LayerNorm belongs to the block (blocks.py)"),),
    ),
    # GPT-2 computes Q, K and V with one fused Conv1D of width 3d: split it in three, transpose each.
    "GPT2Attention": WeightMap(
        "GPT2Attention",
        (
            Rule("c_attn.{w}", "q_proj.{w}", "conv1d", chunk=(0, 3)),
            Rule("c_attn.{w}", "k_proj.{w}", "conv1d", chunk=(1, 3)),
            Rule("c_attn.{w}", "v_proj.{w}", "conv1d", chunk=(2, 3)),
            Rule("c_proj.{w}", "o_proj.{w}", "conv1d"),
        ),
    ),
    "BartAttention": WeightMap(
        "BartAttention",
        (
            Rule("q_proj.{w}", "q_proj.{w}"),
            Rule("k_proj.{w}", "k_proj.{w}"),
            Rule("v_proj.{w}", "v_proj.{w}"),
            Rule("out_proj.{w}", "o_proj.{w}"),
        ),
    ),
    "ViTAttention": WeightMap(
        "ViTAttention",
        (
            Rule("q_proj.{w}", "q_proj.{w}"),
            Rule("k_proj.{w}", "k_proj.{w}"),
            Rule("v_proj.{w}", "v_proj.{w}"),
            Rule("o_proj.{w}", "o_proj.{w}"),
        ),
    ),
}
