"""Parity rows for whole models (BERT, GPT-2, ViT), LoRA, and decoding (greedy, top-k, top-p, beam search).

Whole models run with the attention implementation transformers picks by default
(SDPA on CPU), since that is what users run; every parameter is randomized first,
so that a LayerNorm left at ones or a bias left at zeros cannot hide a wrong mapping.
"""

from __future__ import annotations

import functools

import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from hftoolkit.reference import bert, decoding, gpt2, lora, vit
from hftoolkit.reference.parity import comparison
from hftoolkit.reference.parity_layers import FF, HEADS, D, lengths_mask, randomized
from hftoolkit.reference.weight_map import load_weights


def seeded(build):
    """Run a cached builder from seed 0 without touching the caller's random state."""

    @functools.wraps(build)
    def wrapper(*args):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return build(*args)

    return wrapper


# --- BERT ----------------------------------------------------------------------------------------


@functools.cache
@seeded
def _bert_outputs() -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    config = transformers.BertConfig(
        hidden_size=D, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=FF, vocab_size=100
    )
    hf = randomized(transformers.BertModel(config))
    ours = load_weights(bert.Bert(bert.BertConfig.from_hf(config)), hf.state_dict(), bert.BERT_WEIGHT_MAP).eval()
    ids, types, mask = torch.randint(100, (2, 9)), torch.randint(2, (2, 9)), lengths_mask([9, 6], 9)
    library = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    with torch.no_grad():
        return ours(ids, mask, types), (library.last_hidden_state.detach(), library.pooler_output.detach())


@comparison("bert.last_hidden_state", "BertModel.last_hidden_state", "model")
def bert_last_hidden_state():
    ours, library = _bert_outputs()
    return ours[0], library[0]


@comparison("bert.pooled", "BertModel.pooler_output", "model")
def bert_pooled():
    ours, library = _bert_outputs()
    return ours[1], library[1]


# --- GPT-2 ---------------------------------------------------------------------------------------


@functools.cache
@seeded
def gpt2_pair(std: float = 0.2) -> tuple[gpt2.GPT2, transformers.GPT2LMHeadModel]:
    """A random GPT-2 and its reference copy; std=0.5 makes next-token distributions peaked (no near-ties)."""
    config = transformers.GPT2Config(
        n_embd=D, n_layer=2, n_head=HEADS, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    hf = randomized(transformers.GPT2LMHeadModel(config), std)
    ours = load_weights(gpt2.GPT2(gpt2.GPT2Config.from_hf(config)), hf.state_dict(), gpt2.GPT2_WEIGHT_MAP).eval()
    return ours, hf


@comparison("gpt2.logits", "GPT2LMHeadModel.logits", "model")
def gpt2_logits():
    ours, hf = gpt2_pair()
    ids, mask = torch.randint(100, (2, 9)), lengths_mask([9, 6], 9)
    return ours(ids, mask), hf(input_ids=ids, attention_mask=mask).logits


@comparison("gpt2.greedy_generate", "GPT2LMHeadModel.generate(do_sample=False)", "exact")
def gpt2_greedy():
    ours, hf = gpt2_pair(0.5)
    prompts = torch.randint(1, 100, (3, 4))
    with torch.no_grad():
        eos = int(decoding.greedy_decode(ours, prompts[:1], 3)[0, -1])  # so that rows end at different steps
        reference = decoding.greedy_decode(ours, prompts, 12, eos_token_id=eos, pad_token_id=0)
    library = hf.generate(
        prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=12, eos_token_id=eos,
        pad_token_id=0,
    )
    return reference, library


# --- ViT -----------------------------------------------------------------------------------------


@functools.cache
@seeded
def _vit_outputs() -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    config = transformers.ViTConfig(
        hidden_size=D, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=FF, image_size=16,
        patch_size=4,
    )
    hf = randomized(transformers.ViTModel(config))
    ours = load_weights(vit.ViT(vit.ViTConfig.from_hf(config)), hf.state_dict(), vit.VIT_WEIGHT_MAP).eval()
    images = torch.randn(2, 3, 16, 16)
    library = hf(pixel_values=images)
    with torch.no_grad():
        return ours(images), (library.last_hidden_state.detach(), library.pooler_output.detach())


@comparison("vit.last_hidden_state", "ViTModel.last_hidden_state", "model")
def vit_last_hidden_state():
    ours, library = _vit_outputs()
    return ours[0], library[0]


@comparison("vit.pooled", "ViTModel.pooler_output", "model")
def vit_pooled():
    ours, library = _vit_outputs()
    return ours[1], library[1]


# --- LoRA ----------------------------------------------------------------------------------------


def peft_lora_query(r: int = 4, alpha: float = 8.0) -> torch.nn.Module:
    """peft's lora.Linear wrapped around a tiny BERT's first query projection, with B made non-zero."""
    config = transformers.BertConfig(
        hidden_size=D, num_hidden_layers=1, num_attention_heads=HEADS, intermediate_size=FF, vocab_size=100
    )
    model = get_peft_model(transformers.BertModel(config), LoraConfig(r=r, lora_alpha=alpha, target_modules=["query"]))
    layer = model.base_model.model.encoder.layer[0].attention.self.query
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(0.0, 0.5)  # zero at init: make the adapter matter
    return layer


def reference_lora_from(layer: torch.nn.Module, r: int = 4, alpha: float = 8.0) -> lora.LoRALinear:
    ours = lora.LoRALinear(torch.nn.Linear(D, D), r=r, alpha=alpha)
    return load_weights(ours, layer.state_dict(), lora.PEFT_LORA_LINEAR_WEIGHT_MAP)


@comparison("lora.linear", "peft lora.Linear (r=4, alpha=8)", "layer")
def lora_linear():
    layer = peft_lora_query()
    x = torch.randn(2, 7, D)
    return reference_lora_from(layer)(x), layer(x)


@comparison("lora.merged", "peft merge() of the same adapter", "layer")
def lora_merged():
    layer = peft_lora_query()
    ours = reference_lora_from(layer).merged()
    layer.merge()
    x = torch.randn(2, 7, D)
    return ours(x), layer.base_layer(x)


@comparison("lora.count[d=4096,r=16]", "peft trainable parameters on one 4096x4096 Linear", "exact")
def lora_count_square():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096, bias=False))
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["0"]))
    trainable, _ = peft_model.get_nb_trainable_parameters()
    return torch.tensor([lora.lora_parameter_count(4096, 4096, 16)]), torch.tensor([trainable])


def roberta_base_lora_count() -> int:
    """LoRA parameters of the reference encoder at RoBERTa-base size, r=8 on W_q and W_v (built on meta: no memory)."""
    with torch.device("meta"):
        model = bert.Bert(bert.BertConfig(vocab_size=50265, max_positions=514, type_vocab_size=1, d_model=768,
                                          n_layers=12, n_heads=12, d_ff=3072))
        lora.apply_lora(model, ("q_proj", "v_proj"), r=8, alpha=16)
    return lora.trainable_parameters(model)


@comparison("lora.count[roberta-base,r=8,q+v]", "peft on RobertaModel(RobertaConfig()), target query+value", "exact")
def lora_count_roberta():
    with torch.device("meta"):
        model = transformers.RobertaModel(transformers.RobertaConfig(), add_pooling_layer=False)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"]))
    trainable, _ = peft_model.get_nb_trainable_parameters()
    return torch.tensor([roberta_base_lora_count()]), torch.tensor([trainable])


# --- decoding ------------------------------------------------------------------------------------


@comparison("decoding.top_k", "TopKLogitsWarper(top_k=5)", "layer")
def top_k():
    logits = 3.0 * torch.randn(4, 100)
    return decoding.top_k_filter(logits, 5), TopKLogitsWarper(5)(None, logits)


@comparison("decoding.top_p", "TopPLogitsWarper(top_p=0.9)", "layer")
def top_p():
    logits = 3.0 * torch.randn(4, 100)
    return decoding.top_p_filter(logits, 0.9), TopPLogitsWarper(0.9)(None, logits)


def beam_search_pair(
    length_penalty: float, num_beams: int = 4, max_new_tokens: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference beam search vs generate(num_beams, early_stopping=True), per prompt, sequences stacked.

    The EOS token is the one greedy decoding would emit third, so that hypotheses
    of different lengths compete and the length penalty matters.
    """
    ours, hf = gpt2_pair(0.5)
    settings = dict(num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty)
    ref_rows, lib_rows = [], []
    for prompt in torch.randint(1, 100, (3, 4)):
        with torch.no_grad():
            eos = int(decoding.greedy_decode(ours, prompt[None], 3)[0, -1])
            ref_rows.append(decoding.beam_search(ours, prompt, eos_token_id=eos, **settings))
        generated = hf.generate(
            prompt[None], attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long), early_stopping=True,
            eos_token_id=eos, pad_token_id=eos, do_sample=False, **settings,
        )
        lib_rows.append(generated[0])
    pad = functools.partial(torch.nn.utils.rnn.pad_sequence, batch_first=True, padding_value=-1)
    return pad(ref_rows), pad(lib_rows)


@comparison("decoding.beam_search[lp=1.0]", "GPT2LMHeadModel.generate(num_beams=4, length_penalty=1.0)", "exact")
def beam_search_lp1():
    return beam_search_pair(1.0)


@comparison("decoding.beam_search[lp=0.0]", "GPT2LMHeadModel.generate(num_beams=4, length_penalty=0.0)", "exact")
def beam_search_lp0():
    return beam_search_pair(0.0)


@comparison("decoding.beam_search[lp=2.0]", "GPT2LMHeadModel.generate(num_beams=4, length_penalty=2.0)", "exact")
def beam_search_lp2():
    return beam_search_pair(2.0)
