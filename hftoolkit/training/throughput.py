"""How fast a run went: tokens, padding, and achieved FLOP/s against this machine's matmul rate.

FLOPs convention (per real, non-padding token, N = parameters outside the embeddings):
  forward 2N; backward 2N for activation gradients plus 2N for weight gradients.
  Full fine-tuning: 6N. LoRA (frozen base, weight gradients only for the small adapters):
  about 4N. Attention adds 4 * layers * T * d per token forward (QK^T and AV, T the batch's
  padded length, d the model width), times 3 for full training and 2 for LoRA.
The rate is compared with a measured fp32 matrix multiply (the best this machine does).
"""

from __future__ import annotations

import json
import time
from functools import lru_cache


class TokenCounter:
    """Wraps a collator: counts real and padding tokens, and drops the "length" column."""

    def __init__(self, collate):
        self.collate = collate
        self.real = self.total = self.samples = 0
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

    def snapshot(self) -> dict:
        return {"real": self.real, "total": self.total, "samples": self.samples,
                "token_length_product": self.attention_flops}


def model_shape(model) -> dict:
    """Non-embedding parameter count, layers and width, read from the model and its config."""
    config = model.config
    embedding = sum(p.numel() for n, p in model.named_parameters()
                    if "embed" in n or n.endswith(("wte.weight", "wpe.weight", "shared.weight")))
    total = sum(p.numel() for p in model.parameters())
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None)), 0)
    return {"non_embedding": total - embedding, "layers": get("num_hidden_layers", "n_layer", "num_layers"),
            "width": get("hidden_size", "n_embd", "d_model")}


def training_flops(shape: dict, counts: dict, lora: bool) -> float:
    """FLOPs spent on real tokens under the module docstring's convention."""
    per_token = (4 if lora else 6) * shape["non_embedding"]
    attention = 4 * shape["layers"] * shape["width"] * counts["token_length_product"] * (2 if lora else 3)
    return per_token * counts["real"] + attention


@lru_cache(maxsize=1)
def matmul_flops_per_second(size: int = 1024, repeats: int = 5) -> float:
    """This machine's fp32 matrix-multiply rate (best of a few), cached on disk for the host."""
    import platform

    import torch

    from hftoolkit.sources.locations import cache_root

    path = cache_root() / "matmul-rate.json"
    key = f"{platform.node()}-{torch.get_num_threads()}-{torch.cuda.is_available()}"
    cached = json.loads(path.read_text()) if path.is_file() else {}
    if key in cached:
        return cached[key]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    rate = 2 * size**3 / best
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**cached, key: rate}))
    return rate


def efficiency(model, counts: dict, seconds: float, lora: bool, processes: int = 1) -> dict:
    """tokens/s, padding fraction and achieved FLOP/s (absolute and as a fraction of the matmul rate).

    `counts` are one process's; every process takes an equal share of each step, so the run's totals
    are `processes` times as large, and its matmul capacity is `processes` devices' worth.
    """
    counts = {k: v * processes for k, v in counts.items()}
    if not counts["total"] or seconds <= 0:
        return {"tokens_per_second": None, "padding_fraction": None, "flops_per_second": None,
                "matmul_fraction": None}
    achieved = training_flops(model_shape(model), counts, lora) / seconds
    return {
        "tokens_per_second": round(counts["real"] / seconds, 1),
        "padding_fraction": round(1 - counts["real"] / counts["total"], 4),
        "flops_per_second": round(achieved),
        "matmul_fraction": round(achieved / (processes * matmul_flops_per_second()), 4),
    }
