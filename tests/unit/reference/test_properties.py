"""Properties over random shapes and masks (hypothesis), beyond the fixed inputs of the parity rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.t5.modeling_t5 import T5Attention

from hftoolkit.reference import attention, norm, t5_attention
from tests.helpers.reference import assert_close

shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.integers(1, 16))


@settings(max_examples=30, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), causal=st.booleans())
def test_sdpa_equals_torch_for_any_padding(shape, seed, causal):
    B, nh, T, S, hs = shape
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nh, T, hs, generator=generator)
    k, v = torch.randn(2, B, nh, S, hs, generator=generator)
    lengths = torch.randint(1, S + 1, (B,), generator=generator)  # every row keeps at least key 0
    mask = attention.padding_mask((torch.arange(S)[None] < lengths[:, None]).long())
    if causal:
        mask = mask & attention.causal_mask(T, S)
    ours, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    assert_close(ours, F.scaled_dot_product_attention(q, k, v, mask), 1e-5, "sdpa")
    assert torch.allclose(weights.sum(-1), torch.ones(B, nh, T)) and (weights[~mask.expand_as(weights)] == 0).all()


@settings(max_examples=30, deadline=None)
@given(d=st.integers(2, 64), scale=st.floats(0.1, 100.0), seed=st.integers(0, 2**16))
def test_layernorm_equals_torch_at_any_scale(d, scale, seed):
    x = scale * torch.randn(3, d, generator=torch.Generator().manual_seed(seed))
    assert_close(norm.LayerNorm(d)(x), torch.nn.LayerNorm(d)(x), 1e-5 * max(1.0, scale / 10), "LayerNorm")


@settings(max_examples=30, deadline=None)
@given(bidirectional=st.booleans(), buckets=st.sampled_from([8, 16, 32]), max_distance=st.sampled_from([16, 64, 128]))
def test_t5_buckets_equal_transformers_for_any_setting(bidirectional, buckets, max_distance):
    distances = torch.arange(-400, 401)
    max_exact = buckets // 4 if bidirectional else buckets // 2
    if max_distance <= max_exact:  # transformers silently returns garbage ids (about -9.2e18) here
        with pytest.raises(ValueError, match="max_distance"):
            t5_attention.relative_position_bucket(distances, bidirectional, buckets, max_distance)
        return
    ours = t5_attention.relative_position_bucket(distances, bidirectional, buckets, max_distance)
    assert torch.equal(ours, T5Attention._relative_position_bucket(distances, bidirectional, buckets, max_distance))
    assert ours.min() >= 0 and ours.max() < buckets
