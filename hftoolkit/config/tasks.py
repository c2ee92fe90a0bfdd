"""What each task is, in one table: the only place these facts are stated.

Everything the toolkit knows per task (the columns it reads, the head each family loads for it, how it is
scored, whether benchmarks apply, the main metric of a report) is read from `TASKS` here, at call time. To add
a task, add one entry and give each family it names a formulation (models/families/*.py, `FORMULATIONS`);
tests/unit/config/test_tasks.py shows a new entry reaching every consumer. Light: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Task names, for code that branches on one task.
CLASSIFICATION = "classification"
REGRESSION = "regression"
TAGGING = "tagging"
MLM = "mlm"
CLM = "clm"
TRANSLATION = "translation"
SUMMARIZATION = "summarization"
INSTRUCTION = "instruction"
DENOISE = "denoise"
IMAGE_CLASSIFICATION = "image-classification"
PREFERENCE = "preference"
REWARD = "reward"
GRPO = "grpo"

# The transformers Auto classes a family's formulation loads (job/architectures.py reads their tables).
SEQ_CLS = "AutoModelForSequenceClassification"
TOKEN_CLS = "AutoModelForTokenClassification"
MASKED_LM = "AutoModelForMaskedLM"
CAUSAL_LM = "AutoModelForCausalLM"
SEQ2SEQ_LM = "AutoModelForSeq2SeqLM"
IMAGE_CLS = "AutoModelForImageClassification"
# Heads that score or write text: what lm-evaluation-harness can benchmark.
LANGUAGE_MODEL_HEADS = (CAUSAL_LM, SEQ2SEQ_LM)


@dataclass(frozen=True)
class TaskSpec:
    """One task.

    columns: canonical columns a data set must provide (data.py renames the user's to these);
        the first is the input that prediction records show.
    labels: "class" (one class per example), "tags" (one class per word), "value" (one float) or None.
    scoring: "logits" (metrics from the Trainer's eval pass), "generation" (metrics on generated
        text over the eval split), "loss" (perplexity, exp of the eval loss), "preference" (the implicit
        rewards of held-out pairs: reward accuracy and margin), "reward" (a reward model's scores of held-out
        pairs: pairwise accuracy and mean margin) or "rl" (the mean reward of answers sampled for held-out
        prompts).
    metrics: the shipped evaluate modules used when eval.metrics is auto; main_metric comes first.
    heads: family -> the Auto class its formulation loads, for every family that does the task; a
        refusal names the families in this order.
    recommended: the family the course's decision tree picks, and why.
    pipeline_tag: the Hugging Face Hub's name for the task (model cards).
    keeps_trained_head: a checkpoint already fine-tuned with this head keeps it (its label count must fit
        the data's); otherwise the head is built afresh.
    packs: the decoder's formulation can pack several examples into one row (data.packing true).
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
    heads: dict[str, str] = field(hash=False)
    recommended: str
    why: str
    pipeline_tag: str
    keeps_trained_head: bool = False
    packs: bool = False
    prompt_fraction: float = 1.0
    text_pairs: bool = False

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(self.heads)


_LABEL_HEADS = {"encoder": SEQ_CLS, "decoder": SEQ_CLS, "seq2seq": SEQ_CLS}
# A decoder writes a target after its prompt as one sequence; an encoder-decoder writes it with its decoder.
_WRITTEN = {"seq2seq": SEQ2SEQ_LM, "decoder": CAUSAL_LM}

TASKS = (
    TaskSpec(CLASSIFICATION, columns=("text", "label"), labels="class", scoring="logits",
             main_metric="accuracy", greater_is_better=True,
             metrics=("accuracy", "f1", "precision", "recall", "matthews_correlation"),
             heads=_LABEL_HEADS, recommended="encoder", why="the output is a label for the whole input",
             pipeline_tag="text-classification", keeps_trained_head=True, text_pairs=True),
    # GLUE reports STS-B as "Pearson/Spearman corr." with Pearson first (Wang et al., 2018, Table 1), and Pearson
    # is the official score of the STS shared tasks the set comes from (Cer et al., 2017): pearsonr is the main metric.
    TaskSpec(REGRESSION, columns=("text", "label"), labels="value", scoring="logits",
             main_metric="pearsonr", greater_is_better=True, metrics=("pearsonr", "spearmanr"),
             heads=_LABEL_HEADS, recommended="encoder", why="the output is a score for the whole input",
             pipeline_tag="text-classification", keeps_trained_head=True, text_pairs=True),
    TaskSpec(TAGGING, columns=("text", "label"), labels="tags", scoring="logits",
             main_metric="f1", greater_is_better=True, metrics=("seqeval",),
             heads={"encoder": TOKEN_CLS, "decoder": TOKEN_CLS}, recommended="encoder",
             why="the output is a label for every token", pipeline_tag="token-classification",
             keeps_trained_head=True),
    TaskSpec(MLM, columns=("text",), labels=None, scoring="loss",
             main_metric="perplexity", greater_is_better=False, metrics=(),
             heads={"encoder": MASKED_LM}, recommended="encoder",
             why="masked-token prediction needs bidirectional attention", pipeline_tag="fill-mask"),
    TaskSpec(CLM, columns=("text",), labels=None, scoring="loss",
             main_metric="perplexity", greater_is_better=False, metrics=(),
             heads={"decoder": CAUSAL_LM}, recommended="decoder",
             why="the output continues a prompt", pipeline_tag="text-generation", packs=True, prompt_fraction=0.25),
    TaskSpec(TRANSLATION, columns=("text", "target"), labels=None, scoring="generation",
             main_metric="bleu", greater_is_better=True, metrics=("sacrebleu", "chrf"),
             heads=_WRITTEN, recommended="seq2seq",
             why="the output transforms a separate input", pipeline_tag="translation", packs=True),
    TaskSpec(SUMMARIZATION, columns=("text", "target"), labels=None, scoring="generation",
             main_metric="rougeL", greater_is_better=True, metrics=("rouge",),
             heads=_WRITTEN, recommended="seq2seq",
             why="the output transforms a separate input", pipeline_tag="summarization", packs=True),
    TaskSpec(INSTRUCTION, columns=("text", "target"), labels=None, scoring="generation",
             main_metric="rougeL", greater_is_better=True, metrics=("rouge",),
             heads={"decoder": CAUSAL_LM, "seq2seq": SEQ2SEQ_LM}, recommended="decoder",
             why="the answer continues the conversation that the prompt starts",
             pipeline_tag="text-generation", packs=True),
    TaskSpec(DENOISE, columns=("text",), labels=None, scoring="loss",
             main_metric="perplexity", greater_is_better=False, metrics=(),
             heads={"seq2seq": SEQ2SEQ_LM}, recommended="seq2seq",
             why="the output reconstructs a corrupted separate input", pipeline_tag="text2text-generation"),
    TaskSpec(IMAGE_CLASSIFICATION, columns=("image", "label"), labels="class", scoring="logits",
             main_metric="accuracy", greater_is_better=True, metrics=("accuracy", "f1"),
             heads={"vision": IMAGE_CLS}, recommended="vision",
             why="the input is an image", pipeline_tag="image-classification"),
    # Preference pairs: one prompt (text), a preferred answer and a rejected one. TRL's preference trainers read
    # causal LMs only, so the decoder is the one family.
    TaskSpec(PREFERENCE, columns=("text", "chosen", "rejected"), labels=None, scoring="preference",
             main_metric="reward_accuracy", greater_is_better=True, metrics=(),
             heads={"decoder": CAUSAL_LM}, recommended="decoder",
             why="the answer is ranked against another answer to the same prompt", pipeline_tag="text-generation"),
    # A reward model: one score per prompt and answer, learned from the same pairs (Bradley-Terry).
    TaskSpec(REWARD, columns=("text", "chosen", "rejected"), labels=None, scoring="reward",
             main_metric="reward_accuracy", greater_is_better=True, metrics=(),
             heads={"encoder": SEQ_CLS, "decoder": SEQ_CLS}, recommended="encoder",
             why="the output is one score for a whole prompt and answer", pipeline_tag="text-classification"),
    # Online RL on prompts: the model samples answers, reward functions score them (TRL's GRPO trainer).
    TaskSpec(GRPO, columns=("text",), labels=None, scoring="rl", main_metric="reward", greater_is_better=True,
             metrics=(), heads={"decoder": CAUSAL_LM}, recommended="decoder",
             why="the model's own answers are sampled and scored", pipeline_tag="text-generation"),
)

# The recipe key that names each canonical column in the user's data.
COLUMN_KEYS = {"text": "text_column", "label": "label_column", "target": "target_column", "image": "image_column",
               "text_pair": "text_pair_column", "chosen": "chosen_column", "rejected": "rejected_column"}


def names() -> tuple[str, ...]:
    return tuple(t.name for t in TASKS)


def find(task: str | None) -> TaskSpec | None:
    return next((t for t in TASKS if t.name == task), None)


def spec(task: str) -> TaskSpec:
    found = find(task)
    if found is None:
        raise KeyError(f"unknown task {task!r}; known: {', '.join(names())}")
    return found


def head(task: str, family: str | None) -> str | None:
    """The Auto class `family`'s formulation of `task` loads; None where the family does not do the task."""
    found = find(task)
    return found.heads.get(family or "") if found else None


def prompted() -> tuple[str, ...]:
    """Tasks a decoder does as one sequence, the prompt (text) then its target (families/decoder.py)."""
    return tuple(t.name for t in TASKS if "target" in t.columns and "decoder" in t.heads)


def paired() -> tuple[str, ...]:
    """Tasks whose examples are two answers to one prompt, the chosen and the rejected (preference, reward): their
    data is read, checked and counted the same way (sources/pairs.py)."""
    return tuple(t.name for t in TASKS if "chosen" in t.columns)


def packed() -> tuple[str, ...]:
    """The tasks whose decoder formulation packs examples into rows; data.packing true is refused for the others."""
    return tuple(t.name for t in TASKS if t.packs)


def language_model_tasks(family: str) -> tuple[str, ...]:
    """The tasks whose head on `family` scores or writes text: the runs benchmarks can score."""
    return tuple(t.name for t in TASKS if t.heads.get(family) in LANGUAGE_MODEL_HEADS)


def trained_head(task: str, family: str) -> str | None:
    """The class-name ending ("ForSequenceClassification") of a fine-tuned checkpoint whose head the task
    keeps; None where the task builds its head afresh."""
    found = find(task)
    if found is None or not found.keeps_trained_head or family not in found.heads:
        return None
    return found.heads[family].removeprefix("AutoModel")


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
