"""The lengths a training step is planned at, from the data where it is at hand.

Batches pad to their longest row, so a set of short texts under a long data.max_length trains shorter steps than
the recipe's lengths say. `train` tokenizes a sample of its train split as its formulation will (in memory, never
into the tokenized cache) and plans a step's time at the padded length a batch of it has under the run's order:
the expected longest of a batch of random rows, the mean of length-sorted batches' longest, or each row's own
length where a batch is one packed row. Memory is planned at the lengths a batch can reach: the recipe's, or the
data's longest where the whole train split was tokenized (by preflight: pairs, conversations; or by the plan: a split
of up to WHOLE_SPLIT_ROWS rows).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import replace

from hftoolkit.config import tasks
from hftoolkit.job.spec import Job
from hftoolkit.sources.labels import IGNORE_INDEX

# Rows tokenized for the plan: enough for a batch's expected longest to settle, few enough to take a moment. A
# split of up to WHOLE_SPLIT_ROWS is tokenized whole instead: then its longest row is known, and no batch is longer.
SAMPLE_ROWS, WHOLE_SPLIT_ROWS = 512, 2048


def memory_lengths(job: Job) -> dict:
    """The recipe's lengths (as clamped), lowered to the data's longest where it was measured (findings.longest)."""
    longest = job.findings.longest
    lengths = {"max_length": job.max_length, "max_target_length": job.max_target_length}
    return {**{key: min(value, longest.get(key, value)) for key, value in lengths.items()},
            "max_new_tokens": job.max_new_tokens}


def with_data_longest(job: Job, sample) -> Job:
    """The job with the data's longest row as its memory bound (findings.longest), where `sample` is its whole train
    split and preflight measured none; the job as it is otherwise."""
    if job.findings.longest or sample is None or len(sample) == 0 or len(job.data["train"]) > WHOLE_SPLIT_ROWS \
            or "length" not in sample.column_names:
        return job
    lengths = sample["length"]
    labels = sample["labels"] if "labels" in sample.column_names else None
    longest = {"max_length": max(lengths)}
    if labels is not None and isinstance(labels[0], list):
        if job.family == "seq2seq":
            longest["max_target_length"] = max(len(row) for row in labels)
        elif job.recipe.task in tasks.prompted():  # (a prompt and its answer: the longest of each, as preflight's)
            answers = [sum(t != IGNORE_INDEX for t in row) for row in labels]
            longest = {"max_length": max(n - a for n, a in zip(lengths, answers)), "max_target_length": max(answers)}
    return replace(job, findings=replace(job.findings, longest=longest))


def step_lengths(job: Job, bound: dict, sample) -> dict:
    """`bound` (the memory plan's lengths) lowered to what an average step's rows hold, from `sample`, a tokenized
    sample of the train split (`tokenized_sample`; an online RL task's prompts, its answers planned at their bound);
    `bound` itself where there is none (a stream, images, no data)."""
    if sample is None or len(sample) == 0 or "length" not in sample.column_names:
        return bound
    from hftoolkit.planning.model import decoder_sequences

    recipe = job.recipe
    rows = max(1, math.ceil(recipe.training.batch_size / (job.strategy.processes if job.strategy else 1)))
    if recipe.rl is not None:  # (a batch's answers are sampled from its prompts, padded to the longest; random order)
        prompts = max(1, math.ceil(rows / recipe.rl.num_generations))
        return {**bound, "max_length": min(bound["max_length"], round(padded(sample["length"], prompts, "random")))}
    order = "packed" if recipe.data.packing == "padding_free" else recipe.training.sampling
    if job.family == "seq2seq":
        source = {"max_length": min(bound["max_length"], round(padded(sample["length"], rows, order)))}
        if not isinstance(sample[0].get("labels"), list):  # (a class label: no target sequence)
            return {**bound, **source}
        targets = [len(labels) for labels in sample["labels"]]
        return {**bound, **source,
                "max_target_length": min(bound["max_target_length"], round(padded(targets, rows, order)))}
    total = min(decoder_sequences(recipe, bound)[2], round(padded(sample["length"], rows, order)))
    if recipe.task not in tasks.prompted() or "labels" not in sample.column_names:
        # (one sequence a row: the prompt's share is what the plan's products see, its answer none of it)
        answered = recipe.task in tasks.prompted() or recipe.task in tasks.paired()
        return {**bound, "max_length": total, **({"max_target_length": 0} if answered else {})}
    # A prompted decoder row: its answer is where logits are made, the mean over rows of its labelled tokens.
    answer = min(total, round(sum(sum(t != IGNORE_INDEX for t in labels) for labels in sample["labels"])
                              / len(sample)))
    return {**bound, "max_length": max(1, total - answer), "max_target_length": answer}


def trained_rows(job: Job, sample) -> int:
    """The rows training draws its batches from: the train split's, as its formulation makes them from the sample
    (`tokenized_sample`), scaled to the whole split; a causal LM's text packed into blocks of data.max_length is as
    many rows as its blocks, not its documents. The split's rows where there is no sample."""
    count = len(job.data["train"])
    if sample is None:
        return count
    drawn = count if count <= WHOLE_SPLIT_ROWS else SAMPLE_ROWS  # (as tokenized_sample draws them)
    return max(1, round(count * len(sample) / drawn))


def padded(lengths: list[int], rows: int, order: str) -> float:
    """The mean padded length of a batch of `rows` rows of these lengths: under random order the expected longest
    of `rows` drawn at random; length-sorted batches' mean longest (group_by_length); a packed batch's mean
    row length (it pads nothing)."""
    ordered = sorted(lengths)
    n = len(ordered)
    if order == "packed" or rows == 1:
        return sum(ordered) / n
    if order == "group_by_length":
        longest = ordered[::-1][::rows]
        return sum(longest) / len(longest)
    # E[max of `rows` draws] = sum of x_(i) * (P(max <= x_(i)) - P(max <= x_(i-1))), P(max <= x_(i)) = (i/n)^rows
    return sum(x * ((i / n) ** rows - ((i - 1) / n) ** rows) for i, x in enumerate(ordered, start=1))


def tokenized_sample(job: Job):
    """The train split tokenized by the job's formulation in memory: all of it up to WHOLE_SPLIT_ROWS, else
    SAMPLE_ROWS rows drawn from the run's seed; an online RL task's prompts, counted as TRL tokenizes them; None where
    no sample can be had."""
    from hftoolkit.models import tokenized
    from hftoolkit.models.families import formulation
    from hftoolkit.sources.streaming import is_stream

    train = (job.data or {}).get("train")
    processor = job.model.processor
    if train is None or is_stream(train) or processor is None or job.family == "vision":
        return None
    count = len(train)
    # (select keeps its indices in memory, where shuffle would write them beside a cached set)
    picked = range(count) if count <= WHOLE_SPLIT_ROWS else sorted(random.Random(job.recipe.training.seed).sample(
        range(count), SAMPLE_ROWS))
    rows = train.select(picked)
    with tokenized.in_memory():
        done = formulation(job).preprocess(job, processor, rows)
        if job.recipe.rl is not None:
            done = done.map(lambda row: {"length": _prompt_tokens(processor, row["prompt"])})
    return done


def _prompt_tokens(tokenizer, prompt) -> int:
    """A prompt's tokens as TRL writes it before sampling: a conversation through the chat template with the
    assistant's turn opened, a text as it is."""
    if not isinstance(prompt, list):
        return len(tokenizer(prompt)["input_ids"])
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if isinstance(ids, Mapping) else ids)
