"""Labels read from text, shared by every text family: one class per text, or one tag per word.

transformers gives encoders, decoders and encoder-decoders the same heads for these, so one
formulation serves all three: an encoder classifies from [CLS], a decoder from the last real
token (which it finds through the pad token id, hence `sync_pad_token`), BART and T5 from the
final eos of their decoder. Only the Auto class and the head's position differ, and transformers
picks both from the checkpoint's config.
"""

from __future__ import annotations

from hftoolkit import tasks
from hftoolkit.errors import UserError
from hftoolkit.families import label_records, load_tokenizer, sync_pad_token
from hftoolkit.metrics import EvalMetrics, first
from hftoolkit.recipe import Recipe

# Label id the loss ignores (torch's cross_entropy ignore_index): special tokens, padding, later subwords.
IGNORE_INDEX = -100


def label_config(recipe: Recipe) -> dict:
    names = recipe.data.label_names or []
    return dict(num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})


def metric_names(recipe: Recipe) -> list[str]:
    return list(tasks.spec(recipe.task).metrics) if recipe.eval.metrics == "auto" else list(recipe.eval.metrics)


class SequenceClassification:
    """One label per text: accuracy, F1, precision, recall and MCC; records give label and probability."""

    def load_model(self, recipe: Recipe):
        import transformers as tf

        from hftoolkit import modeling

        tokenizer = load_tokenizer(recipe)
        model = modeling.load_task_model(tf.AutoModelForSequenceClassification, recipe, "SEQ_CLS",
                                         **label_config(recipe))
        sync_pad_token(model, tokenizer)
        return model, tokenizer

    def preprocess(self, recipe: Recipe, tokenizer, dataset):
        """Tokenized and truncated to data.max_length, unpadded: the collator pads per batch."""
        def encode(batch):
            enc = tokenizer(batch["text"], truncation=True, max_length=recipe.data.max_length)
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            enc["labels"] = batch["label"]
            return enc

        return dataset.map(encode, batched=True, remove_columns=dataset.column_names)

    def collator(self, recipe: Recipe, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    def metrics(self, recipe: Recipe, tokenizer) -> EvalMetrics:
        from hftoolkit.metrics import label_metrics

        return label_metrics(metric_names(recipe))

    def generate(self, recipe: Recipe, model, tokenizer, inputs: list[str]) -> list[dict]:
        import torch

        model.eval()
        id2label = model.config.id2label
        out = []
        for start in range(0, len(inputs), recipe.eval.batch_size):
            batch = tokenizer(inputs[start:start + recipe.eval.batch_size], truncation=True,
                              max_length=recipe.data.max_length, padding=True, return_tensors="pt").to(model.device)
            with torch.no_grad():
                out += label_records(model(**batch).logits.float().softmax(-1).cpu().numpy(), id2label)
        return out


class TokenTagging:
    """One tag per word, scored by seqeval (entity precision, recall, F1 and token accuracy).

    The words are tokenized as given (is_split_into_words) and each word's tag goes to its first
    subword; later subwords and special tokens get -100, so the loss and the metric see one
    prediction per word. Byte-level BPE tokenizers (GPT-2, RoBERTa, BART) must then be told to put
    a space before each word, as it would have in running text.
    """

    def load_model(self, recipe: Recipe):
        import transformers as tf

        from hftoolkit import modeling

        tokenizer = load_tokenizer(recipe)
        if getattr(tokenizer, "add_prefix_space", None) is False:
            tokenizer = load_tokenizer(recipe, add_prefix_space=True)
        model = modeling.load_task_model(tf.AutoModelForTokenClassification, recipe, "TOKEN_CLS",
                                         **label_config(recipe))
        sync_pad_token(model, tokenizer)
        return model, tokenizer

    def preprocess(self, recipe: Recipe, tokenizer, dataset):
        def encode(batch):
            _check_word_lists(recipe, batch)
            enc = tokenizer(batch["text"], is_split_into_words=True, truncation=True, max_length=recipe.data.max_length)
            enc["labels"] = [_align_labels(enc.word_ids(i), tags) for i, tags in enumerate(batch["label"])]
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            return enc

        return dataset.map(encode, batched=True, remove_columns=dataset.column_names)

    def collator(self, recipe: Recipe, tokenizer):
        from transformers import DataCollatorForTokenClassification

        return DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE_INDEX)

    def metrics(self, recipe: Recipe, tokenizer) -> EvalMetrics:
        from hftoolkit.metrics import load_metric

        if recipe.eval.metrics not in ("auto", ["seqeval"]):
            raise UserError("eval.metrics: tagging is scored by seqeval (entity precision, recall, F1 and token "
                            "accuracy): set eval.metrics to auto or [seqeval]")
        seqeval, names = load_metric("seqeval"), recipe.data.label_names

        def compute(prediction):
            predicted, gold = [], []
            # Rows are padded with -100 across batches; the -100 labels also drop later subwords and specials.
            for tags, labels in zip(prediction.predictions, prediction.label_ids):
                scored = labels != IGNORE_INDEX
                predicted.append([names[i] for i in tags[scored]])
                gold.append([names[i] for i in labels[scored]])
            return seqeval.compute(predictions=predicted, references=gold)

        # The argmax per token, (B, T) ids, is all the metric needs: the (B, T, labels) floats are never gathered.
        return EvalMetrics(compute, main="f1", reduce_logits=lambda logits, labels: first(logits).argmax(-1))

    def generate(self, recipe: Recipe, model, tokenizer, inputs: list) -> list[dict]:
        """One tag per word (a word list, or a string split on whitespace); None for words cut by data.max_length."""
        import torch

        model.eval()
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


CLASSIFICATION = SequenceClassification()
TAGGING = TokenTagging()
