"""Encoder-decoder models (T5, BART and kin): translation, summarization, BART's denoising objective.

The output transforms a separate input, so an encoder reads the input with bidirectional
attention and a decoder writes the output, attending to it (the course's decision tree).
Labels are the target's token ids; the model makes its decoder inputs by shifting them right
(T5 `_shift_right`, BART `shift_tokens_right`), so the collator only pads.
"""

from __future__ import annotations

import zlib

from hftoolkit.errors import UserError
from hftoolkit.families import EvalMetrics, decoding_options
from hftoolkit.recipe import Recipe

# Shipped evaluate module -> the scores of it that go into metrics.json (the first is its main score).
METRIC_SCORES = {"sacrebleu": ("bleu",), "chrf": ("chrf",), "rouge": ("rougeL", "rouge1", "rouge2")}
TASK_METRICS = {"translation": ["sacrebleu", "chrf"], "summarization": ["rouge"]}


def load_model(recipe: Recipe):
    """Tokenizer and seq2seq LM; LoRA on the attention q and v projections (modeling.LORA_TARGETS)."""
    import transformers as tf

    from hftoolkit import modeling

    tokenizer = tf.AutoTokenizer.from_pretrained(modeling.resolve_checkpoint(recipe), revision=recipe.model.revision)
    # The LM head is the pretrained output projection (tied to the embeddings in T5 and BART): no new head.
    model = modeling.load_task_model(tf.AutoModelForSeq2SeqLM, recipe, "SEQ_2_SEQ_LM", with_head=False)
    return model, tokenizer


def preprocess(recipe: Recipe, tokenizer, dataset):
    """Token ids of the input (source_prefix + text, data.max_length) and of the labels.

    translation, summarization: labels are the target, truncated to data.max_target_length.
    denoise: the clean text (truncated to data.max_length) is the label; the input is its noised
    copy (noising.py), made once here with a generator seeded by training.seed, the row index and
    the text, so a run is reproducible and the eval split is noised the same way every time.
    """
    d = recipe.data
    if recipe.task == "denoise":
        return _preprocess_denoise(recipe, tokenizer, dataset)

    def encode(batch):
        enc = tokenizer([d.source_prefix + t for t in batch["text"]], truncation=True, max_length=d.max_length)
        enc["labels"] = tokenizer(text_target=batch["target"], truncation=True,
                                  max_length=d.max_target_length)["input_ids"]
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names)


def _preprocess_denoise(recipe: Recipe, tokenizer, dataset):
    import numpy as np

    from hftoolkit.families import noising

    if tokenizer.mask_token_id is None:
        raise UserError(f"model.checkpoint: the tokenizer of {recipe.model.checkpoint} has no mask token, which "
                        "task 'denoise' (BART's text infilling) needs: use a bart checkpoint")
    special = set(tokenizer.all_special_ids)
    ends: dict[int, bool] = {}

    def is_sentence_end(token: int) -> bool:
        if token not in ends:
            ends[token] = tokenizer.decode([token]).rstrip().endswith(noising.SENTENCE_END)
        return ends[token]

    def encode(batch, indices):
        clean = tokenizer(batch["text"], truncation=True, max_length=recipe.data.max_length)["input_ids"]
        noised = []
        for ids, index, text in zip(clean, indices, batch["text"]):
            rng = np.random.default_rng([recipe.training.seed, index, zlib.crc32(text.encode())])
            noised.append(noising.noise(ids, special, tokenizer.mask_token_id, is_sentence_end, rng))
        return {"input_ids": noised, "attention_mask": [[1] * len(ids) for ids in noised],
                "labels": clean, "length": [len(ids) for ids in noised]}

    return dataset.map(encode, batched=True, with_indices=True, remove_columns=dataset.column_names)


def collator(recipe: Recipe, tokenizer):
    """Pads inputs with the pad token and labels with -100 (ignored by the loss).

    With label smoothing the Trainer takes the labels away from the model to compute the loss
    itself, so the model can't shift them into decoder inputs: the collator does it then.
    """
    from transformers import DataCollatorForSeq2Seq

    pad = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)
    if not recipe.training.label_smoothing:
        return pad
    start = _decoder_start_token_id(recipe)

    def pad_and_shift(features):
        batch = pad(features)
        labels = batch["labels"]
        shifted = labels.new_full(labels.shape, start)
        shifted[:, 1:] = labels[:, :-1]
        batch["decoder_input_ids"] = shifted.masked_fill(shifted == -100, tokenizer.pad_token_id)
        return batch

    return pad_and_shift


def _decoder_start_token_id(recipe: Recipe) -> int:
    from transformers import AutoConfig

    from hftoolkit import modeling

    config = AutoConfig.from_pretrained(modeling.resolve_checkpoint(recipe), revision=recipe.model.revision)
    return config.decoder_start_token_id


def metrics(recipe: Recipe, tokenizer) -> EvalMetrics:
    """BLEU and chrF (translation) or ROUGE (summarization) on generated text; perplexity for denoise.

    Generation tasks are scored by train.py on family.generate's text over the whole eval split,
    so the Trainer's own evaluation computes the loss only and gathers no logits.
    """
    if recipe.task == "denoise":
        return EvalMetrics(None, main="perplexity", greater_is_better=False)
    from hftoolkit.metrics import load_metric

    names = TASK_METRICS[recipe.task] if recipe.eval.metrics == "auto" else recipe.eval.metrics
    modules = {name: load_metric(name) for name in names}

    def compute(predictions: list[str], references: list[str]) -> dict:
        out = {}
        for name, module in modules.items():
            scores = module.compute(predictions=predictions, references=references)
            keep = METRIC_SCORES.get(name) or [k for k, v in scores.items() if isinstance(v, (int, float))]
            out.update({k: float(scores[k]) for k in keep})
        return out

    main = (METRIC_SCORES.get(names[0]) or (names[0],))[0]
    return EvalMetrics(compute, main=main)


def generate(recipe: Recipe, model, tokenizer, inputs: list[str]) -> list[dict]:
    """Generated text for each input (source_prefix added), decoded as eval.generation says.

    Inputs go in batches of eval.batch_size sorted by length (less padding); outputs come back
    in input order. Sampling is seeded with training.seed, so predictions are reproducible.
    """
    import torch

    if not inputs:
        return []
    model.eval()
    prefixed = [recipe.data.source_prefix + text for text in inputs]
    encoded = tokenizer(prefixed, truncation=True, max_length=recipe.data.max_length)["input_ids"]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    texts: list[str | None] = [None] * len(encoded)
    size = recipe.eval.batch_size
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(recipe.training.seed)
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in chunk]}, return_tensors="pt").to(model.device)
            generated = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                       **decoding_options(recipe.eval.generation))
            for i, text in zip(chunk, tokenizer.batch_decode(generated, skip_special_tokens=True)):
                texts[i] = text.strip()
    return [{"text": text} for text in texts]
