"""How fast a run went: tokens, padding, and achieved FLOP/s against this machine's matmul rate.

`training_flops` counts the FLOPs spent on real tokens; `efficiency` compares that rate with what this machine's
matrix products reach at the run's precision and sizes (`matmul_flops_per_second`, measured once per host and
boot, and cached).
"""

from __future__ import annotations

import json
import statistics
import time
from functools import cache


class TokenCounter:
    """Wraps a collator: counts real and padding tokens, and drops the "length" column."""

    def __init__(self, collate):
        self.collate = collate
        self.real = self.total = self.samples = self.batches = 0
        self.attention_flops = 0.0  # sum over batches of real tokens x padded length (for the attention term)

    def __call__(self, features):
        for f in features:
            f.pop("length", None)
        tokens = sum(len(f["input_ids"]) for f in features if "input_ids" in f)
        batch = self.collate(features)
        self.count(batch, len(features), tokens)
        return batch

    def count(self, batch, samples: int, tokens: int = 0) -> None:
        """Add one collated batch of `samples` examples to the counts; a batch without an attention mask (packed
        rows, data.packing true) holds `tokens` real tokens, the rest of its input ids are padding."""
        mask = batch.get("attention_mask")
        if mask is None and "input_ids" in batch:  # (collated elsewhere, `tokens` unknown: the rows' padding counts)
            tokens = tokens or batch["input_ids"].numel()
            self.real += tokens
            self.total += batch["input_ids"].numel()
            self.attention_flops += tokens * batch["input_ids"].shape[-1]
        elif mask is not None:
            real = int(mask.sum())
            self.real += real
            self.total += mask.numel()
            self.attention_flops += real * mask.shape[-1]
        self.samples += samples
        self.batches += 1

    def snapshot(self) -> dict:
        return {"real": self.real, "total": self.total, "samples": self.samples, "batches": self.batches,
                "token_length_product": self.attention_flops}


def model_shape(model) -> dict:
    """Non-embedding parameter count, layers and width, read from the model and its config."""
    config = model.config
    embedding = sum(p.numel() for n, p in model.named_parameters()
                    if "embed" in n or n.endswith(("wte.weight", "wpe.weight", "shared.weight")))
    total = sum(p.numel() for p in model.parameters())
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None)), 0)
    width = get("hidden_size", "n_embd", "d_model")
    return {"non_embedding": total - embedding, "layers": get("num_hidden_layers", "n_layer", "num_layers"),
            "width": width, "intermediate": get("intermediate_size", "n_inner", "d_ff") or 4 * width}


def training_flops(shape: dict, counts: dict, lora: bool) -> float:
    """FLOPs spent on real tokens (not padding), N being the parameters outside the embeddings.

    Forward 2N per token; backward 2N for activation gradients plus 2N for weight gradients. Full fine-tuning:
    6N. LoRA (frozen base, weight gradients only for the small adapters): about 4N. Attention adds
    4 * layers * T * d per token forward (QK^T and AV, T the batch's padded length, d the model width), times 3
    for full training and 2 for LoRA."""
    per_token = (4 if lora else 6) * shape["non_embedding"]
    attention = 4 * shape["layers"] * shape["width"] * counts["token_length_product"] * (2 if lora else 3)
    return per_token * counts["real"] + attention


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@cache
def matmul_flops_per_second(precision: str = "fp32", tokens: int = 1024, width: int = 1024,
                            intermediate: int = 4096, again: bool = False, threads: int | None = None) -> float:
    """This machine's rate for a model layer's matrix products in `precision`: `tokens` x `width` inputs through
    four width x width products (attention) and two width x intermediate ones (feed-forward), best of a few.

    Measured once per host and boot (`_this_boot`), thread count, device, precision and size, and cached on disk.
    `tokens` is rounded up to a multiple of 64, so runs whose batches differ by a few tokens share one measurement.
    `again` measures anew and keeps the better of the two: a rate measured while the machine was busy is too low.
    `threads` measures on that many CPU threads instead of this process's (a plan for processes that share the
    machine).
    """
    import torch

    from hftoolkit.runs.rundir import write_atomic
    from hftoolkit.sources.locations import cache_root

    tokens = max(64, -(-tokens // 64) * 64)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if threads is not None and device == "cpu" and threads != torch.get_num_threads():
        own = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return matmul_flops_per_second(precision, tokens, width, intermediate, again)
        finally:
            torch.set_num_threads(own)
    path = cache_root() / "matmul-rate.json"
    key = f"{_this_boot()}-{torch.get_num_threads()}-{device}-{precision}-{tokens}x{width}x{intermediate}"
    cached = _read_rates(path)
    if key not in cached or again:
        rate = _measure(getattr(torch, DTYPES[precision]), device, tokens, width, intermediate)
        # Other processes (a run's ranks, parallel runs) share the file: merge with what it holds now, and
        # replace it whole, so that a reader never sees half of a write.
        cached = _read_rates(path)
        cached[key] = max(rate, cached.get(key, 0.0))
        write_atomic(path, json.dumps(cached).encode("utf-8"))
    return cached[key]


@cache
def elementwise_seconds_per_byte() -> float:
    """This CPU's pace at a training step's element-wise work, on one thread: seconds per byte the forward pass writes,
    its backward included, through what a transformer layer does besides its products (a norm, an activation,
    dropout, a residual, a softmax), with autograd, on a small batch's activations (how it is timed:
    `_elementwise_step_seconds_per_byte`). The plan's CPU constants are in its units, so that they hold on a faster or
    slower CPU (planning/timing.py). Separate kernels over large arrays were no measure of it: their speed differs
    between vendors' vector units several times more than a step's does. Measured once per host and boot and cached
    on disk beside the matmul rates (under a key of its own: an older version's reading was the best of a burst)."""
    import torch

    from hftoolkit.runs.rundir import write_atomic
    from hftoolkit.sources.locations import cache_root

    path, key = cache_root() / "matmul-rate.json", f"{_this_boot()}-elementwise-median"
    cached = _read_rates(path)
    if key not in cached:
        own = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            # (dropout and randn draw from the global generator: forked, so that a run's own draws stay as they were)
            with torch.random.fork_rng(devices=[]):
                seconds = _elementwise_step_seconds_per_byte()
        finally:
            torch.set_num_threads(own)
        cached = _read_rates(path)
        cached[key] = min(seconds, cached.get(key, seconds))  # (a busy machine's figure is too slow)
        write_atomic(path, json.dumps(cached).encode("utf-8"))
    return cached[key]


def _elementwise_step_seconds_per_byte(warm_up: float = 1.0, span: float = 1.0) -> float:
    """The median of a layer's element-wise work timed, forward and backward, for `span` seconds after `warm_up`
    seconds of it, over the bytes its forward pass writes. A fresh process's first timings, and the best of a
    short burst, differ from run to run here by more than a whole run's steps do; the median after a warm-up
    follows them."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(8, 128, 256).requires_grad_()
    weight = torch.ones(256, requires_grad=True)
    written = 7 * x.numel() * x.element_size()  # (norm, GELU, mask, dropout, residual, softmax, product)

    def step() -> float:
        start = time.perf_counter()
        h = F.dropout(F.gelu(F.layer_norm(x, (256,), weight)), 0.1, training=True) + x
        (torch.softmax(h, dim=-1) * x.detach()).sum().backward()
        x.grad = weight.grad = None
        return time.perf_counter() - start

    deadline = time.perf_counter() + warm_up
    while time.perf_counter() < deadline:
        step()
    times, deadline = [], time.perf_counter() + span
    while len(times) < 5 or time.perf_counter() < deadline:
        times.append(step())
    return statistics.median(times) / written


def _this_boot() -> str:
    """The cached rates' host: its name and, on Linux, its boot. Machines that share a name and a home directory
    (cloud machines and containers, a cluster's nodes) must not share a reading, nor a machine its reading from
    before a restart, which may have brought it up on other hardware."""
    import platform

    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{platform.node()}-{boot.read().strip()[:8]}"
    except OSError:
        return platform.node()


def _read_rates(path) -> dict[str, float]:
    """The cached rates; an unreadable file is only a cache, so its rates are measured again."""
    try:
        rates = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return rates if isinstance(rates, dict) else {}


def _measure(dtype, device: str, tokens: int, width: int, intermediate: int, seconds: float = 0.3) -> float:
    """FLOP/s of one layer's products (see matmul_flops_per_second): the best of passes repeated for `seconds`
    (at least five, after a warm-up), so that a busy machine's quieter moments are found."""
    import torch

    x = torch.randn(tokens, width, device=device, dtype=dtype)
    square, wide = (torch.randn(width, n, device=device, dtype=dtype) for n in (width, intermediate))
    narrow = torch.randn(tokens, intermediate, device=device, dtype=dtype)
    wide_t = wide.t().contiguous()

    def layer() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(4):
            x @ square
        x @ wide
        narrow @ wide_t
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    layer()
    times, deadline = [], time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < deadline:
        times.append(layer())
    return 2 * tokens * width * (4 * width + 2 * intermediate) / min(times)


def efficiency(model, counts: dict, seconds: float, lora: bool, processes: int = 1, precision: str = "fp32") -> dict:
    """tokens/s, padding fraction and achieved FLOP/s (absolute, and as a fraction of the matmul rate at the
    run's precision and sizes: its width, and its batches' mean padded token count on one process).

    `counts` are one process's; every process takes an equal share of each step, so the run's totals
    are `processes` times as large, and its matmul capacity is `processes` devices' worth. A fraction near 1 says
    the run goes as fast as the products it is made of can; the rest is everything else.
    """
    tokens_per_batch = counts["total"] // max(counts.get("batches", 1), 1)
    counts = {k: v * processes for k, v in counts.items()}
    if not counts["total"] or seconds <= 0:
        return {"tokens_per_second": None, "padding_fraction": None, "flops_per_second": None,
                "matmul_fraction": None}
    shape = model_shape(model)
    achieved = training_flops(shape, counts, lora) / seconds
    sizes = (precision, tokens_per_batch, shape["width"], shape["intermediate"])
    rate = matmul_flops_per_second(*sizes)
    if achieved > processes * rate:  # more than the products can do: the cached rate was measured on a busy machine
        matmul_flops_per_second.cache_clear()
        rate = matmul_flops_per_second(*sizes, again=True)
    return {
        "tokens_per_second": round(counts["real"] / seconds, 1),
        "padding_fraction": round(1 - counts["real"] / counts["total"], 4),
        "flops_per_second": round(achieved),
        "matmul_fraction": round(achieved / (processes * rate), 4),
    }
