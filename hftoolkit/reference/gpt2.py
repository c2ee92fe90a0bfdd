"""GPT-2: a decoder-only stack of pre-LN blocks with causal self-attention and a tied LM head.

    h = token[x_t] + position[t]
    h = pre-LN block(h, causal mask & padding mask)   x n_layers
    logits = LN_f(h) @ token^T                         (the output layer reuses the input embedding)

Position t sees tokens 0..t only, so one forward pass trains every next-token
prediction at once (objectives.py, `causal_lm_loss`) and generation can append
one token at a time (decoding.py). GPT-2 stores its linear layers as Conv1D with
(in, out) weights and fuses Q, K, V into one matrix: the weight map transposes
and splits them (attention.py, `ATTENTION_WEIGHT_MAPS["GPT2Attention"]`).

Mirrors GPT2LMHeadModel in transformers/models/gpt2/modeling_gpt2.py and nanoGPT's
model.py; Radford et al., 2019.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hftoolkit.reference.attention import causal_mask, padding_mask
from hftoolkit.reference.blocks import GPT2_BLOCK_WEIGHT_MAP, BlockConfig, TransformerBlock
from hftoolkit.reference.norm import LayerNorm
from hftoolkit.reference.weight_map import Rule, WeightMap


@dataclass
class GPT2Config:
    vocab_size: int = 100
    max_positions: int = 64
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128  # 4 * d_model
    act: str = "gelu_tanh"  # GPT-2's "gelu_new"
    eps: float = 1e-5

    @classmethod
    def from_hf(cls, hf: Any) -> GPT2Config:
        """Read the fields that matter from a transformers.GPT2Config."""
        if hf.activation_function != "gelu_new":
            raise ValueError(
                f"GPT2Config.activation_function={hf.activation_function!r}: the reference implements only gelu_new."
            )
        return cls(
            vocab_size=hf.vocab_size,
            max_positions=hf.n_positions,
            d_model=hf.n_embd,
            n_layers=hf.n_layer,
            n_heads=hf.n_head,
            d_ff=hf.n_inner or 4 * hf.n_embd,
            eps=hf.layer_norm_epsilon,
        )


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        c = config
        self.token = nn.Embedding(c.vocab_size, c.d_model)
        self.position = nn.Embedding(c.max_positions, c.d_model)
        block = BlockConfig(c.d_model, c.n_heads, c.d_ff, c.act, pre_norm=True, eps=c.eps)
        self.blocks = nn.ModuleList(TransformerBlock(block) for _ in range(c.n_layers))
        self.ln_f = LayerNorm(c.d_model, c.eps)  # pre-LN leaves the last residual un-normalised
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.token.weight  # weight tying: one matrix embeds and un-embeds

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: (B, T) -> next-token logits (B, T, vocab)."""
        B, T = input_ids.shape
        h = self.token(input_ids) + self.position(torch.arange(T))  # (B, T, d)
        mask = causal_mask(T)  # (1, 1, T, T)
        if attention_mask is not None:
            mask = mask & padding_mask(attention_mask)  # (B, 1, T, T)
        for block in self.blocks:
            h = block(h, mask)
        return self.lm_head(self.ln_f(h))  # (B, T, vocab)


GPT2_WEIGHT_MAP = WeightMap(
    "GPT2LMHeadModel",
    (
        Rule("transformer.wte.weight", "token.weight"),
        Rule("transformer.wpe.weight", "position.weight"),
        Rule("transformer.ln_f.{w}", "ln_f.{w}"),
        Rule("lm_head.weight", "lm_head.weight"),  # tied to wte in both models: the same tensor twice
    )
    + GPT2_BLOCK_WEIGHT_MAP.prefixed("transformer.h.{i}.", "blocks.{i}.").rules,
)
