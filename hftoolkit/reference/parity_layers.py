"""Parity rows for single layers: attention, T5 attention, positions, norms, feed-forward, blocks.

Layer-level HF modules are built with `attn_implementation="eager"` and given
the additive float masks their eager path expects (0 where attending, the most
negative float where blocked), built from the same boolean masks the reference uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers
from transformers.models.bart import modeling_bart
from transformers.models.bert import modeling_bert
from transformers.models.gpt2 import modeling_gpt2
from transformers.models.llama import modeling_llama
from transformers.models.t5 import modeling_t5
from transformers.models.vit import modeling_vit
from transformers.models.xlm import modeling_xlm

from hftoolkit.reference import attention, blocks, feedforward, norm, positional, t5_attention
from hftoolkit.reference.parity import comparison
from hftoolkit.reference.weight_map import Rule, WeightMap, load_weights

B, T, S, D, HEADS, FF = 2, 7, 5, 32, 4, 64


def additive(mask: torch.Tensor) -> torch.Tensor:
    """Boolean mask (True = attend) -> the additive float mask HF's eager attention adds to the scores."""
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def lengths_mask(lengths: list[int], total: int) -> torch.Tensor:
    """(B, total) of 1 for real tokens, 0 for right padding."""
    return (torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]).long()


def bert_config(**extra) -> transformers.BertConfig:
    return transformers.BertConfig(
        hidden_size=D, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=FF, vocab_size=100,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager", **extra,
    )


def gpt2_config(**extra) -> transformers.GPT2Config:
    return transformers.GPT2Config(
        n_embd=D, n_layer=2, n_head=HEADS, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager", **extra,
    )


def bart_config() -> transformers.BartConfig:
    return transformers.BartConfig(
        d_model=D, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
        encoder_ffn_dim=FF, decoder_ffn_dim=FF, vocab_size=100, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, attn_implementation="eager",
    )


def t5_config(is_decoder: bool) -> transformers.T5Config:
    return transformers.T5Config(
        d_model=D, d_kv=8, num_heads=HEADS, d_ff=FF, vocab_size=100, dropout_rate=0.0, is_decoder=is_decoder,
        attn_implementation="eager",
    )


def randomized(module: torch.nn.Module, std: float = 0.2) -> torch.nn.Module:
    """Give every parameter random values, so that default ones/zeros cannot hide a wrong mapping."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)
    return module.eval()


# --- scaled dot-product attention ---------------------------------------------------------------

def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.randn(B, HEADS, T, 8) for _ in range(3))


@comparison("attention.sdpa[padding]", "torch.nn.functional.scaled_dot_product_attention", "layer")
def sdpa_padding():
    q, k, v = _qkv()
    mask = attention.padding_mask(lengths_mask([7, 4], T))
    return attention.scaled_dot_product_attention(q, k, v, mask)[0], F.scaled_dot_product_attention(q, k, v, mask)


@comparison("attention.sdpa[causal]", "torch.nn.functional.scaled_dot_product_attention(is_causal=True)", "layer")
def sdpa_causal():
    q, k, v = _qkv()
    ours = attention.scaled_dot_product_attention(q, k, v, attention.causal_mask(T))[0]
    return ours, F.scaled_dot_product_attention(q, k, v, is_causal=True)


@comparison("attention.sdpa[padding+causal]", "torch.nn.functional.scaled_dot_product_attention", "layer")
def sdpa_padding_causal():
    q, k, v = _qkv()
    mask = attention.padding_mask(lengths_mask([7, 4], T)) & attention.causal_mask(T)
    return attention.scaled_dot_product_attention(q, k, v, mask)[0], F.scaled_dot_product_attention(q, k, v, mask)


# --- multi-head attention and cross-attention --------------------------------------------------

def _mha_from(library_module: torch.nn.Module, map_name: str) -> attention.MultiHeadAttention:
    ours = attention.MultiHeadAttention(D, HEADS)
    return load_weights(ours, library_module.state_dict(), attention.ATTENTION_WEIGHT_MAPS[map_name])


@comparison("attention.mha[bert]", "BertSelfAttention + BertSelfOutput.dense", "layer")
def mha_bert():
    hf = randomized(modeling_bert.BertAttention(bert_config()))
    x, mask = torch.randn(B, T, D), attention.padding_mask(lengths_mask([7, 4], T))
    library = hf.output.dense(hf.self(x, attention_mask=additive(mask))[0])  # W_O without the residual LayerNorm
    return _mha_from(hf, "BertAttention")(x, mask=mask), library


@comparison("attention.mha[gpt2]", "GPT2Attention (fused Conv1D c_attn, causal)", "layer")
def mha_gpt2():
    hf = randomized(modeling_gpt2.GPT2Attention(gpt2_config(), layer_idx=0))
    x = torch.randn(B, T, D)
    mask = attention.causal_mask(T) & attention.padding_mask(lengths_mask([7, 4], T))
    return _mha_from(hf, "GPT2Attention")(x, mask=mask), hf(x, attention_mask=additive(mask))[0]


@comparison("attention.mha[bart]", "BartAttention (self-attention)", "layer")
def mha_bart():
    hf = randomized(modeling_bart.BartAttention(D, HEADS, config=bart_config()))
    x, mask = torch.randn(B, T, D), attention.padding_mask(lengths_mask([7, 4], T))
    return _mha_from(hf, "BartAttention")(x, mask=mask), hf(x, attention_mask=additive(mask))[0]


@comparison("attention.cross[bart]", "BartAttention (key_value_states = encoder output)", "layer")
def cross_bart():
    hf = randomized(modeling_bart.BartAttention(D, HEADS, is_decoder=True, config=bart_config(), layer_idx=0))
    x, context = torch.randn(B, T, D), torch.randn(B, S, D)
    mask = attention.padding_mask(lengths_mask([5, 3], S))  # (B, 1, 1, S): encoder padding
    library = hf(x, key_value_states=context, attention_mask=additive(mask.expand(B, 1, T, S)))[0]
    return _mha_from(hf, "BartAttention")(x, context, mask=mask), library


# --- T5 attention --------------------------------------------------------------------------------

def _t5_pair(is_decoder: bool) -> tuple[t5_attention.T5Attention, torch.nn.Module]:
    hf = randomized(modeling_t5.T5Attention(t5_config(is_decoder), has_relative_attention_bias=True, layer_idx=0))
    ours = t5_attention.T5Attention(t5_attention.T5AttentionConfig(D, 8, HEADS, bidirectional=not is_decoder))
    return load_weights(ours, hf.state_dict(), t5_attention.T5_ATTENTION_WEIGHT_MAP), hf


T5_LENGTH = 40  # long enough to reach the logarithmic buckets (exact up to distance 8 or 16)


@comparison("t5_attention[encoder]", "T5Attention (bidirectional buckets, padding mask)", "layer")
def t5_encoder():
    ours, hf = _t5_pair(is_decoder=False)
    x, mask = torch.randn(B, T5_LENGTH, D), attention.padding_mask(lengths_mask([40, 25], T5_LENGTH))
    return ours(x, mask=mask)[0], hf(x, mask=additive(mask))[0]


@comparison("t5_attention[decoder]", "T5Attention (causal buckets, causal mask)", "layer")
def t5_decoder():
    ours, hf = _t5_pair(is_decoder=True)
    x, mask = torch.randn(B, T5_LENGTH, D), attention.causal_mask(T5_LENGTH)
    return ours(x, mask=mask)[0], hf(x, mask=additive(mask))[0]


@comparison("t5_attention.position_bias", "T5Attention.compute_bias", "layer")
def t5_bias():
    ours, hf = _t5_pair(is_decoder=False)
    return ours.position_bias(T5_LENGTH, T5_LENGTH), hf.compute_bias(T5_LENGTH, T5_LENGTH)


@comparison("t5_attention.buckets", "T5Attention._relative_position_bucket", "exact")
def t5_buckets():
    distances = torch.arange(-300, 301)
    ours = [t5_attention.relative_position_bucket(distances, b, 32, 128) for b in (True, False)]
    library = [modeling_t5.T5Attention._relative_position_bucket(distances, b, 32, 128) for b in (True, False)]
    return torch.stack(ours), torch.stack(library)


# --- positions -----------------------------------------------------------------------------------

@comparison("positional.sinusoidal", "XLM create_sinusoidal_embeddings", "layer")
def sinusoidal():
    library = modeling_xlm.create_sinusoidal_embeddings(64, 16, torch.empty(64, 16))
    return positional.sinusoidal_encoding(64, 16), library


@comparison("positional.learned", "BartLearnedPositionalEmbedding (offset 2)", "layer")
def learned_positions():
    hf = randomized(modeling_bart.BartLearnedPositionalEmbedding(20, D))
    ours = positional.LearnedPositionalEmbedding(20, D, offset=2)
    load_weights(ours, hf.state_dict(), positional.BART_POSITIONS_WEIGHT_MAP)
    return ours(T), hf(torch.zeros(1, T, dtype=torch.long))[0]


# --- norms ---------------------------------------------------------------------------------------

SAME_NAMES = WeightMap("same parameter names", (Rule("{w}", "{w}"),))


def _norm_pair(ours: torch.nn.Module, library: torch.nn.Module):
    randomized(library)
    load_weights(ours, library.state_dict(), SAME_NAMES)
    x = 3.0 * torch.randn(B, T, D) + 1.0
    return ours(x), library(x)


@comparison("norm.layernorm", "torch.nn.LayerNorm", "layer")
def layernorm():
    return _norm_pair(norm.LayerNorm(D, eps=1e-5), torch.nn.LayerNorm(D, eps=1e-5))


@comparison("norm.rmsnorm[torch]", "torch.nn.RMSNorm", "layer")
def rmsnorm_torch():
    return _norm_pair(norm.RMSNorm(D, eps=1e-6), torch.nn.RMSNorm(D, eps=1e-6))


@comparison("norm.rmsnorm[t5]", "T5LayerNorm", "layer")
def rmsnorm_t5():
    return _norm_pair(norm.RMSNorm(D, eps=1e-6), modeling_t5.T5LayerNorm(D, eps=1e-6))


# --- feed-forward --------------------------------------------------------------------------------

def _ffn_pair(ours: torch.nn.Module, library: torch.nn.Module, map_name: str):
    randomized(library)
    load_weights(ours, library.state_dict(), feedforward.FFN_WEIGHT_MAPS[map_name])
    x = torch.randn(B, T, D)
    return ours(x), library(x)


@comparison("feedforward.relu", "T5DenseActDense (ReLU, no biases)", "layer")
def ffn_relu():
    ours = feedforward.FeedForward(D, FF, "relu", bias=False)
    return _ffn_pair(ours, modeling_t5.T5DenseActDense(t5_config(False)), "T5DenseActDense")


@comparison("feedforward.gelu", "ViTMLP (exact GELU)", "layer")
def ffn_gelu():
    vit = transformers.ViTConfig(hidden_size=D, intermediate_size=FF, hidden_act="gelu")
    return _ffn_pair(feedforward.FeedForward(D, FF, "gelu"), modeling_vit.ViTMLP(vit), "ViTMLP")


@comparison("feedforward.gelu_tanh", "GPT2MLP (gelu_new, Conv1D)", "layer")
def ffn_gelu_tanh():
    return _ffn_pair(feedforward.FeedForward(D, FF, "gelu_tanh"), modeling_gpt2.GPT2MLP(FF, gpt2_config()), "GPT2MLP")


@comparison("feedforward.glu", "torch.nn.functional.glu", "layer")
def ffn_glu():
    ours = randomized(feedforward.GatedFeedForward(D, FF, "sigmoid"))
    x = torch.randn(B, T, D)
    library = ours.down(F.glu(torch.cat([ours.up(x), ours.gate(x)], dim=-1), dim=-1))  # glu(a|b) = a * sigmoid(b)
    return ours(x), library


@comparison("feedforward.swiglu", "LlamaMLP (SiLU gate)", "layer")
def ffn_swiglu():
    llama = transformers.LlamaConfig(hidden_size=D, intermediate_size=FF, hidden_act="silu")
    return _ffn_pair(feedforward.GatedFeedForward(D, FF, "silu"), modeling_llama.LlamaMLP(llama), "LlamaMLP")


@comparison("feedforward.geglu", "T5DenseGatedActDense (gated-gelu)", "layer")
def ffn_geglu():
    t5 = transformers.T5Config(d_model=D, d_ff=FF, feed_forward_proj="gated-gelu", dropout_rate=0.0)
    ours = feedforward.GatedFeedForward(D, FF, "gelu_tanh")  # T5 v1.1's "gated-gelu" uses gelu_new
    return _ffn_pair(ours, modeling_t5.T5DenseGatedActDense(t5), "T5DenseGatedActDense")


# --- blocks --------------------------------------------------------------------------------------

@comparison("blocks.post_ln_encoder", "BertLayer", "layer")
def post_ln_encoder():
    hf = randomized(modeling_bert.BertLayer(bert_config()))
    ours = blocks.TransformerBlock(blocks.BlockConfig(D, HEADS, FF, "gelu", pre_norm=False, eps=1e-12))
    load_weights(ours, hf.state_dict(), blocks.BERT_LAYER_WEIGHT_MAP)
    x, mask = torch.randn(B, T, D), attention.padding_mask(lengths_mask([7, 4], T))
    return ours(x, mask), hf(x, attention_mask=additive(mask))


@comparison("blocks.pre_ln_decoder", "GPT2Block (causal, Conv1D transposed)", "layer")
def pre_ln_decoder():
    hf = randomized(modeling_gpt2.GPT2Block(gpt2_config(), layer_idx=0))
    ours = blocks.TransformerBlock(blocks.BlockConfig(D, HEADS, 4 * D, "gelu_tanh", pre_norm=True))
    load_weights(ours, hf.state_dict(), blocks.GPT2_BLOCK_WEIGHT_MAP)
    x = torch.randn(B, T, D)
    mask = attention.causal_mask(T) & attention.padding_mask(lengths_mask([7, 4], T))
    return ours(x, mask), hf(x, attention_mask=additive(mask))


@comparison("blocks.cross_attention_decoder", "BartDecoderLayer", "layer")
def cross_attention_decoder():
    hf = randomized(modeling_bart.BartDecoderLayer(bart_config(), layer_idx=0))
    ours = blocks.TransformerBlock(blocks.BlockConfig(D, HEADS, FF, "gelu", pre_norm=False, cross_attention=True))
    load_weights(ours, hf.state_dict(), blocks.BART_DECODER_LAYER_WEIGHT_MAP)
    x, context = torch.randn(B, T, D), torch.randn(B, S, D)
    self_mask = attention.causal_mask(T) & attention.padding_mask(lengths_mask([7, 4], T))
    context_mask = attention.padding_mask(lengths_mask([5, 3], S))
    library = hf(
        x, attention_mask=additive(self_mask), encoder_hidden_states=context,
        encoder_attention_mask=additive(context_mask.expand(B, 1, T, S)), use_cache=False,
    )
    return ours(x, self_mask, context, context_mask), library
