"""`evaluate` metric modules shipped inside the package.

`evaluate.load("accuracy")` fetches its script from the Hub and fails offline; each
folder here holds `<name>/<name>.py`, which `evaluate.load(<folder>)` reads from disk.
The computations come from well-kept libraries (scikit-learn, sacrebleu, rouge-score,
seqeval). One import per line in those scripts: evaluate scans them for dependencies.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

HERE = Path(__file__).parent


def available() -> list[str]:
    return sorted(p.name for p in HERE.iterdir() if (p / f"{p.name}.py").is_file())


@cache
def load_metric(name: str):
    """The shipped evaluate module `name` (offline)."""
    import evaluate

    if name not in available():
        from hftoolkit.errors import UserError

        raise UserError(f"eval.metrics: unknown metric {name!r}; shipped metrics: {', '.join(available())}")
    return evaluate.load(str(HERE / name))


def label_metrics(names: list[str]):
    """EvalMetrics for one label per example (text or image classification): the named modules
    on argmax predictions; the main metric is the first name."""
    from hftoolkit.families import EvalMetrics

    modules = [load_metric(n) for n in names]

    def compute(prediction):
        predicted = prediction.predictions.argmax(-1)
        out = {}
        for module in modules:
            out.update(module.compute(predictions=predicted, references=prediction.label_ids))
        return out

    # Probabilities are (B, labels): tiny next to the hidden states, so reducing to them costs nothing.
    return EvalMetrics(compute, main=names[0], reduce_logits=lambda logits, labels: logits.softmax(-1))
