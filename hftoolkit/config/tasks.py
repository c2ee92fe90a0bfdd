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
    pipeline_tag: the Hugging Face Hub's name for the task (model cards).
    prompt_fraction: eval prediction records prompt with this share of each text (whole documents).
    text_pairs: data.text_pair_column may give each example a second text (MNLI's hypothesis, STS-B's
        second sentence), tokenized with the first as one pair, as transformers' run_glue.py does.
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
    pipeline_tag: str
    prompt_fraction: float = 1.0
    text_pairs: bool = False


TASKS = (
    TaskSpec("classification", columns=("text", "label"), labels="class", scoring="logits",
             main_metric="accuracy", greater_is_better=True,
             metrics=("accuracy", "f1", "precision", "recall", "matthews_correlation"),
             families=("encoder", "decoder", "seq2seq"), recommended="encoder",
             why="the output is a label for the whole input", pipeline_tag="text-classification", text_pairs=True),
    # GLUE reports STS-B as "Pearson/Spearman corr." with Pearson first (Wang et al., 2018, Table 1), and Pearson
    # is the official score of the STS shared tasks the set comes from (Cer et al., 2017): pearsonr is the main metric.
    TaskSpec("regression", columns=("text", "label"), labels="value", scoring="logits",
             main_metric="pearsonr", greater_is_better=True, metrics=("pearsonr", "spearmanr"),
             families=("encoder", "decoder", "seq2seq"), recommended="encoder",
             why="the output is a score for the whole input", pipeline_tag="text-classification", text_pairs=True),
    TaskSpec("tagging", columns=("text", "label"), labels="tags", scoring="logits",
             main_metric="f1", greater_is_better=True, metrics=("seqeval",),
             families=("encoder", "decoder"), recommended="encoder",
             why="the output is a label for every token", pipeline_tag="token-classification"),
    TaskSpec("mlm", columns=("text",), labels=None, scoring="loss",
             main_metric="perplexity", greater_is_better=False, metrics=(),
             families=("encoder",), recommended="encoder",
             why="masked-token prediction needs bidirectional attention", pipeline_tag="fill-mask"),
    TaskSpec("clm", columns=("text",), labels=None, scoring="loss",
             main_metric="perplexity", greater_is_better=False, metrics=(),
             families=("decoder",), recommended="decoder",
             why="the output continues a prompt", pipeline_tag="text-generation", prompt_fraction=0.25),
    TaskSpec("translation", columns=("text", "target"), labels=None, scoring="generation",
             main_metric="bleu", greater_is_better=True, metrics=("sacrebleu", "chrf"),
             families=("seq2seq", "decoder"), recommended="seq2seq",
             why="the output transforms a separate input", pipeline_tag="translation"),
    TaskSpec("summarization", columns=("text", "target"), labels=None, scoring="generation",
             main_metric="rougeL", greater_is_better=True, metrics=("rouge",),
             families=("seq2seq", "decoder"), recommended="seq2seq",
             why="the output transforms a separate input", pipeline_tag="summarization"),
    TaskSpec("instruction", columns=("text", "target"), labels=None, scoring="generation",
             main_metric="rougeL", greater_is_better=True, metrics=("rouge",),
             families=("decoder", "seq2seq"), recommended="decoder",
             why="the answer continues the conversation that the prompt starts",
             pipeline_tag="text-generation"),
    TaskSpec("denoise", columns=("text",), labels=None, scoring="loss",
             main_metric="perplexity", greater_is_better=False, metrics=(),
             families=("seq2seq",), recommended="seq2seq",
             why="the output reconstructs a corrupted separate input", pipeline_tag="text2text-generation"),
    TaskSpec("image-classification", columns=("image", "label"), labels="class", scoring="logits",
             main_metric="accuracy", greater_is_better=True, metrics=("accuracy", "f1"),
             families=("vision",), recommended="vision",
             why="the input is an image", pipeline_tag="image-classification"),
)

BY_NAME: dict[str, TaskSpec] = {task.name: task for task in TASKS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# Tasks a decoder does as one sequence, the prompt (text) then its target (families/decoder.py).
PROMPTED: tuple[str, ...] = tuple(t.name for t in TASKS if "target" in t.columns and "decoder" in t.families)
# The recipe key that names each canonical column in the user's data.
COLUMN_KEYS = {"text": "text_column", "label": "label_column", "target": "target_column", "image": "image_column",
               "text_pair": "text_pair_column"}


def spec(task: str) -> TaskSpec:
    return BY_NAME[task]


def advice(task: str, family: str | None) -> str | None:
    """The course's advice when a task is paired with another family than the one it recommends."""
    s = spec(task)
    if family is None or family == s.recommended:
        return None
    return (f"task {task!r} on the {family} family: the course recommends the {s.recommended} family ({s.why}); "
            "fine for comparing architectures")


def no_head(task: str, checkpoint: str, family: str) -> str:
    """Why `checkpoint`, of `family`, can't do `task`, and which families can."""
    s = spec(task)
    return (f"task {task!r} can't be done by {checkpoint!r}, {_a(family)} {family} model, because transformers has "
            f"no {family} head for it: use {_a(s.families[0])} {' or '.join(s.families)} checkpoint (the course "
            f"recommends {s.recommended}: {s.why})")


def _a(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
