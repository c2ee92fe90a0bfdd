"""BERT: an encoder-only stack of post-LN blocks with bidirectional (padding-only) attention.

    embeddings = LN(word[token] + position[i] + token_type[segment])
    h = post-LN block(h, padding mask)   x n_layers
    pooled = tanh(W h[CLS] + b)          (the [CLS] summary used for sentence tasks)

Every token sees every other real token: there is no causal mask, which is what
makes masked-language-model pre-training possible (objectives.py, `mlm_mask`).

Mirrors BertModel in transformers/models/bert/modeling_bert.py; Devlin et al., 2019.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hftoolkit.reference.attention import padding_mask
from hftoolkit.reference.blocks import BERT_LAYER_WEIGHT_MAP, BlockConfig, TransformerBlock
from hftoolkit.reference.norm import LayerNorm
from hftoolkit.reference.weight_map import Rule, WeightMap


@dataclass
class BertConfig:
    vocab_size: int = 100
    max_positions: int = 512
    type_vocab_size: int = 2
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 64
    act: str = "gelu"
    eps: float = 1e-12

    @classmethod
    def from_hf(cls, hf: Any) -> BertConfig:
        """Read the fields that matter from a transformers.BertConfig."""
        return cls(
            vocab_size=hf.vocab_size,
            max_positions=hf.max_position_embeddings,
            type_vocab_size=hf.type_vocab_size,
            d_model=hf.hidden_size,
            n_layers=hf.num_hidden_layers,
            n_heads=hf.num_attention_heads,
            d_ff=hf.intermediate_size,
            act=hf.hidden_act,
            eps=hf.layer_norm_eps,
        )


class Bert(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        self.word = nn.Embedding(c.vocab_size, c.d_model)
        self.position = nn.Embedding(c.max_positions, c.d_model)  # learned positions
        self.token_type = nn.Embedding(c.type_vocab_size, c.d_model)  # sentence A / sentence B
        self.ln_embed = LayerNorm(c.d_model, c.eps)
        block = BlockConfig(c.d_model, c.n_heads, c.d_ff, c.act, pre_norm=False, eps=c.eps)
        self.blocks = nn.ModuleList(TransformerBlock(block) for _ in range(c.n_layers))
        self.pooler = nn.Linear(c.d_model, c.d_model)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids: (B, T). Returns the last hidden state (B, T, d) and the pooled [CLS] vector (B, d)."""
        B, T = input_ids.shape
        token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        h = self.word(input_ids) + self.position(torch.arange(T)) + self.token_type(token_type_ids)  # (B, T, d)
        h = self.ln_embed(h)
        mask = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, T)
        for block in self.blocks:
            h = block(h, mask)
        pooled = torch.tanh(self.pooler(h[:, 0]))  # (B, d): the first token, [CLS]
        return h, pooled


BERT_WEIGHT_MAP = WeightMap(
    "BertModel",
    (
        Rule("embeddings.word_embeddings.weight", "word.weight"),
        Rule("embeddings.position_embeddings.weight", "position.weight"),
        Rule("embeddings.token_type_embeddings.weight", "token_type.weight"),
        Rule("embeddings.LayerNorm.{w}", "ln_embed.{w}"),
        Rule("pooler.dense.{w}", "pooler.{w}"),
    )
    + BERT_LAYER_WEIGHT_MAP.prefixed("encoder.layer.{i}.", "blocks.{i}.").rules,
)
