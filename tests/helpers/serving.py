"""`hftoolkit serve` in this process: trained runs served from a thread on 127.0.0.1 (any free port), the short
training that makes runs to serve, and predict's answers to check a server's against."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import run_cli

QUICK = ("training.max_steps=4", "data.max_train_samples=64", "data.max_eval_samples=8", "eval.max_predictions=0")


@contextmanager
def serving(pairs, api_key=None, max_batch=8, max_wait=0.05, **limits):
    """The runs (NAME, RUN_DIR) served on 127.0.0.1 from a thread; yields (base URL, the served runs, the batcher)."""
    import uvicorn

    from hftoolkit.serving.api import build_app
    from hftoolkit.serving.batcher import Batcher
    from hftoolkit.serving.limits import Limits
    from hftoolkit.serving.registry import load_runs

    served = load_runs(pairs, max_batch, progress=lambda line: None)
    batcher = Batcher(max_batch, max_wait)
    from hftoolkit.cli.serving import listening

    sock = listening("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(build_app(served, batcher, Limits(**limits), api_key),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(600):
            if server.started:
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", served, batcher
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        batcher.close()
        sock.close()


@contextmanager
def gathered(batcher, requests: int, timeout: float = 60.0):
    """Inside it, the worker's first batch waits (up to `timeout`) until it and the queue hold all `requests`, so that
    the rest reach the next batch together: what concurrent clients cause on a quiet machine, made certain on a loaded
    one, where the clients' requests may come one by one (or two may reach the first batch together)."""
    answer, first = batcher._answer, threading.Event()

    def held(batch):
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + timeout
            while len(batch) + batcher.queue.qsize() < requests and time.monotonic() < deadline:
                time.sleep(0.01)
        return answer(batch)

    batcher._answer = held
    try:
        yield
    finally:
        batcher._answer = answer


def predicted(run: Path, *args: str) -> list[dict]:
    """What `hftoolkit predict RUN ARGS --format jsonl` answers, one dict a line."""
    return [json.loads(line) for line in run_cli("predict", run, *args, "--format", "jsonl").stdout.splitlines()]
