"""Packing and the labelled-only loss: a tiny random causal LM, prompt + answer examples, a tokenizer that has only
a pad id."""

from __future__ import annotations


def tiny_causal_lm(model_type: str):
    """A tiny random causal LM, with use_cache off as the Trainer sets it (TrainingArguments.use_cache): with a
    cache, transformers builds the mask from it and not from the position ids, and packed examples would leak."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if model_type == "llama":
        config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        model = LlamaForCausalLM(config)
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                           bos_token_id=1, eos_token_id=2))
    model.config.use_cache = False
    return model.eval()


def prompt_answer_examples(n: int = 7):
    """Prompt + answer examples of different lengths, the prompt's labels masked as instruction tuning does."""
    import random

    rng = random.Random(1)
    rows = []
    for _ in range(n):
        prompt, answer = rng.randint(2, 9), rng.randint(1, 12)
        ids = [rng.randrange(1, 97) for _ in range(prompt + answer)]
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:], "length": len(ids)})
    return rows


class PadOnlyTokenizer:
    """What the collators read of a tokenizer: its pad id."""

    pad_token_id = 0
