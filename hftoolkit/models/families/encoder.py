"""Encoder-only models (BERT and kin): sequence classification, token tagging, masked-LM, reward models.

The output is a label (for the text, or for each token) or a masked token, so the model reads
the whole input with bidirectional attention (the course's decision tree). Classification and
tagging are shared with the other text families (labels.py); masked-LM is the encoder's own.
"""

from __future__ import annotations

import hashlib

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics
from hftoolkit.models import tokenized
from hftoolkit.models.families import labels
from hftoolkit.models.families.reward import RewardModel
from hftoolkit.sources.labels import IGNORE_INDEX


class MaskedLM:
    """BERT's pretraining objective on the user's text, scored by perplexity on fixed masks.

    One example per text, truncated rather than grouped into blocks, so an eval example is a whole
    text (predictions line up with inputs) and length batching keeps padding low; the special-tokens
    mask is stored so the collator never masks [CLS] or [SEP].
    """

    def load_model(self, job: Job):
        import transformers as tf

        from hftoolkit.models import loading

        # The MLM head is tied to the embeddings: nothing extra to train.
        model = loading.load_task_model(tf.AutoModelForMaskedLM, job, None, with_head=False)
        return model, job.model.processor

    def preprocess(self, job: Job, tokenizer, dataset):
        def encode(batch):
            enc = tokenizer(batch["text"], truncation=True, max_length=job.max_length,
                            return_special_tokens_mask=True)
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            return enc

        return tokenized.encode(job, tokenizer, dataset, encode)

    def collator(self, job: Job, tokenizer):
        return _SeededMasking(tokenizer, job.recipe.data.mask_probability, job.recipe.training.seed)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        if job.recipe.eval.metrics != "auto":
            raise UserError("eval.metrics: mlm is scored by perplexity (exp of the eval loss on fixed masks): "
                            "set eval.metrics to auto")
        # No compute function: the Trainer then evaluates with prediction_loss_only and never gathers the
        # (tokens x vocabulary) logits; evaluation/evaluate.py reports perplexity = exp(eval loss).
        return EvalMetrics(compute=None, main="perplexity", greater_is_better=False)

    def generate(self, job: Job, model, tokenizer, inputs: list[str]) -> list[dict]:
        model.eval()
        return _fill_masks(job, model, tokenizer, inputs)


FORMULATIONS = {tasks.CLASSIFICATION: labels.CLASSIFICATION, tasks.REGRESSION: labels.REGRESSION,
                tasks.TAGGING: labels.TAGGING, tasks.MLM: MaskedLM(), tasks.REWARD: RewardModel()}


# ---------------------------------------------------------------- masking


class _SeededMasking:
    """BERT's masking: each non-special, non-padding token is selected with probability p; of those,
    80% become [MASK], 10% a random token, 10% stay unchanged; only selected tokens carry a label.

    DataCollatorForLanguageModeling masks each example on its own, with a generator seeded from
    (training.seed, the example's token ids, `epoch`). The Trainer sets `epoch` as each epoch begins
    (trainer.epoch_to_collator), so an example seen again in a later epoch gets fresh masks (dynamic
    masking), and a resumed run masks exactly as the uninterrupted run did. Eval masks as epoch 0: each
    eval example gets the same mask in every run and in `hftoolkit eval`, so eval losses compare between runs.
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


def _fill_masks(job: Job, model, tokenizer, inputs: list[str]) -> list[dict]:
    """Each mask token replaced by the model's most likely token.

    A text without a mask token (an eval text) gets masks chosen by a generator seeded from its
    content: round(data.mask_probability x its tokens), at least one, so the record shows the model
    filling in real text; "masked" gives the text the model saw.
    """
    import torch

    mask = tokenizer.mask_token_id
    out = []
    for start in range(0, len(inputs), job.recipe.eval.batch_size):
        batch = tokenizer(inputs[start:start + job.recipe.eval.batch_size], truncation=True, padding=True,
                          max_length=job.max_length, return_special_tokens_mask=True, return_tensors="pt")
        ids, fixed = batch["input_ids"], batch.pop("special_tokens_mask").bool()
        for row in range(len(ids)):
            maskable = (~fixed[row]).nonzero().flatten()
            if not (ids[row] == mask).any() and len(maskable):
                real = ids[row][batch["attention_mask"][row].bool()]  # unpadded: the same masks in any batch
                generator = torch.Generator().manual_seed(_content_seed(job.recipe.training.seed, [real]))
                count = max(1, round(job.recipe.data.mask_probability * len(maskable)))
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
