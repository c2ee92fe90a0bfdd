"""What each task is, in one table: the only place these facts are stated.

Every other set the toolkit uses (columns a task reads, tasks scored by generated text,
tasks reported as perplexity, the main metric of a report, the families allowed by the
recipe validator) is derived from `TASKS` below. To add a task, add one entry and give
the families it names a formulation for it (families/*.py, `FORMULATIONS`).

Light: imports nothing beyond the standard library (the recipe validator and the report use it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    """One task.

    columns: canonical columns a data set must provide (data.py renames the user's to these);
        the first is the input that prediction records show.
    labels: "class" (one class per example), "tags" (one class per word), "value" (one float) or None.
    scoring: "logits" (metrics from the Trainer's eval pass), "generation" (metrics on generated
        text over the eval split) or "loss" (perplexity, exp of the eval loss).
    metrics: the shipped evaluate modules used when eval.metrics is auto; main_metric comes first.
    families: every family with a transformers head or a formulation for the task.
    recommended: the family the course's decision tree picks, and why.
    prompt_fraction: eval prediction records prompt with this share of each text (whole documents).
    """

    name: str
    columns: tuple[str, ...]
    labels: str | None
    scoring: str
    main_metric: str
    greater_is_better: bool
    metrics: tuple[str, ...]
    families: tuple[str, ...]
    recommended: str
    why: str
    prompt_fraction: float = 1.0


TASKS = (
    TaskSpec("classification", ("text", "label"), "class", "logits", "accuracy", True,
             ("accuracy", "f1", "precision", "recall", "matthews_correlation"),
             ("encoder", "decoder", "seq2seq"), "encoder", "the output is a label for the whole input"),
    TaskSpec("tagging", ("text", "label"), "tags", "logits", "f1", True, ("seqeval",),
             ("encoder", "decoder"), "encoder", "the output is a label for every token"),
    TaskSpec("mlm", ("text",), None, "loss", "perplexity", False, (),
             ("encoder",), "encoder", "masked-token prediction needs bidirectional attention"),
    TaskSpec("clm", ("text",), None, "loss", "perplexity", False, (),
             ("decoder",), "decoder", "the output continues a prompt", prompt_fraction=0.25),
    TaskSpec("translation", ("text", "target"), None, "generation", "bleu", True, ("sacrebleu", "chrf"),
             ("seq2seq", "decoder"), "seq2seq", "the output transforms a separate input"),
    TaskSpec("summarization", ("text", "target"), None, "generation", "rougeL", True, ("rouge",),
             ("seq2seq", "decoder"), "seq2seq", "the output transforms a separate input"),
    TaskSpec("denoise", ("text",), None, "loss", "perplexity", False, (),
             ("seq2seq",), "seq2seq", "the output reconstructs a corrupted separate input"),
    TaskSpec("image-classification", ("image", "label"), "class", "logits", "accuracy", True, ("accuracy", "f1"),
             ("vision",), "vision", "the input is an image"),
)

BY_NAME: dict[str, TaskSpec] = {task.name: task for task in TASKS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# The recipe key that names each canonical column in the user's data.
COLUMN_KEYS = {"text": "text_column", "label": "label_column", "target": "target_column", "image": "image_column"}


def spec(task: str) -> TaskSpec:
    return BY_NAME[task]
