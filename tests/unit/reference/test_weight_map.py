"""The weight map fails loudly: unknown, missing and misshapen keys, all reported in one error."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.gpt2 import modeling_gpt2

from hftoolkit.reference import attention, blocks, gpt2
from hftoolkit.reference.parity_layers import HEADS, D, gpt2_config
from hftoolkit.reference.weight_map import Rule, WeightMap, WeightMapError, load_weights


def gpt2_block_state() -> dict[str, torch.Tensor]:
    return modeling_gpt2.GPT2Block(gpt2_config(), layer_idx=0).state_dict()


def reference_block() -> blocks.TransformerBlock:
    return blocks.TransformerBlock(blocks.BlockConfig(D, HEADS, 4 * D, "gelu_tanh", pre_norm=True))


def test_a_complete_state_dict_loads():
    state = gpt2_block_state()
    block = load_weights(reference_block(), state, blocks.GPT2_BLOCK_WEIGHT_MAP)
    loaded = block.state_dict()
    # every weight arrived where its rule sends it (Conv1D's layout transposed into nn.Linear's)
    assert torch.equal(loaded["ffn.up.weight"], state["mlp.c_fc.weight"].t())
    assert torch.equal(loaded["attn.o_proj.bias"], state["attn.c_proj.bias"])


def test_unknown_key_fails_loudly():
    state = gpt2_block_state() | {"attn.rotary.inv_freq": torch.zeros(4)}
    with pytest.raises(WeightMapError, match=r"unknown key 'attn\.rotary\.inv_freq'"):
        load_weights(reference_block(), state, blocks.GPT2_BLOCK_WEIGHT_MAP)


def test_missing_key_fails_loudly():
    state = gpt2_block_state()
    del state["ln_2.weight"]
    with pytest.raises(WeightMapError, match=r"missing key 'ln_ffn\.weight': it comes from 'ln_2\.weight'"):
        load_weights(reference_block(), state, blocks.GPT2_BLOCK_WEIGHT_MAP)


def test_misshapen_key_fails_loudly():
    state = gpt2_block_state()
    state["mlp.c_fc.weight"] = state["mlp.c_fc.weight"].t()  # as if someone forgot Conv1D's layout
    with pytest.raises(WeightMapError, match=r"misshapen key 'mlp\.c_fc\.weight'.*'ffn\.up\.weight'"):
        load_weights(reference_block(), state, blocks.GPT2_BLOCK_WEIGHT_MAP)


def test_every_problem_is_reported_at_once_and_nothing_is_copied():
    state = gpt2_block_state() | {"surprise": torch.zeros(1)}
    del state["ln_1.bias"]
    state["attn.c_proj.bias"] = torch.zeros(3)
    block = reference_block()
    before = {k: v.clone() for k, v in block.state_dict().items()}
    with pytest.raises(WeightMapError) as error:
        load_weights(block, state, blocks.GPT2_BLOCK_WEIGHT_MAP)
    message = str(error.value)
    assert "3 problems" in message
    assert "unknown key 'surprise'" in message and "missing key 'ln_attn.bias'" in message
    assert "misshapen key 'attn.c_proj.bias'" in message
    assert all(torch.equal(before[k], v) for k, v in block.state_dict().items()), "a failed load must copy nothing"


def test_a_rule_naming_a_reference_key_that_does_not_exist_is_an_error():
    broken = WeightMap("typo", blocks.GPT2_BLOCK_WEIGHT_MAP.rules[1:] + (Rule("ln_1.{w}", "ln_atn.{w}"),))
    with pytest.raises(WeightMapError, match="ln_atn.weight"):
        load_weights(reference_block(), gpt2_block_state(), broken)


def test_a_wrong_split_of_fused_qkv_loads_but_parity_catches_it():
    """Shapes cannot tell Q from K: only the live comparison can, which is why both exist."""
    right = attention.ATTENTION_WEIGHT_MAPS["GPT2Attention"]
    q_from_k = Rule("c_attn.{w}", "q_proj.{w}", "conv1d", chunk=(1, 3))
    k_from_q = Rule("c_attn.{w}", "k_proj.{w}", "conv1d", chunk=(0, 3))
    wrong = WeightMap("Q and K swapped", (q_from_k, k_from_q) + right.rules[2:])
    hf = modeling_gpt2.GPT2Attention(gpt2_config(), layer_idx=0).eval()
    good = load_weights(attention.MultiHeadAttention(D, HEADS), hf.state_dict(), right)
    bad = load_weights(attention.MultiHeadAttention(D, HEADS), hf.state_dict(), wrong)
    x, mask = torch.randn(2, 5, D), attention.causal_mask(5)
    assert not torch.allclose(good(x, mask=mask), bad(x, mask=mask), atol=1e-4)


def test_the_whole_gpt2_map_fits_a_model_with_tied_embeddings():
    config = transformers.GPT2Config(n_embd=D, n_layer=3, n_head=HEADS, vocab_size=50, n_positions=16)
    hf = transformers.GPT2LMHeadModel(config)
    ours = load_weights(gpt2.GPT2(gpt2.GPT2Config.from_hf(config)), hf.state_dict(), gpt2.GPT2_WEIGHT_MAP)
    assert ours.lm_head.weight is ours.token.weight
