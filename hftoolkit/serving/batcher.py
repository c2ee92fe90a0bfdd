"""Requests answered in batches, by one worker thread that owns the models.

Requests that can share a forward pass (one base in memory, one formulation, the same settings) are gathered for
up to `max_wait` seconds and `max_batch` inputs, whichever comes first, and answered by the run's own formulation
(`generate`, as predict calls it). A batch may mix the adapters of one base: the model is handed to the
formulation wrapped in `Routed`, which passes peft's per-row `adapter_names` with every forward and generate call.
A streamed request is a batch of its own, its tokens handed to a streamer as they are made.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

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
    """The worker thread and its queue. `submit` returns the Future of the request's records, one per input."""

    def __init__(self, max_batch: int, max_wait: float):
        self.max_batch, self.max_wait = max_batch, max_wait
        self.queue: queue.Queue = queue.Queue()
        self.batches = self.answered = 0
        self.most_adapters = 0  # the most adapters one batch has mixed
        self.thread = threading.Thread(target=self._loop, name="hftoolkit-serve", daemon=True)
        self.thread.start()

    def submit(self, work: Work) -> Future:
        self.queue.put(work)
        return work.future

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=60)

    def _loop(self) -> None:
        held: deque = deque()  # taken from the queue while a batch of another kind was gathered
        while True:
            first = held.popleft() if held else self.queue.get()
            if first is None:
                return
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
        deadline = time.monotonic() + self.max_wait
        while size < self.max_batch and (left := deadline - time.monotonic()) > 0:
            try:
                work = self.queue.get(timeout=left)
            except queue.Empty:
                break
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
        try:
            model = Routed(base.model, names, first.streamer)
            records = first.run.form.generate(first.job, model, base.processor, inputs)
        except Exception as err:  # (the request fails, the server does not)
            if first.streamer is not None:
                first.streamer.end()
            for work in batch:
                work.future.set_exception(err)
            return
        self.batches += 1
        self.most_adapters = max(self.most_adapters, len(set(names or ())))
        start = 0
        for work in batch:
            work.future.set_result(records[start:start + len(work.inputs)])
            start += len(work.inputs)
            self.answered += 1
