"""`evaluate` metric modules shipped inside the package.

`evaluate.load("accuracy")` fetches its script from the Hub and fails offline; each
folder here holds `<name>/<name>.py`, which `evaluate.load(<folder>)` reads from disk.
The computations come from well-kept libraries (scikit-learn, sacrebleu, rouge-score,
seqeval). One import per line in those scripts: evaluate scans them for dependencies.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).parent


def available() -> list[str]:
    return sorted(p.name for p in HERE.iterdir() if (p / f"{p.name}.py").is_file())


@lru_cache(maxsize=None)
def load_metric(name: str):
    """The shipped evaluate module `name` (offline)."""
    import evaluate

    if name not in available():
        from hftoolkit.errors import UserError

        raise UserError(f"eval.metrics: unknown metric {name!r}; shipped metrics: {', '.join(available())}")
    return evaluate.load(str(HERE / name))
