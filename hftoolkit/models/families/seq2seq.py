"""Encoder-decoder models (T5, BART and kin): translation, summarization, instructions (as FLAN-T5 was tuned:
the instruction is the input, the answer the target), BART's denoising objective, and classification with BART's
or T5's classification head (labels.py). The output transforms a separate input, so an encoder reads the input
with bidirectional attention and a decoder writes the output, attending to it (the course's decision tree).
"""

from __future__ import annotations

import zlib

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics
from hftoolkit.models import tokenized
from hftoolkit.models.families import decoding_options, labels
from hftoolkit.sources.labels import IGNORE_INDEX


class Seq2SeqGeneration:
    """Translation, summarization and instructions: the target is written by the decoder, scored on generated
    text."""

    def load_model(self, job: Job):
        """Tokenizer and seq2seq LM; LoRA on the attention q and v projections (lora.targets)."""
        import transformers as tf

        from hftoolkit.models import loading

        # The LM head is the pretrained output projection (tied to the embeddings in T5 and BART): no new head.
        model = loading.load_task_model(tf.AutoModelForSeq2SeqLM, job, "SEQ_2_SEQ_LM", with_head=False)
        return model, job.model.processor

    def preprocess(self, job: Job, tokenizer, dataset):
        """Token ids of the input (source_prefix + text, data.max_length) and of the target (max_target_length)."""
        d = job.recipe.data

        def encode(batch):
            enc = tokenizer([d.source_prefix + t for t in batch["text"]], truncation=True, max_length=job.max_length)
            enc["labels"] = tokenizer(text_target=batch["target"], truncation=True,
                                      max_length=job.max_target_length)["input_ids"]
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            return enc

        return tokenized.encode(job, tokenizer, dataset, encode)

    def collator(self, job: Job, tokenizer):
        return _padding_collator(job, tokenizer)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        """BLEU and chrF (translation) or ROUGE (summarization) on generated text."""
        from hftoolkit.metrics import text_metrics

        return text_metrics(labels.metric_names(job))

    def generate(self, job: Job, model, tokenizer, inputs: list[str]) -> list[dict]:
        return _generate(job, model, tokenizer, inputs)


class Denoise:
    """BART's pretraining objective: the clean text is the label, its noised copy (noising.py) the input.

    The noise is made once in preprocess, with a generator seeded by training.seed, the row index
    and the text, so a run is reproducible and the eval split is noised the same way every time.
    Scored by perplexity.
    """

    def load_model(self, job: Job):
        return SEQ2SEQ.load_model(job)

    def preprocess(self, job: Job, tokenizer, dataset):
        return _preprocess_denoise(job, tokenizer, dataset)

    def collator(self, job: Job, tokenizer):
        return _padding_collator(job, tokenizer)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        return EvalMetrics(None, main="perplexity", greater_is_better=False)

    def generate(self, job: Job, model, tokenizer, inputs: list[str]) -> list[dict]:
        return _generate(job, model, tokenizer, inputs)


SEQ2SEQ = Seq2SeqGeneration()
FORMULATIONS = {tasks.TRANSLATION: SEQ2SEQ, tasks.SUMMARIZATION: SEQ2SEQ, tasks.INSTRUCTION: SEQ2SEQ,
                tasks.DENOISE: Denoise(), tasks.CLASSIFICATION: labels.CLASSIFICATION,
                tasks.REGRESSION: labels.REGRESSION}


# ---------------------------------------------------------------- shared parts


def _preprocess_denoise(job: Job, tokenizer, dataset):
    import numpy as np

    from hftoolkit.models.families import noising

    if tokenizer.mask_token_id is None:
        raise UserError(f"model.checkpoint: the tokenizer of {job.recipe.model.checkpoint} has no mask token, which "
                        "task 'denoise' (BART's text infilling) needs: use a bart checkpoint")
    special = set(tokenizer.all_special_ids)
    ends: dict[int, bool] = {}

    def is_sentence_end(token: int) -> bool:
        if token not in ends:
            ends[token] = tokenizer.decode([token]).rstrip().endswith(noising.SENTENCE_END)
        return ends[token]

    def encode(batch, indices):
        clean = tokenizer(batch["text"], truncation=True, max_length=job.max_length)["input_ids"]
        noised = []
        for ids, index, text in zip(clean, indices, batch["text"]):
            rng = np.random.default_rng([job.recipe.training.seed, index, zlib.crc32(text.encode())])
            noised.append(noising.noise(ids, special, tokenizer.mask_token_id, is_sentence_end, rng))
        return {"input_ids": noised, "attention_mask": [[1] * len(ids) for ids in noised],
                "labels": clean, "length": [len(ids) for ids in noised]}

    return tokenized.encode(job, tokenizer, dataset, encode, with_indices=True, key_extra=(job.recipe.training.seed,))


def _padding_collator(job: Job, tokenizer):
    """Pads inputs with the pad token and labels with -100 (ignored by the loss).

    Labels are the target's token ids; the model makes its decoder inputs by shifting them right (T5's
    `_shift_right`, BART's `shift_tokens_right`), so the collator only pads. With label smoothing the Trainer
    takes the labels away from the model to compute the loss itself, so the model can't shift them into decoder
    inputs: the collator does it then.
    """
    from transformers import DataCollatorForSeq2Seq

    pad = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    if not job.recipe.training.label_smoothing:
        return pad
    start = _decoder_start_token_id(job)

    def pad_and_shift(features):
        batch = pad(features)
        labels = batch["labels"]
        shifted = labels.new_full(labels.shape, start)
        shifted[:, 1:] = labels[:, :-1]
        batch["decoder_input_ids"] = shifted.masked_fill(shifted == IGNORE_INDEX, tokenizer.pad_token_id)
        return batch

    return pad_and_shift


def _decoder_start_token_id(job: Job) -> int:
    return job.model.config.decoder_start_token_id


def _generate(job: Job, model, tokenizer, inputs: list[str]) -> list[dict]:
    """Generated text for each input (source_prefix added), decoded as eval.generation says.

    Inputs go in batches of eval.batch_size sorted by length (less padding); outputs come back
    in input order. Sampling is seeded with training.seed, so predictions are reproducible.
    """
    import torch

    if not inputs:
        return []
    model.eval()
    prefixed = [job.recipe.data.source_prefix + text for text in inputs]
    encoded = tokenizer(prefixed, truncation=True, max_length=job.max_length)["input_ids"]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    texts: list[str | None] = [None] * len(encoded)
    size = job.recipe.eval.batch_size
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(job.recipe.training.seed)
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in chunk]}, return_tensors="pt").to(model.device)
            generated = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                       **decoding_options(job))
            for i, text in zip(chunk, tokenizer.batch_decode(generated, skip_special_tokens=True)):
                texts[i] = text.strip()
    return [{"text": text} for text in texts]
