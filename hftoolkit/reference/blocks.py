"""Transformer blocks: attention and feed-forward sub-layers, each wrapped in a residual and a LayerNorm.

Where the LayerNorm sits is the one difference between the two styles:
    post-LN (Vaswani et al., 2017; BERT, BART):  x = LN(x + F(x))
    pre-LN  (GPT-2, ViT):                         x = x + F(LN(x))
Pre-LN leaves an identity path from input to output, which keeps deep stacks
trainable without warm-up (Xiong et al., 2020). A decoder block masks its
self-attention causally; an encoder-decoder's decoder block adds a third
sub-layer, cross-attention over the encoder output, with its own LayerNorm.

Mirrors BertLayer, GPT2Block and BartDecoderLayer in transformers
(models/bert/modeling_bert.py, models/gpt2/modeling_gpt2.py, models/bart/modeling_bart.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from hftoolkit.reference.attention import ATTENTION_WEIGHT_MAPS, MultiHeadAttention
from hftoolkit.reference.feedforward import FFN_WEIGHT_MAPS, FeedForward
from hftoolkit.reference.norm import LayerNorm
from hftoolkit.reference.weight_map import Rule, WeightMap


@dataclass
class BlockConfig:
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    act: str = "gelu"
    pre_norm: bool = False  # False: post-LN (BERT, BART); True: pre-LN (GPT-2, ViT)
    cross_attention: bool = False  # True in the decoder of an encoder-decoder model
    eps: float = 1e-5


class TransformerBlock(nn.Module):
    def __init__(self, config: BlockConfig):
        super().__init__()
        c = config
        self.pre_norm = c.pre_norm
        self.attn = MultiHeadAttention(c.d_model, c.n_heads)
        self.ln_attn = LayerNorm(c.d_model, c.eps)
        if c.cross_attention:
            self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads)
            self.ln_cross = LayerNorm(c.d_model, c.eps)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.act)
        self.ln_ffn = LayerNorm(c.d_model, c.eps)

    def sublayer(self, x: torch.Tensor, norm: LayerNorm, f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.pre_norm:
            return x + f(norm(x))  # pre-LN
        return norm(x + f(x))  # post-LN

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, d); mask: self-attention mask; context: (B, S, d) encoder output; context_mask: its padding."""
        x = self.sublayer(x, self.ln_attn, lambda h: self.attn(h, mask=mask))
        if context is not None:
            x = self.sublayer(x, self.ln_cross, lambda h: self.cross_attn(h, context, mask=context_mask))
        return self.sublayer(x, self.ln_ffn, self.ffn)  # (B, T, d)


def _attention(library: str, source: str, target: str) -> tuple[Rule, ...]:
    return ATTENTION_WEIGHT_MAPS[library].prefixed(source, target).rules


def _ffn(library: str, source: str) -> tuple[Rule, ...]:
    return FFN_WEIGHT_MAPS[library].prefixed(source, "ffn.").rules


BERT_LAYER_WEIGHT_MAP = WeightMap(
    "BertLayer",
    _attention("BertAttention", "attention.", "attn.")
    + (Rule("attention.output.LayerNorm.{w}", "ln_attn.{w}"),)
    + (Rule("intermediate.dense.{w}", "ffn.up.{w}"), Rule("output.dense.{w}", "ffn.down.{w}"))
    + (Rule("output.LayerNorm.{w}", "ln_ffn.{w}"),),
)

GPT2_BLOCK_WEIGHT_MAP = WeightMap(
    "GPT2Block",
    (Rule("ln_1.{w}", "ln_attn.{w}"),)
    + _attention("GPT2Attention", "attn.", "attn.")
    + (Rule("ln_2.{w}", "ln_ffn.{w}"),)
    + _ffn("GPT2MLP", "mlp."),
)

BART_DECODER_LAYER_WEIGHT_MAP = WeightMap(
    "BartDecoderLayer",
    _attention("BartAttention", "self_attn.", "attn.")
    + (Rule("self_attn_layer_norm.{w}", "ln_attn.{w}"),)
    + _attention("BartAttention", "encoder_attn.", "cross_attn.")
    + (Rule("encoder_attn_layer_norm.{w}", "ln_cross.{w}"),)
    + (Rule("fc1.{w}", "ffn.up.{w}"), Rule("fc2.{w}", "ffn.down.{w}"))
    + (Rule("final_layer_norm.{w}", "ln_ffn.{w}"),),
)
