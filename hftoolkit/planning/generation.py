"""What sampling answers costs a task grpo step (models/families/grpo.py): the key-value cache its answers hold
while they are written, and the products of writing them; planning/model.py adds the cache to the memory plan and
planning/timing.py the products to a step's time."""

from __future__ import annotations

import math

from hftoolkit.training.strategies.base import Spread


def generation_cache_bytes(shape: dict, recipe, spread: Spread, precision: str, lengths: dict) -> float:
    """The key-value cache of a process's answers as they are sampled (every answer of its share of the step's
    batch, prompt and answer at full length) with the logits of the last position of each."""
    e = 2 if precision in ("bf16", "fp16") else shape.get("dtype_bytes", 4)
    answers = max(1, math.ceil(recipe.training.batch_size * recipe.training.gradient_accumulation / spread.processes))
    tokens = lengths["max_length"] + recipe.rl.max_completion_length
    head_dim = shape["hidden"] // max(1, shape["heads"])
    cache = 2 * shape["layers"] * shape["kv_heads"] * head_dim * tokens * answers * e
    return cache + answers * shape["vocab"] * 4


def generation_flops(shape: dict, recipe, lengths: dict) -> float:
    """A step's sampling: the prompts' forward pass, then each answer's tokens one at a time (2N each, and the
    attention over the cache so far)."""
    rows = recipe.training.batch_size * recipe.training.gradient_accumulation / recipe.rl.num_iterations
    prompt, answer = lengths["max_length"], recipe.rl.max_completion_length
    per_token = 2 * shape["non_embedding"] + 2 * shape["hidden"] * shape["vocab"]
    attention = 4 * shape["layers"] * shape["hidden"] * (prompt * prompt / 2 + answer * (prompt + answer / 2))
    return rows * ((prompt + answer) * per_token + attention)
