"""The four model families, one module each, all with the same five functions.

    load_model(recipe) -> (model, processor)        checkpoint, task head, quantization, LoRA
    preprocess(recipe, processor, dataset) -> dataset  tokenize or transform; adds a "length" column
    collator(recipe, processor)                      batches (dynamic padding, label masking, pixels)
    metrics(recipe, processor) -> EvalMetrics        built on the shipped evaluate modules
    generate(recipe, model, processor, inputs) -> list[dict]   predictions for predict and eval

Datasets reaching a family carry data.py's canonical columns (text, label, target, image).
Modules load lazily: importing this package imports no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

FAMILIES = ("encoder", "decoder", "seq2seq", "vision")


@dataclass
class EvalMetrics:
    """How a family scores its predictions.

    compute: for Trainer-scored tasks, takes an EvalPrediction; for generation tasks
        (translation, summarization) takes (predictions: list[str], references: list[str]).
    main: the metric named in reports and used to pick the best run; greater_is_better says which way.
    reduce_logits: applied to each eval batch's logits before they are gathered, so eval
        memory does not grow with vocabulary x examples (Trainer's preprocess_logits_for_metrics).
    """

    compute: Callable | None
    main: str
    greater_is_better: bool = True
    reduce_logits: Callable | None = None


def decoding_options(generation) -> dict:
    """A recipe's eval.generation section as keyword arguments of model.generate."""
    g = generation
    if g.strategy == "greedy":
        return dict(max_new_tokens=g.max_new_tokens, do_sample=False, num_beams=1)
    if g.strategy == "beam":
        return dict(max_new_tokens=g.max_new_tokens, do_sample=False, num_beams=g.num_beams,
                    length_penalty=g.length_penalty, early_stopping=True)
    # top_k 0 and top_p 1 switch those filters off (generate's own defaults would apply top_k=50).
    return dict(max_new_tokens=g.max_new_tokens, do_sample=True, num_beams=1, temperature=g.temperature,
                top_k=g.top_k or 0, top_p=g.top_p or 1.0)


def label_records(probabilities, id2label: dict) -> list[dict]:
    """One {"label", "probability"} record per row of class probabilities (an array, examples x classes)."""
    best = probabilities.argmax(-1)
    return [{"label": id2label[int(i)], "probability": round(float(row[i]), 4)} for row, i in zip(probabilities, best)]


def family_module(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"hftoolkit.families.{name}")
