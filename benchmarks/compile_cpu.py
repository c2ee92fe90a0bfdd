"""training.compile on a CPU: the same hftoolkit job eager and under torch.compile (inductor).

The classification job of classification.py (a BERT-family checkpoint, LoRA r=8 on query and value,
batch 32, max length 64, SST-2 phrases; MiniLM and ../shared/data/sst2 when present, else init:bert and
builtin:sentiment), trained for a short and a long number of steps, eager and compiled. Two lengths split
each mode's train time into a one-off cost (compilation, warm-up) and a steady per-step time:

    per step = (long - short) / (long steps - short steps);  one-off = short - short steps x per step

Each run compiles from scratch (its own inductor cache folder), as a first run does. Compilation
specializes on shapes; batches of varying length (dynamic padding) recompile or fall back to dynamic
shapes, which the per-step time of the longer run includes.

    python benchmarks/compile_cpu.py [--short 10] [--long 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from classification import prepare  # noqa: E402  (the same data and checkpoint as the classification benchmark)


def train_seconds(workdir: Path, checkpoint: str, train: Path, dev: Path, steps: int, compiled: bool) -> float:
    recipe = workdir / "compile.yaml"
    recipe.write_text(json.dumps({
        "name": "bench-compile", "task": "classification", "model": {"checkpoint": checkpoint},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.1, "targets": ["query", "value"]},
        "data": {"train": str(train), "eval": str(dev), "max_length": 64, "label_names": ["0", "1"],
                 "max_eval_samples": 64},
        "training": {"max_steps": steps, "batch_size": 32, "learning_rate": 2e-3, "logging_steps": 50,
                     "compile": compiled},
        "eval": {"batch_size": 64, "metrics": ["accuracy"], "max_predictions": 0},
    }))
    run = workdir / "run"
    # Each run compiles from scratch, as a first run does: inductor's on-disk cache would otherwise hand
    # the second run the first one's kernels.
    cache = tempfile.mkdtemp(dir=workdir, prefix="inductor-")
    out = subprocess.run([sys.executable, "-m", "hftoolkit", "train", str(recipe), "--output", str(run),
                          "--overwrite"], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "TORCHINDUCTOR_CACHE_DIR": cache})
    if out.returncode:
        sys.exit(f"{'compiled' if compiled else 'eager'} {steps} steps failed:\n{out.stderr[-3000:]}")
    return json.loads((run / "metrics.json").read_text())["train_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        checkpoint, train, dev = prepare(workdir, 32 * args.long)
        print(f"checkpoint {checkpoint}; {args.short} and {args.long} steps of batch 32", flush=True)
        rows = {}
        for mode, compiled in (("eager", False), ("compiled", True)):
            short = train_seconds(workdir, checkpoint, train, dev, args.short, compiled)
            long = train_seconds(workdir, checkpoint, train, dev, args.long, compiled)
            per_step = (long - short) / (args.long - args.short)
            rows[mode] = {"short": short, "long": long, "per_step": per_step, "one_off": short - args.short * per_step}
            print(f"  {mode}: {short:.1f} s / {long:.1f} s", flush=True)
    print(f"{'':10}{f'{args.short} steps s':>14}{f'{args.long} steps s':>14}{'per step s':>12}{'one-off s':>11}")
    for mode, r in rows.items():
        print(f"{mode:10}{r['short']:14.1f}{r['long']:14.1f}{r['per_step']:12.3f}{r['one_off']:11.1f}")
    eager, compiled = rows["eager"], rows["compiled"]
    faster = 0 < compiled["per_step"] < eager["per_step"]
    print(f"compiled / eager, {args.long} steps: {compiled['long'] / eager['long']:.2f}; per step: "
          f"{compiled['per_step'] / eager['per_step']:.2f}; compilation pays for itself after "
          + (f"{(compiled['one_off'] - eager['one_off']) / (eager['per_step'] - compiled['per_step']):.0f} steps"
             if faster else "no number of steps (a compiled step is not faster here)"))


if __name__ == "__main__":
    main()
