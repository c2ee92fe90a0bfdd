"""Encoder-only models (BERT and kin): sequence classification, token tagging, masked-LM.

The output is a label (for the text, or for each token) or a masked token, so the
model reads the whole input with bidirectional attention (the course's decision tree).
"""

from __future__ import annotations

import hashlib

from hftoolkit.errors import UserError
from hftoolkit.families import EvalMetrics, label_records
from hftoolkit.recipe import Recipe

CLASSIFICATION_METRICS = ["accuracy", "f1", "precision", "recall", "matthews_correlation"]
# Label id the loss ignores (torch's cross_entropy ignore_index): special tokens, padding, later subwords.
IGNORE_INDEX = -100


def load_model(recipe: Recipe):
    """Tokenizer and model with the task head; LoRA with the head in modules_to_save."""
    import transformers as tf

    from hftoolkit import modeling

    tokenizer = tf.AutoTokenizer.from_pretrained(modeling.resolve_checkpoint(recipe), revision=recipe.model.revision)
    names = recipe.data.label_names or []
    labels = dict(num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    auto, task_type = {
        "classification": (tf.AutoModelForSequenceClassification, "SEQ_CLS"),
        "tagging": (tf.AutoModelForTokenClassification, "TOKEN_CLS"),
        "mlm": (tf.AutoModelForMaskedLM, None),
    }[recipe.task]
    if recipe.task == "mlm":  # the MLM head is tied to the embeddings: nothing extra to train
        return modeling.load_task_model(auto, recipe, task_type, with_head=False), tokenizer
    return modeling.load_task_model(auto, recipe, task_type, **labels), tokenizer


def preprocess(recipe: Recipe, tokenizer, dataset):
    """Tokenize (truncated to data.max_length, unpadded: the collator pads per batch).

    tagging: the words are tokenized as given (is_split_into_words) and each word's tag goes to
    its first subword; later subwords and special tokens get -100, so the loss and the metric see
    one prediction per word. mlm: one example per text, truncated rather than grouped into blocks,
    so an eval example is a whole text (predictions line up with inputs) and group_by_length keeps
    padding low; the special-tokens mask is stored so the collator never masks [CLS] or [SEP].
    """
    max_length = recipe.data.max_length
    if recipe.task == "classification":
        def encode(batch):
            enc = tokenizer(batch["text"], truncation=True, max_length=max_length)
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            enc["labels"] = batch["label"]
            return enc
    elif recipe.task == "tagging":
        def encode(batch):
            _check_word_lists(recipe, batch)
            enc = tokenizer(batch["text"], is_split_into_words=True, truncation=True, max_length=max_length)
            enc["labels"] = [_align_labels(enc.word_ids(i), tags) for i, tags in enumerate(batch["label"])]
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            return enc
    elif recipe.task == "mlm":
        def encode(batch):
            enc = tokenizer(batch["text"], truncation=True, max_length=max_length, return_special_tokens_mask=True)
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            return enc
    else:
        raise NotImplementedError(f"encoder task {recipe.task}")
    return dataset.map(encode, batched=True, remove_columns=dataset.column_names)


def _check_word_lists(recipe: Recipe, batch) -> None:
    for words, tags in zip(batch["text"], batch["label"]):
        if not isinstance(words, list):
            raise UserError(f"data.text_column: tagging needs a list of words per row, but {recipe.data.train} "
                            f"holds text ({str(words)[:40]!r}): store each row's words as a list (e.g. JSON lines)")
        if len(words) != len(tags):
            raise UserError(f"data.label_column: a row of {recipe.data.train} has {len(words)} words but "
                            f"{len(tags)} tags ({' '.join(map(str, words))[:60]!r}): give exactly one tag per word")


def _align_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """Per-token labels: a word's label on its first subword, -100 on the rest and on special tokens."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE_INDEX if word is None or word == previous else word_labels[word])
        previous = word
    return labels


def collator(recipe: Recipe, tokenizer):
    """Dynamic padding; tagging pads labels with -100; mlm masks 80/10/10 (see _SeededMasking)."""
    from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

    if recipe.task == "tagging":
        return DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE_INDEX)
    if recipe.task == "mlm":
        return _SeededMasking(tokenizer, recipe.data.mask_probability, recipe.training.seed)
    return DataCollatorWithPadding(tokenizer)


class _SeededMasking:
    """BERT's masking: each non-special, non-padding token is selected with probability p; of those,
    80% become [MASK], 10% a random token, 10% stay unchanged; only selected tokens carry a label.

    DataCollatorForLanguageModeling masks each example on its own, with a generator seeded from
    (training.seed, the example's token ids, `epoch`). The Trainer sets `epoch` as each epoch begins
    (train.py, EpochToCollator), so an example seen again in a later epoch gets fresh masks (dynamic
    masking), and a resumed run masks exactly as the uninterrupted run did (a count of batches met,
    used before, started again from zero on resume). Eval masks as epoch 0: each eval example gets
    the same mask in every run and in `hftoolkit eval`, so eval losses compare between runs.
    """

    def __init__(self, tokenizer, probability: float, seed: int):
        from transformers import DataCollatorForLanguageModeling, DataCollatorForTokenClassification

        self.masking = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=probability,
                                                       mask_replace_prob=0.8, random_replace_prob=0.1)
        self.padding = DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE_INDEX)
        self.seed = seed
        self.epoch = 0

    def __call__(self, features):
        import torch

        masked = []
        for f in features:
            seed = _content_seed(self.seed, [f["input_ids"], [self.epoch]])
            self.masking.generator = torch.Generator().manual_seed(seed)
            special = f.get("special_tokens_mask")  # without it, the collator asks the tokenizer
            ids, labels = self.masking.torch_mask_tokens(
                torch.tensor([f["input_ids"]]), None if special is None else torch.tensor([special]))
            rest = {k: v for k, v in f.items() if k not in ("input_ids", "special_tokens_mask")}
            masked.append({**rest, "input_ids": ids[0].tolist(), "labels": labels[0].tolist()})
        return self.padding(masked)


def _content_seed(seed: int, rows) -> int:
    """A 63-bit seed from a seed and the token ids of `rows` (stable across processes and runs)."""
    digest = hashlib.sha256(str(seed).encode())
    for ids in rows:
        digest.update(",".join(map(str, list(map(int, ids)))).encode() + b";")
    return int.from_bytes(digest.digest()[:8], "little") >> 1


def metrics(recipe: Recipe, tokenizer) -> EvalMetrics:
    """classification: accuracy, F1, precision, recall, MCC; tagging: seqeval entity F1; mlm: perplexity."""
    from hftoolkit.metrics import label_metrics, load_metric

    if recipe.task == "mlm":
        if recipe.eval.metrics != "auto":
            raise UserError("eval.metrics: mlm is scored by perplexity (exp of the eval loss on fixed masks): "
                            "set eval.metrics to auto")
        # No compute function: the Trainer then evaluates with prediction_loss_only and never gathers the
        # (tokens x vocabulary) logits; train.py reports perplexity = exp(eval loss).
        return EvalMetrics(compute=None, main="perplexity", greater_is_better=False)
    if recipe.task == "tagging":
        if recipe.eval.metrics not in ("auto", ["seqeval"]):
            raise UserError("eval.metrics: tagging is scored by seqeval (entity precision, recall, F1 and token "
                            "accuracy): set eval.metrics to auto or [seqeval]")
        return _tagging_metrics(recipe, load_metric("seqeval"))

    return label_metrics(CLASSIFICATION_METRICS if recipe.eval.metrics == "auto" else recipe.eval.metrics)


def _tagging_metrics(recipe: Recipe, seqeval) -> EvalMetrics:
    names = recipe.data.label_names

    def compute(prediction):
        predicted, gold = [], []
        # Rows are padded with -100 across batches; the -100 labels also drop later subwords and specials.
        for tags, labels in zip(prediction.predictions, prediction.label_ids):
            scored = labels != IGNORE_INDEX
            predicted.append([names[i] for i in tags[scored]])
            gold.append([names[i] for i in labels[scored]])
        return seqeval.compute(predictions=predicted, references=gold)

    # The argmax per token, (B, T) ids, is all the metric needs: the (B, T, labels) floats are never gathered.
    return EvalMetrics(compute, main="f1", reduce_logits=lambda logits, labels: logits.argmax(-1))


def generate(recipe: Recipe, model, tokenizer, inputs: list) -> list[dict]:
    """classification: label and probability per text; tagging: a tag per word; mlm: [MASK]s filled."""
    model.eval()
    if recipe.task == "tagging":
        return _tag(recipe, model, tokenizer, inputs)
    if recipe.task == "mlm":
        return _fill_masks(recipe, model, tokenizer, inputs)
    return _classify(recipe, model, tokenizer, inputs)


def _classify(recipe: Recipe, model, tokenizer, inputs: list[str]) -> list[dict]:
    import torch

    id2label = model.config.id2label
    out = []
    for start in range(0, len(inputs), recipe.eval.batch_size):
        batch = tokenizer(inputs[start:start + recipe.eval.batch_size], truncation=True,
                          max_length=recipe.data.max_length, padding=True, return_tensors="pt").to(model.device)
        with torch.no_grad():
            out += label_records(model(**batch).logits.float().softmax(-1).cpu().numpy(), id2label)
    return out


def _tag(recipe: Recipe, model, tokenizer, inputs: list) -> list[dict]:
    """One tag per word (a word list, or a string split on whitespace); None for words cut by data.max_length."""
    import torch

    id2label = model.config.id2label
    sentences = [x.split() if isinstance(x, str) else list(x) for x in inputs]
    out = []
    for start in range(0, len(sentences), recipe.eval.batch_size):
        chunk = sentences[start:start + recipe.eval.batch_size]
        batch = tokenizer([words or [""] for words in chunk], is_split_into_words=True, truncation=True,
                          max_length=recipe.data.max_length, padding=True, return_tensors="pt")
        with torch.no_grad():
            best = model(**batch.to(model.device)).logits.argmax(-1).tolist()
        for row, words in enumerate(chunk):
            tags = [None] * len(words)
            for position, word in enumerate(batch.word_ids(row)):
                if word is not None and word < len(words) and tags[word] is None:
                    tags[word] = id2label[best[row][position]]
            out.append({"tags": tags})
    return out


def _fill_masks(recipe: Recipe, model, tokenizer, inputs: list[str]) -> list[dict]:
    """Each mask token replaced by the model's most likely token.

    A text without a mask token (an eval text) gets masks chosen by a generator seeded from its
    content: round(data.mask_probability x its tokens), at least one, so the record shows the model
    filling in real text; "masked" gives the text the model saw.
    """
    import torch

    mask = tokenizer.mask_token_id
    out = []
    for start in range(0, len(inputs), recipe.eval.batch_size):
        batch = tokenizer(inputs[start:start + recipe.eval.batch_size], truncation=True, padding=True,
                          max_length=recipe.data.max_length, return_special_tokens_mask=True, return_tensors="pt")
        ids, fixed = batch["input_ids"], batch.pop("special_tokens_mask").bool()
        for row in range(len(ids)):
            maskable = (~fixed[row]).nonzero().flatten()
            if not (ids[row] == mask).any() and len(maskable):
                real = ids[row][batch["attention_mask"][row].bool()]  # unpadded: the same masks in any batch
                generator = torch.Generator().manual_seed(_content_seed(recipe.training.seed, [real]))
                count = max(1, round(recipe.data.mask_probability * len(maskable)))
                ids[row, maskable[torch.randperm(len(maskable), generator=generator)[:count]]] = mask
        with torch.no_grad():
            best = model(**batch.to(model.device)).logits.argmax(-1).cpu()
        for row in range(len(ids)):
            masked = ids[row] == mask
            kept = ~fixed[row] | masked  # drop [CLS], [SEP] and padding, keep the masks
            filled = torch.where(masked, best[row], ids[row])[kept]
            out.append({"masked": tokenizer.decode(ids[row][kept]), "text": tokenizer.decode(filled),
                        "tokens": tokenizer.convert_ids_to_tokens(best[row][masked].tolist())})
    return out
