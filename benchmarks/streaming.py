"""Streaming: peak memory as the corpus grows, and how fast a stream is read and tokenized.

For each size (10k, 100k and 1M generated rows of 6 to 40 words, one JSON object a line) a fresh process
1. reads the whole file as the training stream does (data.streaming: read, tokenize, pack into blocks of
   data.max_length tokens) and times it: rows per second read and tokenized;
2. trains the decoder-clm recipe (init:gpt2, LoRA) for --steps steps on the stream;
and reports the process's peak RSS after both. With --in-memory the same run without data.streaming
(the whole file read and tokenized before the first step) is measured beside it.

    python benchmarks/streaming.py [--sizes 10000 100000 1000000] [--steps 300] [--in-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will more out up what about "
         "river mountain window garden letter engine market winter silver dinner").split()


def generate(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))), "id": i})
                    + "\n")


def recipe(path: Path, steps: int, streaming: bool) -> dict:
    import yaml

    raw = yaml.safe_load((ROOT / "recipes" / "decoder-clm.yaml").read_text())
    raw["data"].update(train=str(path), streaming=streaming, max_eval_samples=64, max_length=64)
    raw["training"].update(max_steps=steps, batch_size=8, logging_steps=50)
    raw["eval"].update(max_predictions=0)
    return raw


def worker(path: str, rows: int, steps: int, streaming: bool, out: str) -> None:
    from hftoolkit.base import console
    from hftoolkit.config.recipe import validate_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.models.load_report import explain_in_captures
    from hftoolkit.workflows.train import train

    explain_in_captures()  # as train's own captures do
    job_recipe = validate_recipe(recipe(Path(path), steps, streaming), "benchmark")
    result = {"rows": rows, "streaming": streaming}
    if streaming:  # a full pass over the stream: read, tokenized and packed, as training reads it
        with console.capture(verbosity=console.Verbosity.QUIET):
            job = resolve_job(job_recipe)
            blocks, started = 0, time.perf_counter()
            for _ in formulation(job).preprocess(job, job.model.processor, job.data["train"]):
                blocks += 1
        seconds = time.perf_counter() - started
        result.update(read_seconds=round(seconds, 1), rows_per_second=round((rows - 64) / seconds),
                      blocks=blocks)
    metrics = train(job_recipe, Path(out), ["benchmark"], overwrite=True, verbosity=console.Verbosity.QUIET)
    result.update(train_seconds=metrics["train_seconds"], data_seconds=metrics["data_seconds"],
                  peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--in-memory", action="store_true", help="measure the same runs without data.streaming")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        path, rows, steps, streaming, out = args.worker
        return worker(path, int(rows), int(steps), streaming == "1", out)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    print(f"| rows | data | read + tokenized rows/s | train s ({args.steps} steps) | peak RSS MB |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        env["HFTOOLKIT_CACHE"] = os.environ.get("HFTOOLKIT_CACHE", str(Path(tmp) / "cache"))
        for rows in args.sizes:
            path = Path(tmp) / f"corpus-{rows}.jsonl"
            generate(path, rows)
            for streaming in (True, False) if args.in_memory else (True,):
                command = [sys.executable, __file__, "--worker", str(path), str(rows), str(args.steps),
                           "1" if streaming else "0", str(Path(tmp) / "run")]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(f"| {rows:,} | failed | {done.stderr.strip().splitlines()[-1:]} |")
                    continue
                r = json.loads(line.removeprefix("RESULT "))
                rate = f"{r['rows_per_second']:,}" if streaming else "-"
                print(f"| {rows:,} | {'streamed' if streaming else 'in memory'} | {rate} | {r['train_seconds']} "
                      f"| {r['peak_rss_mb']:,} |", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
