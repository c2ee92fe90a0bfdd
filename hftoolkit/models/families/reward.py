"""A reward model (task reward): one score for a prompt and an answer, from a sequence-classification head with one
output, learned from preference pairs by the Bradley-Terry loss (training/reward.py), on an encoder or a decoder.

`encode` is the one tokenization of a (prompt, answer): training runs both answers of a pair through it, and the eval
pass, predict, serve and `workflows/reward_model.RewardScorer` score through it, so a score at any of them is the
score training shaped. An encoder reads prompt and answer as a text pair (the prompt first, as a question and its
answer); a decoder reads them as one sequence, rendered as an instruction run renders them (the chat template for
chat models and conversations, else the prompt, a line break, the answer and eos: `decoder.ChatPromptAndTarget`),
and its head reads the last real token (config.pad_token_id set from the tokenizer), as TRL's RewardTrainer does.
"""

from __future__ import annotations

from hftoolkit.base.errors import UserError
from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics
from hftoolkit.models import tokenized
from hftoolkit.models.families import sync_pad_token
from hftoolkit.sources.pairs import MARGIN, is_conversation


class RewardModel:
    """Pairs tokenized as two sequences each (chosen, rejected), batched as 2B rows, scored by a one-output head.

    `answers` is the decoder's instruction formulation (its prompts and targets); None for an encoder, which reads a
    text pair."""

    def __init__(self, answers=None):
        self.answers = answers

    def load_model(self, job: Job):
        import transformers as tf

        from hftoolkit.models import loading

        tokenizer = job.model.processor
        # One output, no problem_type: the loss is computed from the pair's two scores (training/reward.py), never
        # by the head from labels. LoRA keeps the head trainable and saved (loading: modules_to_save).
        model = loading.load_task_model(tf.AutoModelForSequenceClassification, job, "SEQ_CLS", num_labels=1,
                                         id2label={0: "reward"}, label2id={"reward": 0})
        sync_pad_token(model, tokenizer)  # (a decoder's head reads each row's last token that is not padding)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base.config.use_cache = False  # (a score reads one pass: no key-value cache to keep)
        return model, tokenizer

    def encode(self, job: Job, tokenizer, prompts: list, answers: list) -> list[dict]:
        """Each (prompt, answer) as the model reads it: {"input_ids"} (and "token_type_ids" for an encoder whose
        tokenizer makes them). Prompts and answers are texts, or conversations (a prompt's turns, an answer's
        assistant turns). The prompt keeps data.max_length tokens and the answer data.max_target_length."""
        if self.answers is None:
            return [_text_pair(job, tokenizer, p, a) for p, a in zip(prompts, answers, strict=True)]
        return [{"input_ids": ids} for ids in self._sequences(job, tokenizer, list(prompts), list(answers))]

    def _sequences(self, job: Job, tokenizer, prompts: list, answers: list) -> list[list[int]]:
        """A decoder's sequences: a conversation pair in the chat template (the prompt's turns, then the answer's),
        texts as the instruction formulation writes a prompt and its target. Each row alone: a score does not depend
        on what else is in the batch."""
        from hftoolkit.models.families.preference import conversation_ids
        from hftoolkit.sources.pairs import as_turns

        talks = [is_conversation(p) or is_conversation(a) for p, a in zip(prompts, answers)]
        texts = [i for i, talk in enumerate(talks) if not talk]
        heads = self.answers.prompts(job, tokenizer, [prompts[i] for i in texts]) if texts else []
        tails = self.answers.targets(job, tokenizer, [answers[i] for i in texts]) if texts else []
        written = dict(zip(texts, (head + tail for head, tail in zip(heads, tails))))
        out = []
        for i, (p, a) in enumerate(zip(prompts, answers)):
            if i in written:
                out.append(written[i])
                continue
            turns = a if is_conversation(a) else [{"role": "assistant", "content": str(a)}]
            head, answer, _ = conversation_ids(tokenizer, as_turns(p), turns, turns, job.max_length,
                                               job.max_target_length)
            out.append(head + answer)
        return out

    def preprocess(self, job: Job, tokenizer, dataset):
        """Per pair: chosen_* and rejected_* (encode's fields for each answer), the margin (0 without a margin
        column) and a "length" for batching (the longer sequence)."""
        def pairs(batch):
            good = self.encode(job, tokenizer, batch["text"], batch["chosen"])
            poor = self.encode(job, tokenizer, batch["text"], batch["rejected"])
            out = {f"{side}_{k}": [e[k] for e in encoded] for side, encoded in (("chosen", good), ("rejected", poor))
                   for k in good[0]} if good else {"chosen_input_ids": [], "rejected_input_ids": []}
            out[MARGIN] = [float(m) for m in batch[MARGIN]] if MARGIN in batch else [0.0] * len(good)
            out["length"] = [max(len(g["input_ids"]), len(p["input_ids"])) for g, p in zip(good, poor)]
            return out

        return tokenized.encode(job, tokenizer, dataset, pairs)

    def collator(self, job: Job, tokenizer):
        return PairCollator(tokenizer)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        if job.recipe.eval.metrics != "auto":
            raise UserError("eval.metrics: task reward is scored by its held-out pairs (reward_accuracy, "
                            "reward_margin and the loss): set eval.metrics to auto")
        return EvalMetrics(pair_metrics, main="reward_accuracy", greater_is_better=True)

    def generate(self, job: Job, model, tokenizer, inputs: list) -> list[dict]:
        """A {"score"} record per input (`split_input`: a (prompt, answer) pair, a conversation, or an answer
        alone)."""
        pairs = [split_input(x) for x in inputs]
        scored = self.scores(job, model, tokenizer, [p for p, _ in pairs], [a for _, a in pairs])
        return [{"score": s} for s in scored]

    def scores(self, job: Job, model, tokenizer, prompts: list, answers: list) -> list[float]:
        """The model's score of each (prompt, answer), in batches of eval.batch_size, without gradients, on the
        model's device, in the run's precision (as the eval pass scored them)."""
        import torch

        model.eval()
        collate, size, out = PairCollator(tokenizer), job.recipe.eval.batch_size, []
        encoded = self.encode(job, tokenizer, prompts, answers)
        with torch.no_grad(), in_run_precision(job, model.device.type):
            for start in range(0, len(encoded), size):
                batch = collate.rows(encoded[start:start + size])
                out += head_scores(model, batch.to(model.device)).float().cpu().tolist()
        return out

    def pair_records(self, raw, scores) -> list[dict]:
        """The eval pass's records: both answers of the first pairs and their scores (`scores`: pairs x 2)."""
        from hftoolkit.sources.conversations import reference

        def shown(answer):
            return reference(answer) if is_conversation(answer) else answer

        return [{"chosen": shown(good), "rejected": shown(poor), "chosen_score": float(s[0]),
                 "rejected_score": float(s[1])}
                for good, poor, s in zip(raw["chosen"], raw["rejected"], scores)]


def split_input(given) -> tuple:
    """(prompt, answer) of one input to score: a (prompt, answer) pair as given; a conversation, its turns up to the
    last user turn and the answer after them; an answer alone, with an empty prompt."""
    if is_conversation(given):
        from hftoolkit.sources.conversations import question

        prompt = question(given)
        if len(prompt) == len(given):
            raise UserError("input: a conversation to score ends with the answer scored, an assistant turn: add it")
        return prompt, given[len(prompt):]
    if isinstance(given, (tuple, list)) and len(given) == 2:
        return given[0], given[1]
    return "", given


class PairCollator:
    """Pairs as one batch of 2B rows, the chosen answers first, padded on the right; "margin" (B,) beside them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def rows(self, encoded: list[dict]):
        return self.tokenizer.pad(encoded, padding=True, padding_side="right", return_tensors="pt")

    def __call__(self, features: list[dict]):
        import torch

        sides = [{k.removeprefix(f"{side}_"): v for k, v in f.items() if k.startswith(f"{side}_")}
                 for side in ("chosen", "rejected") for f in features]
        batch = self.rows(sides)
        batch[MARGIN] = torch.tensor([float(f.get(MARGIN, 0.0)) for f in features])
        return batch


def in_run_precision(job: Job, device: str):
    """The precision the Trainer ran the run's eval pass in: autocast to bf16 or fp16 (on a CPU with attention in
    fp32, as training/trainer.build_trainer sets it), or nothing for fp32."""
    import contextlib

    import torch

    if job.precision == "fp32":
        return contextlib.nullcontext()
    if job.precision == "bf16" and device == "cpu":
        from hftoolkit.job.hardware import attention_in_fp32
        from hftoolkit.patches.transformers_5 import attention_in_fp32_on_cpu

        if attention_in_fp32():
            attention_in_fp32_on_cpu()
    return torch.autocast(device, dtype=torch.bfloat16 if job.precision == "bf16" else torch.float16)


def head_scores(model, batch):
    """The head's one output per row: (rows,)."""
    return model(**{k: v for k, v in batch.items() if k != MARGIN}).logits[:, 0]


def pair_metrics(prediction) -> dict:
    """Over every held-out pair at once (predictions: pairs x (chosen score, rejected score); label_ids: margins):
    reward_accuracy, the share of pairs whose chosen answer scores higher (a tie counts half: a model that can't
    tell the answers apart is a coin toss); reward_margin, the mean chosen-minus-rejected score; the mean scores;
    and the loss, the mean Bradley-Terry loss, -log sigmoid(chosen - rejected - margin)."""
    import numpy as np

    scores = np.asarray(prediction.predictions, dtype=np.float64).reshape(-1, 2)
    margin = np.asarray(prediction.label_ids, dtype=np.float64).reshape(-1)
    delta = scores[:, 0] - scores[:, 1]
    return {"reward_accuracy": float(np.mean((delta > 0) + 0.5 * (delta == 0))),
            "reward_margin": float(delta.mean()), "reward_chosen": float(scores[:, 0].mean()),
            "reward_rejected": float(scores[:, 1].mean()), "loss": float(np.logaddexp(0.0, margin - delta).mean())}


def _text_pair(job: Job, tokenizer, prompt, answer) -> dict:
    """An encoder's text pair: the answer cut to its first data.max_target_length tokens, the prompt to its first
    data.max_length, then to what is left of their sum beside the answer and the special tokens (the prompt is cut
    first: the answer is what is scored). Conversations are written in the plain `role: content` format."""
    prompt, answer = _plain(tokenizer, prompt), _plain(tokenizer, answer)
    answer = _first_tokens(tokenizer, answer, job.max_target_length)
    room = job.max_length + job.max_target_length - tokenizer.num_special_tokens_to_add(pair=True)
    room -= len(tokenizer(answer, add_special_tokens=False)["input_ids"])
    prompt = _first_tokens(tokenizer, prompt, max(0, min(job.max_length, room)))
    encoded = tokenizer(prompt, answer)
    return {k: encoded[k] for k in ("input_ids", "token_type_ids") if k in encoded}


def _plain(tokenizer, value) -> str:
    if not is_conversation(value):
        return str(value)
    from hftoolkit.sources.conversations import render

    return render(tokenizer, value).strip()


def _first_tokens(tokenizer, text: str, count: int) -> str:
    """`text` up to the end of its first `count` tokens (the tokenizer's character offsets)."""
    if count <= 0:
        return ""
    try:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    except NotImplementedError:  # a Python ("slow") tokenizer: no character offsets
        raise UserError("model.checkpoint: the checkpoint's tokenizer can't say which characters each token covers "
                        "(a slow tokenizer), so prompts and answers can't be cut to data.max_length and "
                        "data.max_target_length: save its fast version (tokenizer.json) into the checkpoint") from None
    return text if len(offsets) <= count else text[:offsets[count - 1][1]]
