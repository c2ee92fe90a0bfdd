"""Positional information: the fixed sinusoidal encoding and learned position embeddings.

Self-attention is permutation-invariant, so order has to be added to the inputs.

Sinusoidal (Vaswani et al., 2017, section 3.5), for position i and pair index j:
    p[i, 2j]   = sin(i / 10000^(2j / d_model))
    p[i, 2j+1] = cos(i / 10000^(2j / d_model))
Sines and cosines interleave (even, odd dimensions), as in the paper and in
transformers' XLM/DistilBERT `create_sinusoidal_embeddings`; some codebases
(fairseq, Marian) put all sines first, which is the same information permuted.

Learned: one trainable vector per position, added to the token embedding
(BERT, GPT-2, ViT). BART keeps its table two rows longer and reads row
`position + 2`, a fairseq legacy (transformers/models/bart/modeling_bart.py,
BartLearnedPositionalEmbedding); `offset` reproduces it.
"""

from __future__ import annotations

import torch
from torch import nn

from hftoolkit.reference.weight_map import Rule, WeightMap


def sinusoidal_encoding(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """(n_positions, d_model) table of the fixed encoding; no parameters."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (T, 1)
    two_j = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d/2,): 2j
    angle = position / base ** (two_j / d_model)  # (T, d/2)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class LearnedPositionalEmbedding(nn.Module):
    """A trainable (n_positions, d_model) table read at rows offset, offset+1, ..."""

    def __init__(self, n_positions: int, d_model: int, offset: int = 0):
        super().__init__()
        self.offset = offset
        self.table = nn.Embedding(n_positions + offset, d_model)

    def forward(self, seq_len: int) -> torch.Tensor:
        """(T, d): the vectors of positions 0 .. T-1."""
        return self.table(torch.arange(seq_len) + self.offset)


BART_POSITIONS_WEIGHT_MAP = WeightMap("BartLearnedPositionalEmbedding", (Rule("weight", "table.weight"),))
