"""Requests answered by one worker thread that owns the models: in continuous batches, or in static ones.

Greedy decoder generation on a base that serves one set of weights goes through transformers' continuous batching
(continuous.py, which says which requests exactly): the worker hands such a request to a thread of its own, which
runs the run's formulation (`generate`, as predict calls it) with the model wrapped in `ContinuousModel`, and the
base's manager adds it to the batch in flight.

Every other request (labels, seq2seq, sampling, a base with several adapters) is answered in a static batch:
requests that can share a forward pass (one base in memory, one formulation, the same settings) are gathered, up to
`max_batch` inputs, and answered by the run's formulation. A batch may mix the adapters of one base: the model is
handed to the formulation wrapped in `Routed`, which passes peft's per-row `adapter_names` with every forward and
generate call. A streamed request is a batch of its own, its tokens handed to a streamer as they are made.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hftoolkit.serving.continuous import Continuous, ContinuousModel, answers_continuously
from hftoolkit.serving.limits import Limits
from hftoolkit.serving.registry import ServedRun


@dataclass(eq=False)
class Work:
    """One request: its run, its inputs, its job (the run's with the request's generation settings) and where the
    records go."""

    run: ServedRun
    inputs: list
    job: Any
    streamer: Any = None
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple:
        """What requests answered in one pass share: the model, the formulation, the lengths, the decoding (and
        where it samples, the seed it samples with)."""
        recipe, generation = self.job.recipe, self.job.recipe.eval.generation
        # (seq2seq generation sorts its inputs by length, so its rows would reach the model in another order than
        # their adapters' names: its adapters are not mixed)
        alone = self.run.adapter if self.run.job.model.family == "seq2seq" else None
        return (id(self.run.base), type(self.run.form), generation, recipe.data.max_length,
                recipe.data.max_target_length, recipe.training.seed if generation.strategy == "sample" else None,
                alone)


class Routed:
    """The model as a formulation sees it, with each row's adapter named in every call (peft's `adapter_names`);
    `streamer` goes to generate. Everything else is the model's own."""

    def __init__(self, model, names: list[str] | None, streamer=None):
        self._model, self._names, self._streamer = model, names, streamer

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def _routing(self, kwargs: dict) -> dict:
        if not self._names:
            return kwargs
        rows = next(v.shape[0] for k, v in kwargs.items() if k in ("input_ids", "pixel_values", "inputs_embeds"))
        names = self._names if len(set(self._names)) > 1 else self._names[:1] * rows  # (one run: any chunk size)
        return {**kwargs, "adapter_names": names}

    def __call__(self, *args, **kwargs):
        return self._model(*args, **self._routing(kwargs))

    def generate(self, *args, **kwargs):
        extra = {"streamer": self._streamer} if self._streamer is not None else {}
        return self._model.generate(*args, **self._routing(kwargs), **extra)


class Batcher:
    """The worker thread and its queue. `submit` returns the Future of the request's records, one per input.

    A static batch takes what is queued and goes. It waits up to `max_wait` for company only while the server is
    answering concurrent clients (the batch before it, ended less than `max_wait` ago, answered several requests)
    and nothing of another kind is queued behind it: their next requests are then on their way, and one batch of
    them costs one pass where a lone first request would cost two. A request on a quiet server never waits.
    """

    def __init__(self, max_batch: int, max_wait: float, max_new_tokens: int = Limits.max_tokens):
        self.max_batch, self.max_wait, self.max_new_tokens = max_batch, max_wait, max_new_tokens
        self.queue: queue.Queue = queue.Queue()
        self.batches = self.answered = 0
        self.answered_continuously = 0  # the requests of `answered` that continuous batching answered
        self.most_adapters = 0  # the most adapters one batch has mixed
        self._last_batch = (0, float("-inf"))  # (its requests, when it ended)
        self._continuous: dict[int, Continuous | None] = {}  # id(base) -> its manager (None: the static path)
        self._spare_processors: dict[int, list] = {}  # id(base) -> copies of its processor not lent out
        self._counting = threading.Lock()
        # The formulations seed torch's global generator around each generate call. A batch that samples holds this
        # while it runs, and a request in continuous batching holds it but while its tokens are being written, so
        # that no seeding of theirs lands in the middle of a sampled batch (which would then sample otherwise).
        self._seeding = threading.Lock()
        # (the formulation blocks until its tokens are written, so each request in continuous batching holds a
        # thread; twice max_batch keeps the next requests queued in the manager as the running ones end)
        self._pool = ThreadPoolExecutor(2 * max_batch, thread_name_prefix="hftoolkit-serve-continuous")
        self.thread = threading.Thread(target=self._loop, name="hftoolkit-serve", daemon=True)
        self.thread.start()

    def submit(self, work: Work) -> Future:
        self.queue.put(work)
        return work.future

    def close(self) -> None:
        """Stop taking requests; the requests handed to continuous batching are answered first."""
        self.queue.put(None)
        self.thread.join(timeout=60)
        self._pool.shutdown(wait=True)
        for continuous in self._continuous.values():
            if continuous is not None:
                continuous.close()

    def _loop(self) -> None:
        held: deque = deque()  # taken from the queue while a batch of another kind was gathered
        while True:
            first = held.popleft() if held else self.queue.get()
            if first is None:
                return
            if self._handed_over(first):
                continue
            batch = [first] if first.streamer is not None else self._gather(first, held)
            self._answer(batch)

    def _gather(self, first: Work, held: deque) -> list[Work]:
        batch, size = [first], len(first.inputs)
        for work in list(held):  # those already waiting come first
            if work is not None and work.streamer is None and work.key == first.key \
                    and size + len(work.inputs) <= self.max_batch:
                held.remove(work)
                batch.append(work)
                size += len(work.inputs)
        company, ended = self._last_batch
        busy = company > 1 and time.monotonic() - ended < self.max_wait
        deadline = time.monotonic() + (self.max_wait if busy else 0)
        while size < self.max_batch:
            left = deadline - time.monotonic()
            try:
                work = self.queue.get(timeout=left) if left > 0 and not held else self.queue.get_nowait()
            except queue.Empty:
                break
            if work is not None and self._handed_over(work):
                continue
            if work is not None and work.streamer is None and work.key == first.key \
                    and size + len(work.inputs) <= self.max_batch:
                batch.append(work)
                size += len(work.inputs)
            else:
                held.append(work)
                if work is None:
                    break
        return batch

    def _answer(self, batch: list[Work]) -> None:
        first = batch[0]
        base, inputs = first.run.base, [x for work in batch for x in work.inputs]
        names = [work.run.adapter for work in batch for _ in work.inputs] if first.run.adapter else None
        continuous = self._continuous.get(id(base))
        samples = first.job.recipe.eval.generation.strategy == "sample"
        try:
            model = Routed(base.model, names, first.streamer)
            with self._seeding if samples else contextlib.nullcontext(), \
                    continuous.paused() if continuous is not None else contextlib.nullcontext():
                records = first.run.form.generate(first.job, model, base.processor, inputs)
        except Exception as err:  # (the request fails, the server does not)
            if first.streamer is not None:
                first.streamer.end()
            for work in batch:
                work.future.set_exception(err)
            return
        finally:
            self._last_batch = (len(batch), time.monotonic())
        self.batches += 1
        self.most_adapters = max(self.most_adapters, len(set(names or ())))
        start = 0
        for work in batch:
            self._count(continuously=False)  # (before the answer: its client may look at once)
            work.future.set_result(records[start:start + len(work.inputs)])
            start += len(work.inputs)

    def _handed_over(self, work: Work) -> bool:
        """Whether the request went to continuous batching (answers_continuously decides which may), on a thread
        of the pool with a copy of its processor (a fast tokenizer is not to be used from two threads at once)."""
        if not answers_continuously(work.run, work.job):
            return False
        key = id(work.run.base)
        if key not in self._continuous:
            self._continuous[key] = Continuous.open(work.run, self.max_batch, self.max_new_tokens)
        continuous = self._continuous[key]
        if continuous is None or not continuous.running:
            return False
        spares = self._spare_processors.setdefault(key, [])
        processor = spares.pop() if spares else copy.deepcopy(work.run.base.processor)  # (copied by its owner)
        self._pool.submit(self._answer_continuously, work, continuous, processor, spares)
        return True

    def _answer_continuously(self, work: Work, continuous: Continuous, processor, spares: list) -> None:
        try:
            model = ContinuousModel(work.run.base.model, continuous, work.streamer, released=self._seeding)
            with self._seeding:
                records = work.run.form.generate(work.job, model, processor, work.inputs)
        except Exception as err:  # (the request fails, the server does not)
            if work.streamer is not None:
                work.streamer.end()
            work.future.set_exception(err)
            return
        finally:
            spares.append(processor)
        self._count(continuously=True)
        work.future.set_result(records)

    def _count(self, continuously: bool) -> None:
        with self._counting:
            self.answered += 1
            self.answered_continuously += continuously
