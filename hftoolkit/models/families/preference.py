"""Preference pairs on a decoder (task preference): a prompt, the answer preferred and the one rejected, learned
by TRL's DPO trainer (training/preference.py). Prompts and answers are tokenized as an instruction run writes
them (`decoder.ChatPromptAndTarget`: the chat template, or the plain prompt and eos), so a preference run can start
from an instruction run and its model answers as it was tuned to.
"""

from __future__ import annotations

from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics
from hftoolkit.models import tokenized
from hftoolkit.sources import conversations
from hftoolkit.sources.pairs import common_prefix


class PreferencePairs:
    """TRL's tokenized layout: prompt_ids, chosen_ids and rejected_ids per pair, and a "length" for batching
    (the longer of the two sequences). The loss and its metrics are TRL's; records generate from the prompt."""

    def __init__(self, answers):
        self.answers = answers  # the instruction formulation: prompts, answers, generation

    def load_model(self, job: Job):
        return self.answers.load_model(job)

    def preprocess(self, job: Job, tokenizer, dataset):
        def encode(batch):
            prompts, chosen, rejected = self.encode(job, tokenizer, batch)
            return {"prompt_ids": prompts, "chosen_ids": chosen, "rejected_ids": rejected,
                    "length": [len(p) + max(len(c), len(r)) for p, c, r in zip(prompts, chosen, rejected)]}

        def encode_labelled(batch):  # kto: one answer per row, good or bad
            prompts, answers, _ = self.encode(job, tokenizer, {**batch, "chosen": batch["target"],
                                                                "rejected": batch["target"]})
            return {"prompt_ids": prompts, "completion_ids": answers, "label": batch["label"],
                    "length": [len(p) + len(a) for p, a in zip(prompts, answers)]}

        return tokenized.encode(job, tokenizer, dataset, encode_labelled if "label" in dataset.column_names else encode)

    def encode(self, job: Job, tokenizer, batch) -> tuple[list, list, list]:
        """(prompt ids, chosen answer ids, rejected answer ids) of a batch of pairs, texts or conversations."""
        if batch["text"] and isinstance(batch["text"][0], list):
            rows = [conversation_ids(tokenizer, prompt, good, poor, job.max_length, job.max_target_length)
                    for prompt, good, poor in zip(batch["text"], batch["chosen"], batch["rejected"])]
            return tuple(list(column) for column in zip(*rows)) if rows else ([], [], [])
        prompts = self.answers.prompts(job, tokenizer, batch["text"])
        return (prompts, self.answers.targets(job, tokenizer, batch["chosen"]),
                self.answers.targets(job, tokenizer, batch["rejected"]))

    def collator(self, job: Job, tokenizer):
        from hftoolkit.patches import trl_1_16

        return trl_1_16.collator(job.recipe.preference.unpaired, tokenizer.pad_token_id)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        # kto scores answers one at a time, so no pair is ranked: its main metric is the mean reward of the good
        # answers minus that of the bad ones.
        main = "reward_margin" if job.recipe.preference.unpaired else "reward_accuracy"
        return EvalMetrics(None, main, greater_is_better=True)

    def generate(self, job: Job, model, tokenizer, inputs: list) -> list[dict]:
        return self.answers.generate(job, model, tokenizer, inputs)


def conversation_ids(tokenizer, prompt: list[dict], good: list[dict], poor: list[dict], max_length: int,
                     max_answer: int) -> tuple[list[int], list[int], list[int]]:
    """A conversation pair as the chat template renders it: the prompt's ids up to the generation prompt, and each
    answer's ids after them. Where the prompt rendered alone is not a prefix of the whole rendering, the prompt
    ends where they part, as TRL's own tokenization does. The prompt keeps its last max_length tokens; an answer
    its first max_answer."""
    start = tokenizer(conversations.render(tokenizer, prompt, add_generation_prompt=True),
                      add_special_tokens=False)["input_ids"]
    whole = [tokenizer(conversations.render(tokenizer, prompt + answer), add_special_tokens=False)["input_ids"]
             for answer in (good, poor)]
    shared = min(common_prefix(start, ids) for ids in whole)
    return start[:shared][-max_length:], whole[0][shared:][:max_answer], whole[1][shared:][:max_answer]
