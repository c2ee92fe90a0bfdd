"""The four model families, one module each, and the `Family` protocol their formulations follow.

A family module maps every task it can do (tasks.py names them) to a formulation through its `FORMULATIONS`;
formulations several families share live in `labels.py`. Modules load lazily: importing this package imports
no torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from hftoolkit.config.families import FAMILIES

if TYPE_CHECKING:
    from hftoolkit.job.spec import Job
    from hftoolkit.metrics import EvalMetrics


class Family(Protocol):
    """What training and evaluation ask of a family's formulation of a task. The datasets it is handed carry
    data.py's canonical columns (text, label, target, image), never the user's column names."""

    def load_model(self, job: Job) -> tuple[Any, Any]:
        """(model, processor): the checkpoint with the task head, quantized as asked, wrapped in LoRA."""

    def preprocess(self, job: Job, processor, dataset):
        """The dataset tokenized (or its images transformed), with a "length" column for batching."""

    def collator(self, job: Job, processor):
        """A function that turns a list of preprocessed examples into a batch of tensors."""

    def metrics(self, job: Job, processor) -> EvalMetrics:
        """How the eval split is scored, built on the shipped evaluate modules."""

    def generate(self, job: Job, model, processor, inputs: list, **options) -> list[dict]:
        """One prediction record per input (label and probability, tags, or generated text)."""


def decoding_options(job: Job) -> dict:
    """The recipe's eval.generation section as keyword arguments of model.generate (new tokens as clamped)."""
    g, new = job.recipe.eval.generation, job.max_new_tokens
    if g.strategy == "greedy":
        return dict(max_new_tokens=new, do_sample=False, num_beams=1)
    if g.strategy == "beam":
        return dict(max_new_tokens=new, do_sample=False, num_beams=g.num_beams,
                    length_penalty=g.length_penalty, early_stopping=True)
    # top_k 0 and top_p 1 switch those filters off (generate's own defaults would apply top_k=50).
    return dict(max_new_tokens=new, do_sample=True, num_beams=1, temperature=g.temperature,
                top_k=g.top_k or 0, top_p=g.top_p or 1.0)


def label_records(probabilities, id2label: dict) -> list[dict]:
    """One {"label", "probability"} record per row of class probabilities (an array, examples x classes)."""
    best = probabilities.argmax(-1)
    return [{"label": id2label[int(i)], "probability": round(float(row[i]), 4)} for row, i in zip(probabilities, best)]


def formulation(job: Job) -> Family:
    """What does the job's task on its family: one entry of the family module's `FORMULATIONS`."""
    return family_module(job.family).FORMULATIONS[job.task]


def family_module(name: str) -> ModuleType:
    """The family's module; it satisfies `Family`."""
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"hftoolkit.models.families.{name}")


def sync_pad_token(model, tokenizer) -> None:
    """Tell the model (and its generation config) which id pads: decoder classifiers find each row's last
    real token by it, and the Trainer would otherwise realign (and warn about) the configs itself."""
    if tokenizer is None:  # (a model built from its config alone, for a plan: planning/plan.py)
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.pad_token_id = tokenizer.pad_token_id
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.pad_token_id = tokenizer.pad_token_id
