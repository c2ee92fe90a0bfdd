"""Decoder-only models (GPT-2, Llama and kin): causal language modelling, and the other text tasks
written as one sequence: translation and summarization as prompt + target, classification and
tagging with transformers' decoder heads (labels.py).

The output continues a prompt, so each token attends only to the tokens before it (the course's
decision tree). Causal LM trains on the text itself (`labels` are the input ids; the model shifts
them by one inside its loss) and reports perplexity; prompt + target trains on the target only.
"""

from __future__ import annotations

from hftoolkit.errors import UserError
from hftoolkit.families import decoding_options, labels, load_tokenizer, sync_pad_token
from hftoolkit.metrics import EvalMetrics
from hftoolkit.recipe import Recipe

IGNORE_INDEX = labels.IGNORE_INDEX
# Between the source and the target of a prompt + target sequence (after data.source_prefix + text).
PROMPT_END = "\n"


def _load_causal_lm(recipe: Recipe):
    """Tokenizer (pad = eos where the checkpoint has none, as GPT-2) and causal-LM model with LoRA.

    The LM head is tied to the input embeddings, so there is no separate head to keep trainable.
    """
    import transformers as tf

    from hftoolkit import modeling

    tokenizer = load_tokenizer(recipe)
    model = modeling.load_task_model(tf.AutoModelForCausalLM, recipe, "CAUSAL_LM", with_head=False)
    sync_pad_token(model, tokenizer)
    return model, tokenizer


def _padding_collator(recipe: Recipe, tokenizer):
    """Pads input ids and attention mask per batch (right side), and labels with -100 so padding has no loss.

    DataCollatorForSeq2Seq does exactly that for any "labels" column. DataCollatorForLanguageModeling would
    instead mask every label equal to the pad token, which for GPT-2 (pad = eos) also hides the real eos.
    """
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")


class CausalLM:
    """Next-token prediction on the text itself; perplexity; predictions continue a prompt."""

    def load_model(self, recipe: Recipe):
        return _load_causal_lm(recipe)

    def preprocess(self, recipe: Recipe, tokenizer, dataset):
        """Token ids with labels = input ids, and a "length" column.

        data.packing true: every text is tokenized, followed by eos, all concatenated and cut into blocks
        of exactly data.max_length tokens; the remainder shorter than a block is dropped (no padding at all).
        data.packing false: one example per text, truncated to data.max_length (eos appended when it fits);
        the collator pads per batch and masks the padding out of the loss.
        """
        size = recipe.data.max_length
        eos = tokenizer.eos_token_id

        def pack(batch):
            ids = [i for text_ids in tokenizer(batch["text"])["input_ids"] for i in [*text_ids, eos]]
            blocks = [ids[start:start + size] for start in range(0, len(ids) - size + 1, size)]
            return {"input_ids": blocks, "attention_mask": [[1] * size for _ in blocks],
                    "labels": [list(b) for b in blocks], "length": [size] * len(blocks)}

        def truncate(batch):
            ids = [x + [eos] for x in tokenizer(batch["text"], truncation=True,
                                                max_length=max(size - 1, 1))["input_ids"]]
            return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids],
                    "labels": [list(x) for x in ids], "length": [len(x) for x in ids]}

        encode = pack if recipe.data.packing else truncate
        # batch_size=None: the whole split is one batch, so packing concatenates across every document.
        encoded = dataset.map(encode, batched=True, batch_size=None, remove_columns=dataset.column_names)
        if len(encoded) == 0 and recipe.data.packing:
            tokens = sum(len(ids) + 1 for ids in tokenizer(list(dataset["text"]))["input_ids"])
            raise UserError(f"data.max_length: packing cuts blocks of {size} tokens, but a split of "
                            f"{recipe.data.train} holds only {tokens}: lower data.max_length, or add text "
                            "(or a larger data.eval_fraction)")
        return encoded

    def collator(self, recipe: Recipe, tokenizer):
        return _padding_collator(recipe, tokenizer)

    def metrics(self, recipe: Recipe, tokenizer) -> EvalMetrics:
        """Perplexity only, from the eval loss. No compute function, so the Trainer evaluates with
        prediction_loss_only and never gathers the (tokens x vocabulary) logits."""
        return EvalMetrics(compute=None, main="perplexity", greater_is_better=False)

    def generate(self, recipe: Recipe, model, tokenizer, inputs: list[str], prompt_fraction: float = 1.0):
        """Continuation of each input; prompt_fraction < 1 prompts with only the first fraction of each
        input's tokens (at least one): eval texts are whole documents, so the record shows the model
        continuing the first part of a real text ("prompt" in the output)."""
        prompts, room = [], _room(recipe, model)
        for ids in tokenizer(list(inputs), add_special_tokens=True)["input_ids"]:
            ids = ids or [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
            prompts.append((ids[:max(1, int(len(ids) * prompt_fraction))] if prompt_fraction < 1 else ids)[-room:])
        texts = _continue(recipe, model, tokenizer, prompts)
        if prompt_fraction < 1:
            return [{"prompt": tokenizer.decode(ids, skip_special_tokens=True), "text": text}
                    for ids, text in zip(prompts, texts)]
        return [{"text": text} for text in texts]


class PromptAndTarget:
    """Translation and summarization as one sequence: data.source_prefix + text + a line break, then the
    target and eos. The loss falls on the target only (the prompt's labels are -100), so the model learns
    to write the target given the source, as an encoder-decoder does; scored on generated text."""

    def load_model(self, recipe: Recipe):
        return _load_causal_lm(recipe)

    def preprocess(self, recipe: Recipe, tokenizer, dataset):
        d = recipe.data
        end = tokenizer(PROMPT_END, add_special_tokens=False)["input_ids"]

        def encode(batch):
            sources = tokenizer([d.source_prefix + t for t in batch["text"]], truncation=True,
                                max_length=max(d.max_length - len(end), 1))["input_ids"]
            targets = tokenizer(batch["target"], add_special_tokens=False, truncation=True,
                                max_length=max(d.max_target_length - 1, 1))["input_ids"]
            ids = [source + end + target + [tokenizer.eos_token_id] for source, target in zip(sources, targets)]
            masked = [[IGNORE_INDEX] * (len(source) + len(end)) + target + [tokenizer.eos_token_id]
                      for source, target in zip(sources, targets)]
            return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids], "labels": masked,
                    "length": [len(x) for x in ids]}

        return dataset.map(encode, batched=True, remove_columns=dataset.column_names)

    def collator(self, recipe: Recipe, tokenizer):
        return _padding_collator(recipe, tokenizer)

    def metrics(self, recipe: Recipe, tokenizer) -> EvalMetrics:
        from hftoolkit.metrics import text_metrics

        return text_metrics(labels.metric_names(recipe))

    def generate(self, recipe: Recipe, model, tokenizer, inputs: list[str]) -> list[dict]:
        d = recipe.data
        end = tokenizer(PROMPT_END, add_special_tokens=False)["input_ids"]
        sources = tokenizer([d.source_prefix + t for t in inputs], truncation=True,
                            max_length=max(d.max_length - len(end), 1))["input_ids"]
        prompts = [(source + end)[-_room(recipe, model):] for source in sources]
        return [{"text": text.strip()} for text in _continue(recipe, model, tokenizer, prompts)]


def _room(recipe: Recipe, model) -> int:
    """Prompt tokens that fit in the model's context beside the new ones (prompts keep their last tokens)."""
    context = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", 1024)
    return max(1, min(recipe.data.max_length, context - recipe.eval.generation.max_new_tokens))


def _continue(recipe: Recipe, model, tokenizer, prompts: list[list[int]]) -> list[str]:
    """The text each prompt (token ids) continues with, decoded as recipe.eval.generation says; the prompt
    is not repeated. Batches are left-padded so every prompt ends at the last position, where generation
    starts."""
    import torch

    model.eval()
    kwargs = dict(decoding_options(recipe.eval.generation), pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    out = []
    for start in range(0, len(prompts), recipe.eval.batch_size):
        chunk = prompts[start:start + recipe.eval.batch_size]
        batch = tokenizer.pad({"input_ids": chunk}, padding=True, padding_side="left", return_tensors="pt")
        batch = batch.to(model.device)
        with torch.no_grad():
            generated = model.generate(**batch, **kwargs)
        out += tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


PROMPTED = PromptAndTarget()
FORMULATIONS = {"clm": CausalLM(), "translation": PROMPTED, "summarization": PROMPTED,
                "classification": labels.CLASSIFICATION, "regression": labels.REGRESSION, "tagging": labels.TAGGING}


def load_model(recipe: Recipe):
    return FORMULATIONS[recipe.task].load_model(recipe)


def preprocess(recipe: Recipe, tokenizer, dataset):
    return FORMULATIONS[recipe.task].preprocess(recipe, tokenizer, dataset)


def collator(recipe: Recipe, tokenizer):
    return FORMULATIONS[recipe.task].collator(recipe, tokenizer)


def metrics(recipe: Recipe, tokenizer) -> EvalMetrics:
    return FORMULATIONS[recipe.task].metrics(recipe, tokenizer)


def generate(recipe: Recipe, model, tokenizer, inputs: list, **options) -> list[dict]:
    return FORMULATIONS[recipe.task].generate(recipe, model, tokenizer, inputs, **options)
