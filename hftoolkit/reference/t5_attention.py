"""T5 attention: no 1/sqrt(d_k) scaling, and a learned bias per (relative distance bucket, head).

T5 adds no position vectors to its inputs. Instead every attention score gets a
scalar bias that depends only on the distance `key position - query position`,
looked up from a small table: one row per distance bucket, one column per head.
Nearby distances each get their own bucket; farther ones share logarithmically
wider buckets, and everything beyond `max_distance` shares the last one. An
encoder (bidirectional) spends half its buckets on keys to the right; a decoder
(causal) only needs distances to the left.

Only the first layer owns the table; the HF model passes its bias on to later
layers. T5 also drops the 1/sqrt(d_k) factor (its initialisation absorbs it).

Mirrors T5Attention in transformers/models/t5/modeling_t5.py
(`_relative_position_bucket`, `compute_bias`); Raffel et al., 2020, section 2.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hftoolkit.reference.attention import scaled_dot_product_attention
from hftoolkit.reference.weight_map import Rule, WeightMap


@dataclass
class T5AttentionConfig:
    d_model: int = 32
    d_kv: int = 8  # per-head size; T5 does not require n_heads * d_kv == d_model
    n_heads: int = 4
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True  # encoder True, decoder False
    has_relative_bias: bool = True  # only the first layer of a stack owns the bias table


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """Map distances (key - query) to bucket ids in [0, num_buckets)."""
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket += (relative_position > 0).long() * num_buckets  # keys to the right use the upper half
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # a decoder only looks left; right is bucket 0
    max_exact = num_buckets // 2  # distances 0 .. max_exact-1 each get their own bucket
    if max_distance <= max_exact:  # the log spacing below would divide by log(1) = 0
        raise ValueError(
            f"max_distance={max_distance} must exceed the {max_exact} exactly-bucketed distances; raise it."
        )
    is_small = distance < max_exact
    # the rest: logarithmically spaced from max_exact up to max_distance, then all in the last bucket
    log_ratio = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, distance, large)


class T5Attention(nn.Module):
    """Multi-head attention with T5's relative position bias and no score scaling."""

    def __init__(self, config: T5AttentionConfig):
        super().__init__()
        self.config = config
        inner = config.n_heads * config.d_kv
        self.q = nn.Linear(config.d_model, inner, bias=False)
        self.k = nn.Linear(config.d_model, inner, bias=False)
        self.v = nn.Linear(config.d_model, inner, bias=False)
        self.o = nn.Linear(inner, config.d_model, bias=False)
        if config.has_relative_bias:
            self.relative_bias = nn.Embedding(config.num_buckets, config.n_heads)  # (buckets, nh)

    def position_bias(self, query_length: int, key_length: int) -> torch.Tensor:
        """(1, nh, T, S): the learned bias for every (query, key) pair."""
        c = self.config
        query_pos = torch.arange(query_length)[:, None]
        key_pos = torch.arange(key_length)[None, :]
        buckets = relative_position_bucket(key_pos - query_pos, c.bidirectional, c.num_buckets, c.max_distance)
        return self.relative_bias(buckets).permute(2, 0, 1)[None]  # (T, S, nh) -> (1, nh, T, S)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, position_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, d). Returns the output (B, T, d) and the bias used, for the next layer to reuse."""
        B, T, _ = x.shape
        c = self.config
        if position_bias is None:
            position_bias = self.position_bias(T, T) if c.has_relative_bias else torch.zeros(1, c.n_heads, T, T)
        q = self.q(x).view(B, T, c.n_heads, c.d_kv).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k(x).view(B, T, c.n_heads, c.d_kv).transpose(1, 2)  # (B, nh, T, hs)
        v = self.v(x).view(B, T, c.n_heads, c.d_kv).transpose(1, 2)  # (B, nh, T, hs)
        out, _ = scaled_dot_product_attention(q, k, v, mask, bias=position_bias, scale=1.0)  # (B, nh, T, hs)
        out = out.transpose(1, 2).reshape(B, T, c.n_heads * c.d_kv)  # (B, T, nh * hs)
        return self.o(out), position_bias


T5_ATTENTION_WEIGHT_MAP = WeightMap(
    "T5Attention",
    (
        Rule("q.weight", "q.weight"),
        Rule("k.weight", "k.weight"),
        Rule("v.weight", "v.weight"),
        Rule("o.weight", "o.weight"),
        Rule("relative_attention_bias.weight", "relative_bias.weight"),
    ),
)
