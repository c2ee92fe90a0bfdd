"""Labels read from text, shared by every text family: one class or one score per text, or one tag per word.

transformers gives encoders, decoders and encoder-decoders the same heads for these, and picks the position the
head reads from the checkpoint's config, so one formulation serves all three. Sentence pairs are tokenized as one
pair, as transformers' run_glue.py does; regression is the same head with one output (MSE loss).
"""

from __future__ import annotations

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics, first
from hftoolkit.models import tokenized
from hftoolkit.models.families import label_records, sync_pad_token
from hftoolkit.sources.labels import IGNORE_INDEX


def label_config(job: Job) -> dict:
    names = job.label_names or []
    return dict(num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})


def metric_names(job: Job) -> list[str]:
    chosen = job.recipe.eval.metrics
    return list(tasks.spec(job.task).metrics) if chosen == "auto" else list(chosen)


class SequenceClassification:
    """One label per text: accuracy, F1, precision, recall and MCC; records give label and probability."""

    def load_model(self, job: Job):
        import transformers as tf

        from hftoolkit.models import loading

        tokenizer = job.model.processor
        model = loading.load_task_model(tf.AutoModelForSequenceClassification, job, "SEQ_CLS",
                                         **label_config(job))
        sync_pad_token(model, tokenizer)
        return model, tokenizer

    def preprocess(self, job: Job, tokenizer, dataset):
        """Tokenized (a pair where the data has text_pair) and truncated to data.max_length, unpadded: the
        collator pads per batch. A pair is truncated longest first, as run_glue.py does."""
        def encode(batch):
            enc = tokenizer(batch["text"], batch["text_pair"] if "text_pair" in batch else None, truncation=True,
                            max_length=job.max_length)
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            enc["labels"] = batch["label"]
            return enc

        return tokenized.encode(job, tokenizer, dataset, encode)

    def collator(self, job: Job, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        from hftoolkit.metrics import label_metrics

        return label_metrics(metric_names(job))

    def generate(self, job: Job, model, tokenizer, inputs: list) -> list[dict]:
        """A label and its probability per input: a text, or a (text, text_pair) pair."""
        return [record for logits in head_logits(job, model, tokenizer, inputs)
                for record in label_records(logits.softmax(-1).numpy(), model.config.id2label)]


class SequenceRegression(SequenceClassification):
    """One score per text (or pair): the classification head with one output and the MSE loss; Pearson and
    Spearman correlations; records give the predicted value."""

    def load_model(self, job: Job):
        import transformers as tf

        from hftoolkit.models import loading

        tokenizer = job.model.processor
        model = loading.load_task_model(tf.AutoModelForSequenceClassification, job, "SEQ_CLS",
                                         num_labels=1, problem_type="regression")
        sync_pad_token(model, tokenizer)
        return model, tokenizer

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        from hftoolkit.metrics import load_metric

        names = metric_names(job)
        allowed = tasks.spec(tasks.REGRESSION).metrics
        if not names or any(n not in allowed for n in names):
            raise UserError(f"eval.metrics: regression is scored by correlations: set eval.metrics to auto, or "
                            f"to some of {', '.join(allowed)}")
        modules = [load_metric(n) for n in names]

        def compute(prediction):
            predicted = prediction.predictions.reshape(-1)  # (B, 1) -> (B,)
            references = prediction.label_ids.reshape(-1)
            out = {}
            for module in modules:
                out.update(module.compute(predictions=predicted, references=references))
            return out

        return EvalMetrics(compute, main=names[0], reduce_logits=lambda logits, labels: first(logits))

    def generate(self, job: Job, model, tokenizer, inputs: list) -> list[dict]:
        """The predicted value per input: a text, or a (text, text_pair) pair."""
        return [record for logits in head_logits(job, model, tokenizer, inputs)
                for record in value_records(logits.numpy())]


def value_records(values) -> list[dict]:
    """One {"value"} record per predicted score (an array, examples or examples x 1), unrounded: correlations
    recomputed from the records must match the reported ones even when the predictions lie close together."""
    return [{"value": float(v)} for v in values.reshape(len(values), -1)[:, 0]]


def head_logits(job: Job, model, tokenizer, inputs: list):
    """The head's float logits (a CPU tensor per batch of eval.batch_size) for texts or (text, text_pair) pairs."""
    import torch

    model.eval()
    for start in range(0, len(inputs), job.recipe.eval.batch_size):
        chunk = inputs[start:start + job.recipe.eval.batch_size]
        pairs = not isinstance(chunk[0], str)
        texts, second = ([a for a, _ in chunk], [b for _, b in chunk]) if pairs else (list(chunk), None)
        batch = tokenizer(texts, second, truncation=True, max_length=job.max_length, padding=True,
                          return_tensors="pt").to(model.device)
        with torch.no_grad():
            yield model(**batch).logits.float().cpu()


class TokenTagging:
    """One tag per word, scored by seqeval (entity precision, recall, F1 and token accuracy).

    The words are tokenized as given (is_split_into_words) and each word's tag goes to its first
    subword; later subwords and special tokens get -100, so the loss and the metric see one
    prediction per word. Byte-level BPE tokenizers (GPT-2, RoBERTa, BART) must then be told to put
    a space before each word, as it would have in running text.
    """

    def load_model(self, job: Job):
        import transformers as tf

        from hftoolkit.models import loading

        tokenizer = job.model.processor  # (resolve gave byte-level BPE a space before each word)
        model = loading.load_task_model(tf.AutoModelForTokenClassification, job, "TOKEN_CLS",
                                         **label_config(job))
        sync_pad_token(model, tokenizer)
        return model, tokenizer

    def preprocess(self, job: Job, tokenizer, dataset):
        def encode(batch):
            _check_word_lists(job, batch)
            enc = tokenizer(batch["text"], is_split_into_words=True, truncation=True, max_length=job.max_length)
            enc["labels"] = [_align_labels(enc.word_ids(i), tags) for i, tags in enumerate(batch["label"])]
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            return enc

        return tokenized.encode(job, tokenizer, dataset, encode)

    def collator(self, job: Job, tokenizer):
        from transformers import DataCollatorForTokenClassification

        return DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE_INDEX)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        from hftoolkit.metrics import load_metric

        if job.recipe.eval.metrics not in ("auto", ["seqeval"]):
            raise UserError("eval.metrics: tagging is scored by seqeval (entity precision, recall, F1 and token "
                            "accuracy): set eval.metrics to auto or [seqeval]")
        seqeval, names = load_metric("seqeval"), job.label_names

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

    def generate(self, job: Job, model, tokenizer, inputs: list) -> list[dict]:
        """One tag per word (a word list, or a string split on whitespace); None for words cut by data.max_length."""
        import torch

        model.eval()
        id2label = model.config.id2label
        sentences = [x.split() if isinstance(x, str) else list(x) for x in inputs]
        out = []
        for start in range(0, len(sentences), job.recipe.eval.batch_size):
            chunk = sentences[start:start + job.recipe.eval.batch_size]
            batch = tokenizer([words or [""] for words in chunk], is_split_into_words=True, truncation=True,
                              max_length=job.max_length, padding=True, return_tensors="pt")
            with torch.no_grad():
                best = model(**batch.to(model.device)).logits.argmax(-1).tolist()
            for row, words in enumerate(chunk):
                tags = [None] * len(words)
                for position, word in enumerate(batch.word_ids(row)):
                    if word is not None and word < len(words) and tags[word] is None:
                        tags[word] = id2label[best[row][position]]
                out.append({"tags": tags})
        return out


def _check_word_lists(job: Job, batch) -> None:
    for words, tags in zip(batch["text"], batch["label"]):
        if not isinstance(words, list):
            raise UserError(f"data.text_column: tagging needs a list of words per row, but {job.recipe.data.train} "
                            f"holds text ({str(words)[:40]!r}): store each row's words as a list (e.g. JSON lines)")
        if len(words) != len(tags):
            raise UserError(f"data.label_column: a row of {job.recipe.data.train} has {len(words)} words but "
                            f"{len(tags)} tags ({' '.join(map(str, words))[:60]!r}): give exactly one tag per word")


def _align_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """Per-token labels: a word's label on its first subword, -100 on the rest and on special tokens."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE_INDEX if word is None or word == previous else word_labels[word])
        previous = word
    return labels


CLASSIFICATION = SequenceClassification()
REGRESSION = SequenceRegression()
TAGGING = TokenTagging()
