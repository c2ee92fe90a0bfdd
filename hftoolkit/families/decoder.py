"""Decoder-only models (GPT-2 and kin): causal language modelling.

The output continues a prompt, so each token attends only to the tokens before it
(the course's decision tree). Training is next-token prediction on the text itself:
`labels` are the input ids and the model shifts them by one inside its loss; eval
reports perplexity = exp(eval loss) (train.py), and predictions are continuations.
"""

from __future__ import annotations

from hftoolkit.errors import UserError
from hftoolkit.families import EvalMetrics, decoding_options
from hftoolkit.recipe import Recipe

# Label id the loss ignores (torch's cross_entropy ignore_index): padding positions get it.
IGNORE_INDEX = -100


def load_model(recipe: Recipe):
    """Tokenizer (pad = eos where the checkpoint has no pad token, as GPT-2) and causal-LM model with LoRA.

    The LM head is tied to the input embeddings, so there is no separate head to keep trainable.
    """
    import transformers as tf

    from hftoolkit import modeling

    tokenizer = tf.AutoTokenizer.from_pretrained(modeling.resolve_checkpoint(recipe), revision=recipe.model.revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = modeling.load_task_model(tf.AutoModelForCausalLM, recipe, "CAUSAL_LM", with_head=False)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # Tell the model which id pads, so the Trainer need not realign (and warn about) its configs.
    base.config.pad_token_id = base.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def preprocess(recipe: Recipe, tokenizer, dataset):
    """Token ids with labels = input ids, and a "length" column.

    data.packing true: every text is tokenized, followed by eos, all concatenated and cut into blocks
    of exactly data.max_length tokens; the remainder shorter than a block is dropped (no padding at all).
    data.packing false: one example per text, truncated to data.max_length (eos appended when it fits);
    the collator pads per batch and masks the padding out of the loss.
    """
    if recipe.task != "clm":
        raise NotImplementedError(f"decoder task {recipe.task}")
    size = recipe.data.max_length
    eos = tokenizer.eos_token_id

    def pack(batch):
        ids = [i for text_ids in tokenizer(batch["text"])["input_ids"] for i in [*text_ids, eos]]
        blocks = [ids[start:start + size] for start in range(0, len(ids) - size + 1, size)]
        return {"input_ids": blocks, "attention_mask": [[1] * size for _ in blocks],
                "labels": [list(b) for b in blocks], "length": [size] * len(blocks)}

    def truncate(batch):
        ids = [x + [eos] for x in tokenizer(batch["text"], truncation=True, max_length=max(size - 1, 1))["input_ids"]]
        return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids],
                "labels": [list(x) for x in ids], "length": [len(x) for x in ids]}

    encode = pack if recipe.data.packing else truncate
    # batch_size=None: the whole split is one batch, so packing concatenates across every document.
    encoded = dataset.map(encode, batched=True, batch_size=None, remove_columns=dataset.column_names)
    if len(encoded) == 0 and recipe.data.packing:
        tokens = sum(len(ids) + 1 for ids in tokenizer(list(dataset["text"]))["input_ids"])
        raise UserError(f"data.max_length: packing cuts blocks of {size} tokens, but a split of {recipe.data.train} "
                        f"holds only {tokens}: lower data.max_length, or add text (or a larger data.eval_fraction)")
    return encoded


def collator(recipe: Recipe, tokenizer):
    """Pads input ids and attention mask per batch (right side), and labels with -100 so padding has no loss.

    DataCollatorForSeq2Seq does exactly that for any "labels" column. DataCollatorForLanguageModeling would
    instead mask every label equal to the pad token, which for GPT-2 (pad = eos) also hides the real eos.
    """
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")


def metrics(recipe: Recipe, tokenizer) -> EvalMetrics:
    """Perplexity only, from the eval loss (train.py). No compute function, so the Trainer evaluates with
    prediction_loss_only and never gathers the (tokens x vocabulary) logits."""
    return EvalMetrics(compute=None, main="perplexity", greater_is_better=False)


def generate(recipe: Recipe, model, tokenizer, inputs: list[str], prompt_fraction: float = 1.0) -> list[dict]:
    """Continuation of each input, decoded with recipe.eval.generation; the prompt is not repeated.

    prompt_fraction < 1 prompts with only the first fraction of each input's tokens (at least one):
    train.py passes 0.25 for eval texts, which are whole documents, so the record shows the model
    continuing the first quarter of a real text ("prompt" in the output). Batches are left-padded
    so every prompt ends at the last position, where generation starts.
    """
    import torch

    model.eval()
    kwargs = dict(decoding_options(recipe.eval.generation), pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    # Room for the new tokens inside the model's context: prompts keep their last tokens.
    context = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", 1024)
    room = max(1, min(recipe.data.max_length, context - recipe.eval.generation.max_new_tokens))
    prompts = []
    for ids in tokenizer(list(inputs), add_special_tokens=True)["input_ids"]:
        ids = ids or [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
        if prompt_fraction < 1:
            ids = ids[:max(1, int(len(ids) * prompt_fraction))]
        prompts.append(ids[-room:])
    out = []
    for start in range(0, len(prompts), recipe.eval.batch_size):
        chunk = prompts[start:start + recipe.eval.batch_size]
        batch = tokenizer.pad({"input_ids": chunk}, padding=True, padding_side="left", return_tensors="pt")
        batch = batch.to(model.device)
        with torch.no_grad():
            generated = model.generate(**batch, **kwargs)
        new_tokens = generated[:, batch["input_ids"].shape[1]:]
        texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        for ids, text in zip(chunk, texts):
            shown = {"prompt": tokenizer.decode(ids, skip_special_tokens=True)} if prompt_fraction < 1 else {}
            out.append({**shown, "text": text})
    return out
