"""GPU check: BERT-base on SST-2, full fine-tuning in bf16, LoRA + 8-bit, LoRA + 4-bit, and DDP on 2 GPUs.

Each variant is one `hftoolkit train` of the same job (SST-2 train phrases, scored on the 872 dev sentences,
max length 64, batch 32, one epoch), in its own process so that peak GPU memory is the variant's own:

- full fine-tuning, training.precision bf16 (lr 3e-5);
- LoRA r=16 on all linear layers with 8-bit weights, and with 4-bit NF4 weights (double quantization,
  bf16 compute), lr 5e-4;
- full fine-tuning on 2 processes (DDP, the same global batch), when the machine has 2 GPUs or more.

It prints one table: train seconds, samples/s, tokens/s, MFU, peak GPU memory and dev accuracy. MFU is
hftoolkit's achieved FLOP/s (the FLOPs convention of hftoolkit/training/throughput.py: 6N per real token for full
fine-tuning, 4N for LoRA, plus attention) over the GPU's dense bf16 peak (a table of known GPUs, else
--peak-tflops). Offline: BERT-base and SST-2 come from the Hugging Face cache (HF_HUB_OFFLINE=1), or from
--checkpoint and --data-dir (a folder with SST-2's train.tsv and dev.tsv, as GLUE ships them).

    python benchmarks/gpu.py [--train-size 20000] [--checkpoint google-bert/bert-base-uncased] [--data-dir DIR]
    python benchmarks/gpu.py --dry-run      # the plan and the recipes, without training (any machine)
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
CHECKPOINTS = ("google-bert/bert-base-uncased", "bert-base-uncased")
SST2_HUB = (("stanfordnlp/sst2", None), ("nyu-mll/glue", "sst2"), ("glue", "sst2"))
# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from the vendors' data sheets; matched on the device name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "GH200": 989.0, "H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 NVL": 835.0,
                    "H100 PCIe": 756.0, "H100": 756.0, "A100": 312.0, "L40S": 362.0, "L40": 181.0, "L4": 121.0,
                    "A10": 125.0}
VARIANTS = {
    "full fine-tuning bf16": dict(quantization="none", lora=False, lr=3e-5, processes=1),
    "LoRA + 8-bit": dict(quantization="8bit", lora=True, lr=5e-4, processes=1),
    "LoRA + 4-bit": dict(quantization="4bit", lora=True, lr=5e-4, processes=1),
    "full fine-tuning bf16, DDP x2": dict(quantization="none", lora=False, lr=3e-5, processes=2),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=20000, help="SST-2 train phrases (sampled with seed 0)")
    parser.add_argument("--checkpoint", default=None, help="BERT-base: hub id (from the cache) or a local folder")
    parser.add_argument("--data-dir", type=Path, default=None, help="folder holding SST-2's train.tsv and dev.tsv")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not in "
                                                                        "the table")
    parser.add_argument("--variants", nargs="*", default=None, choices=list(VARIANTS), metavar="VARIANT",
                        help="a subset of: " + "; ".join(VARIANTS))
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the recipes; train nothing")
    return parser.parse_args(argv)


def recipe_for(variant: str, checkpoint: str, train: Path, dev: Path, batch_size: int) -> dict:
    """The hftoolkit recipe of one variant (validated by hftoolkit itself before it trains)."""
    v = VARIANTS[variant]
    recipe = {
        "name": "gpu-" + variant.lower().replace(" ", "-").replace(",", "").replace("+", "plus"),
        "task": "classification",
        "model": {"checkpoint": checkpoint, "quantization": v["quantization"]},
        "lora": {"enabled": v["lora"], "r": 16, "alpha": 32, "dropout": 0.05, "targets": "all-linear"},
        "data": {"train": str(train), "eval": str(dev), "max_length": 64, "label_names": ["0", "1"]},
        "training": {"epochs": 1, "batch_size": batch_size, "learning_rate": v["lr"], "warmup_ratio": 0.06,
                     "precision": "bf16", "logging_steps": 50, "seed": 0},
        "eval": {"batch_size": 256, "metrics": ["accuracy"], "max_predictions": 0},
    }
    if v["quantization"] == "4bit":
        recipe["model"]["double_quant"] = True
    return recipe


def peak_tflops(device_name: str, given: float | None) -> float | None:
    """The GPU's dense bf16 peak: --peak-tflops, else the longest table entry found in the device name."""
    if given:
        return given
    found = [key for key in PEAK_BF16_TFLOPS if key in device_name]
    return PEAK_BF16_TFLOPS[max(found, key=len)] if found else None


def sst2(data_dir: Path | None, workdir: Path, size: int) -> tuple[Path, Path]:
    """train.csv and dev.csv (columns text,label) from --data-dir or the Hugging Face datasets cache."""
    import pandas as pd

    if data_dir is not None:
        train = pd.read_csv(data_dir / "train.tsv", sep="\t", quoting=3)
        dev = pd.read_csv(data_dir / "dev.tsv", sep="\t", quoting=3)
    else:
        import datasets

        for name, config in SST2_HUB:
            try:
                loaded = datasets.load_dataset(name, config)
                break
            except Exception:  # not in this machine's cache: try the next name
                continue
        else:
            sys.exit("SST-2 is in neither --data-dir nor the datasets cache (stanfordnlp/sst2, nyu-mll/glue sst2)")
        train, dev = loaded["train"].to_pandas(), loaded["validation"].to_pandas()
    train, dev = (frame.rename(columns={"sentence": "text", "content": "text"}) for frame in (train, dev))
    train = train.sample(n=min(size, len(train)), random_state=0)
    paths = workdir / "train.csv", workdir / "dev.csv"
    for frame, path in zip((train, dev), paths):
        frame[["text", "label"]].to_csv(path, index=False)
    return paths


def find_checkpoint(given: str | None) -> str:
    if given:
        return given
    from huggingface_hub import snapshot_download

    for name in CHECKPOINTS:
        try:
            snapshot_download(name, local_files_only=True)
            return name
        except Exception:  # not in the cache
            continue
    sys.exit(f"BERT-base is not in the Hugging Face cache ({', '.join(CHECKPOINTS)}): pass --checkpoint")


def run_variant(variant: str, recipe: dict, workdir: Path) -> dict:
    path = workdir / f"{recipe['name']}.yaml"
    path.write_text(json.dumps(recipe))
    run_dir = workdir / recipe["name"]
    processes = VARIANTS[variant]["processes"]
    argv = [sys.executable, "-m", "hftoolkit", "train", str(path), "--output", str(run_dir), "--overwrite"]
    argv += ["--num-processes", str(processes)] if processes > 1 else []
    started = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1][:150]}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {**metrics, "end_to_end_seconds": time.perf_counter() - started, "processes": processes}


def format_table(rows: dict[str, dict], peak: float | None) -> str:
    """One table: a line per variant (peak: the GPU's dense bf16 TFLOP/s, for MFU)."""
    head = f"{'variant':32}{'train s':>9}{'samples/s':>11}{'tokens/s':>11}{'MFU':>7}{'peak MB':>10}{'accuracy':>10}"
    lines = [head, "-" * len(head)]
    for variant, r in rows.items():
        if "error" in r:
            lines.append(f"{variant:32}  failed: {r['error']}")
            continue
        mfu = (r["flops_per_second"] / (peak * 1e12 * r.get("processes", 1))
               if peak and r.get("flops_per_second") else None)
        lines.append(f"{variant:32}{r['train_seconds']:9.1f}{r['samples_per_second']:11.1f}"
                     f"{r['tokens_per_second'] or 0:11.0f}{'' if mfu is None else f'{mfu:.1%}':>7}"
                     f"{r['peak_memory_mb']:10.0f}{r['eval']['accuracy']:10.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    variants = args.variants or list(VARIANTS)
    if args.dry_run:
        from hftoolkit.config.recipe import validate_recipe

        for variant in variants:
            recipe = recipe_for(variant, args.checkpoint or CHECKPOINTS[0], Path("train.csv"), Path("dev.csv"),
                                args.batch_size)
            validate_recipe(recipe, variant)
            print(f"{variant}:\n  {json.dumps(recipe)}")
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA GPU (use --dry-run to see the plan)")
    gpus, device = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    peak = peak_tflops(device, args.peak_tflops)
    checkpoint = find_checkpoint(args.checkpoint)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        train, dev = sst2(args.data_dir, workdir, args.train_size)
        print(f"{device} x {gpus}, peak {peak or '?'} bf16 TFLOP/s; {checkpoint}; SST-2 {args.train_size} train, "
              f"872 dev; batch {args.batch_size}, max length 64, 1 epoch", flush=True)
        for variant in variants:
            if VARIANTS[variant]["processes"] > gpus:
                rows[variant] = {"error": f"needs {VARIANTS[variant]['processes']} GPUs, this machine has {gpus}"}
                continue
            rows[variant] = run_variant(variant, recipe_for(variant, checkpoint, train, dev, args.batch_size), workdir)
            print(f"  {variant}: done", flush=True)
    print(format_table(rows, peak))


if __name__ == "__main__":
    main()
