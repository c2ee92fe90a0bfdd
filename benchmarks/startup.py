"""Startup: wall time of `hftoolkit --help` and `hftoolkit validate` (best of several runs).

    python benchmarks/startup.py
"""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def best_of(argv: list[str], repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        best = min(best, time.perf_counter() - start)
    return best


if __name__ == "__main__":
    cli = [sys.executable, "-m", "hftoolkit"]
    print(f"hftoolkit --help:    {best_of(cli + ['--help']):.3f} s (target < 0.3)")
    recipe = str(ROOT / "recipes" / "encoder-classification.yaml")
    print(f"hftoolkit validate:  {best_of(cli + ['validate', recipe]):.3f} s")
    print(f"python -c pass:      {best_of([sys.executable, '-c', 'pass']):.3f} s (the interpreter alone)")
