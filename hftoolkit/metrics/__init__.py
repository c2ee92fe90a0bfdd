"""`evaluate` metric modules shipped inside the package.

`evaluate.load("accuracy")` fetches its script from the Hub and fails offline; each
folder here holds `<name>/<name>.py`, which `evaluate.load(<folder>)` reads from disk.
The computations come from well-kept libraries (scikit-learn, sacrebleu, rouge-score,
seqeval). One import per line in those scripts: evaluate scans them for dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent


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


def available() -> list[str]:
    return sorted(p.name for p in HERE.iterdir() if (p / f"{p.name}.py").is_file())


@cache
def load_metric(name: str):
    """The shipped evaluate module `name` (offline)."""
    import evaluate

    if name not in available():
        from hftoolkit.base.errors import UserError

        raise UserError(f"eval.metrics: unknown metric {name!r}; shipped metrics: {', '.join(available())}")
    return evaluate.load(str(HERE / name))


def label_metrics(names: list[str]):
    """EvalMetrics for one label per example (text or image classification): the named modules
    on argmax predictions; the main metric is the first name."""
    modules = [load_metric(n) for n in names]

    def compute(prediction):
        predicted = prediction.predictions.argmax(-1)
        out = {}
        for module in modules:
            out.update(module.compute(predictions=predicted, references=prediction.label_ids))
        return out

    # Probabilities are (B, labels): tiny next to the hidden states, so reducing to them costs nothing.
    return EvalMetrics(compute, main=names[0], reduce_logits=lambda logits, labels: first(logits).softmax(-1))


def first(logits):
    """The logits among a model's outputs: models that return more (BART's classifier also returns its
    encoder states) reach preprocess_logits_for_metrics as a tuple whose first item is the logits."""
    return logits[0] if isinstance(logits, tuple) else logits


# Shipped module -> the scores of it that go into metrics.json (the first is its main score).
TEXT_SCORES = {"sacrebleu": ("bleu",), "chrf": ("chrf",), "rouge": ("rougeL", "rouge1", "rouge2")}


def text_metrics(names: list[str]) -> EvalMetrics:
    """EvalMetrics for generated text: compute(predictions, references) -> the named modules' scores.

    Generation tasks are scored by evaluation/evaluate.py on the formulation's generated text over the whole eval
    split, so the Trainer's own evaluation computes the loss only and gathers no logits.
    """
    modules = {name: load_metric(name) for name in names}

    def compute(predictions: list[str], references: list[str]) -> dict:
        out = {}
        for name, module in modules.items():
            scores = module.compute(predictions=predictions, references=references)
            keep = TEXT_SCORES.get(name) or [k for k, v in scores.items() if isinstance(v, (int, float))]
            out.update({k: float(scores[k]) for k in keep})
        return out

    return EvalMetrics(compute, main=(TEXT_SCORES.get(names[0]) or (names[0],))[0])
