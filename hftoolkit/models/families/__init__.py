"""The four model families, one module each, all implementing the `Family` protocol below.

A family module answers for every task it can do (tasks.py names them) through its `FORMULATIONS`:
task -> an object with the same five functions. Formulations that several families share (a text
classifier on an encoder, a decoder or an encoder-decoder) live in `labels.py`. Datasets reaching a
family carry data.py's canonical columns (text, label, target, image).
Modules load lazily: importing this package imports no torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hftoolkit.config.recipe import Recipe
    from hftoolkit.metrics import EvalMetrics

FAMILIES = ("encoder", "decoder", "seq2seq", "vision")


class Family(Protocol):
    """What train.py and evaluation.py ask of a family (or of one of its formulations)."""

    def load_model(self, recipe: Recipe) -> tuple[Any, Any]:
        """(model, processor): the checkpoint with the task head, quantized as asked, wrapped in LoRA."""

    def preprocess(self, recipe: Recipe, processor, dataset):
        """The dataset tokenized (or its images transformed), with a "length" column for batching."""

    def collator(self, recipe: Recipe, processor):
        """A function that turns a list of preprocessed examples into a batch of tensors."""

    def metrics(self, recipe: Recipe, processor) -> EvalMetrics:
        """How the eval split is scored, built on the shipped evaluate modules."""

    def generate(self, recipe: Recipe, model, processor, inputs: list, **options) -> list[dict]:
        """One prediction record per input (label and probability, tags, or generated text)."""


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
    """The family's module; it satisfies `Family`."""
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"hftoolkit.models.families.{name}")


def load_tokenizer(recipe: Recipe, **kwargs):
    """The checkpoint's tokenizer, with a pad token: a decoder without one (GPT-2) pads with its eos,
    which is safe because padding is masked out of attention and loss."""
    from transformers import AutoTokenizer

    from hftoolkit.models import loading as modeling

    with modeling.checkpoint_errors(recipe):
        tokenizer = AutoTokenizer.from_pretrained(modeling.resolve_checkpoint(recipe),
                                                  revision=recipe.model.revision, **kwargs)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def sync_pad_token(model, tokenizer) -> None:
    """Tell the model (and its generation config) which id pads: decoder classifiers find each row's last
    real token by it, and the Trainer would otherwise realign (and warn about) the configs itself."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.pad_token_id = tokenizer.pad_token_id
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.pad_token_id = tokenizer.pad_token_id
