"""Decoder text generation through transformers' continuous batching (generation/continuous_batching).

A request that `answers_continuously` is answered by the run's own formulation, as every request is, with the model
wrapped in `ContinuousModel`: its `generate` hands each prompt row to the base's `ContinuousBatchingManager`, whose
loop adds a request to the running batch at its next step and drops it when it ends (Orca's iteration-level
scheduling, Yu et al., OSDI 2022), instead of waiting for a whole static batch to finish. The formulation still
builds the prompts, the stop tokens and the decoding settings, and decodes the tokens, so an answer is the one the
batcher's other path writes for the same request.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import queue
import threading
from math import ceil

from hftoolkit.serving.registry import GENERATES, ServedRun

# Attention kernels continuous batching runs as the model was loaded with. Any other (eager) it would switch, on the
# model the batcher's other path shares, to its own paged version, which plain `generate` can't run.
KEPT_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3")

# Tokens a cache page holds. Requests whose prompts begin alike (the chat template's system prompt, a shared
# instruction, few-shot examples) share the pages of that beginning and skip prefilling it, but transformers shares
# whole pages only: its default of 256 tokens is longer than most chat prompts, so nothing would be shared. 16 is
# vLLM's default block size.
PAGE_TOKENS = 16


def answers_continuously(run: ServedRun, job) -> bool:
    """Whether a request goes through continuous batching: greedy text from a decoder whose base serves one set of
    weights (a merged or fully fine-tuned model, or a base with a single adapter), loaded with an attention kernel
    continuous batching keeps. Every other request keeps the batcher's other path:
    - encoder and label runs, and seq2seq runs (continuous batching is for decoders);
    - a base that serves several adapters: the manager runs one set of weights for all its rows, and peft routes
      adapters per row only through `adapter_names` in forward and generate calls (`Routed`);
    - sampling: that path seeds each batch with training.seed, so that a sampled answer is reproducible as predict's
      is; the manager samples from one generator shared by whatever else is in flight. Beam search it has none of;
    - eager attention (KEPT_ATTENTION says why).
    A base whose checkpoint asks for logits processing (a repetition penalty in its generation_config, say), or
    whose manager could not be started, keeps that path too: the batcher learns it when it opens the manager
    (`Continuous.open`)."""
    return (run.kind == GENERATES and run.job.model.family == "decoder" and len(run.base.adapters) <= 1
            and job.recipe.eval.generation.strategy == "greedy"
            and getattr(run.base.model.config, "_attn_implementation", None) in KEPT_ATTENTION)


class Continuous:
    """One base's manager, started on its first request, and the thread that hands each output to the request
    waiting for it (outputs come from one queue shared by every request)."""

    def __init__(self, manager):
        self.manager = manager
        self._inboxes: dict[str, queue.SimpleQueue] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closing = threading.Event()
        self._delivering = threading.Thread(target=self._deliver, name="hftoolkit-serve-outputs", daemon=True)
        self._delivering.start()

    @classmethod
    def open(cls, run: ServedRun, max_batch: int, max_new_tokens: int) -> Continuous | None:
        """The manager for the run's base, or None where greedy answers could differ from the other path's (logits
        processing) or it can't start. Its paged cache is allocated once, for `max_batch` requests of the longest
        prompt the run keeps (data.max_length) and `max_new_tokens`, so no request is ever evicted to make room (the
        pages kept for prompts' shared beginnings are given up first)."""
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        model = run.base.model.get_base_model() if hasattr(run.base.model, "get_base_model") else run.base.model
        settings = copy.deepcopy(model.generation_config)
        settings.update(do_sample=False, num_beams=1)  # (per request: max_new_tokens and eos)
        longest = run.job.max_length + max(max_new_tokens, run.job.max_new_tokens)
        limits = ContinuousBatchingConfig(
            page_size=PAGE_TOKENS, num_blocks=max_batch * ceil(longest / PAGE_TOKENS), max_requests_per_batch=max_batch,
            max_batch_tokens=max(64, max_batch * run.job.max_length),  # (every prompt of a full batch in one step)
            auto_switch_to_flash=False, drop_unsupported_processors=False)
        manager = None
        try:
            manager = model.init_continuous_batching(generation_config=settings, continuous_batching_config=limits)
            # (no manager.warmup(): the batch processor it makes outside the generation loop is thrown away there, and
            # the loop's steps then ran slower; a cache that can't be allocated fails the loop, and the requests)
            if not manager.logit_processor.do_processing:
                manager.start()
                return cls(manager)
        except Exception:  # (that base keeps the other path; the request is answered there)
            pass
        if manager is not None:
            manager.destroy()
        return None

    @property
    def running(self) -> bool:
        return self.manager.is_running()

    def paused(self):
        """A context in which the other path may use the model: the manager's loop waits at its next step."""
        return self.manager.pause() if self.running else contextlib.nullcontext()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, eos: int | list[int], streamer=None):
        """The new token ids of each prompt, greedy, up to an eos or max_new_tokens; `streamer` (one prompt) is fed as
        generate feeds it: the prompt first, then the tokens as they come, then end()."""
        import torch

        with self._lock:
            ids = [f"hftoolkit-{next(self._ids)}" for _ in prompts]
            inboxes = {rid: queue.SimpleQueue() for rid in ids}
            self._inboxes.update(inboxes)  # (before the request is added: its output may come at once)
        try:
            for rid, prompt in zip(ids, prompts):
                if self.manager.add_request(prompt, request_id=rid, max_new_tokens=max_new_tokens,
                                            eos_token_id=eos, streaming=streamer is not None) is None:
                    raise RuntimeError("continuous batching has stopped: the server is shutting down or its "
                                       "generation loop failed")
            if streamer is not None:
                streamer.put(torch.tensor(prompts[0]))
            answers = [self._collect(inboxes[rid], streamer) for rid in ids]
            if streamer is not None:
                streamer.end()
            return answers
        finally:
            with self._lock:
                for rid in ids:
                    self._inboxes.pop(rid, None)

    def close(self) -> None:
        """Stop the manager once its requests are done (the server drained them), and the delivering thread."""
        self.manager.stop(block=True, timeout=60)
        self._closing.set()
        self._delivering.join(timeout=10)

    @staticmethod
    def _collect(inbox: queue.SimpleQueue, streamer) -> list[int]:
        import torch

        written = 0
        while True:
            output = inbox.get()
            if isinstance(output, Exception) or output.error is not None:
                raise RuntimeError(f"generation failed: {output if isinstance(output, Exception) else output.error}")
            if streamer is not None and len(output.generated_tokens) > written:
                streamer.put(torch.tensor(output.generated_tokens[written:]))
                written = len(output.generated_tokens)
            if output.is_finished():
                return list(output.generated_tokens)

    def _deliver(self) -> None:
        while not self._closing.is_set():
            output = self.manager.get_result(timeout=0.2)
            if output is not None:
                with self._lock:
                    inbox = self._inboxes.get(output.request_id)
                if inbox is not None:
                    inbox.put(output)
            elif not self.manager.is_running():  # (the loop ended: nothing more will come for those waiting)
                with self._lock:
                    waiting = list(self._inboxes.values())
                for inbox in waiting:
                    inbox.put(RuntimeError("the continuous batching loop stopped"))
                self._closing.wait(0.2)


class ContinuousModel:
    """The model as a formulation sees it, its `generate` answered by the base's manager: the rows of the
    left-padded batch go in as prompts, and the prompts come back followed by the new tokens, padded on the right
    with pad_token_id as generate pads a row that ended early. Everything else is the model's own. `released`, a
    lock the caller holds, is let go while the tokens are being written."""

    def __init__(self, model, continuous: Continuous, streamer=None, released: threading.Lock | None = None):
        self._model, self._continuous, self._streamer = model, continuous, streamer
        self._released = released

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def generate(self, input_ids, attention_mask=None, max_new_tokens=None, eos_token_id=None, pad_token_id=None,
                 **decoding):
        import torch

        if decoding.get("do_sample") or decoding.get("num_beams", 1) != 1:
            raise ValueError(f"continuous batching answers greedy requests only, not {decoding}")
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        prompts = [row[keep.bool()].tolist() for row, keep in zip(input_ids, mask)]
        with _let_go(self._released):
            new = self._continuous.generate(prompts, max_new_tokens, eos_token_id, self._streamer)
        width = max(map(len, new), default=0)
        rows = [row + tokens + [pad_token_id] * (width - len(tokens)) for row, tokens in zip(input_ids.tolist(), new)]
        return torch.tensor(rows, dtype=input_ids.dtype, device=input_ids.device)


@contextlib.contextmanager
def _let_go(lock: threading.Lock | None):
    if lock is None:
        yield
        return
    lock.release()
    try:
        yield
    finally:
        lock.acquire()
