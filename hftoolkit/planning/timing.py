"""The time a run will take, per step and in all, before any weight is loaded (`hftoolkit plan`).

`plan_time` divides a step's FLOPs (training/throughput.py's convention) by the GPU's peak x utilisation, or this
CPU's measured matmul rate, and on a CPU adds what a step does besides its products, item by item (why each:
docs/architecture.md, "The memory and time plan"). The model's shape and the sequences a step holds come from
planning/model.py, which plans the memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from hftoolkit.config import tasks
from hftoolkit.job.devices import Device
from hftoolkit.planning.generation import generation_flops
from hftoolkit.planning.items import weight_bytes as _weight_bytes
from hftoolkit.planning.model import (
    FSDP2_COPIES,
    LANGUAGE_MODEL_SCORING,
    activation_bytes,
    decoder_sequences,
    is_preference,
)
from hftoolkit.training.strategies.base import Spread

# A CPU step's time besides its products, measured by benchmarks/plan.py on one thread of a CPU whose element-wise
# pace (training/throughput.elementwise_seconds_per_byte) was CPU_REFERENCE_PACE; on another CPU each is scaled by
# the ratio of its own pace to that one (`cpu_pace`), as the products are planned at its own measured rate: the
# fixed work of a step (`overhead_calibration`: the steady step of a model of a fraction of a MiB, one row a step,
# less its planned items); the Trainer's clipping, optimizer step and zero_grad per trainable parameter
# (`optimizer_calibration`); gloo's (latency s, bytes of the full tensor per s) per collective between two processes
# (`gloo_calibration`). (The constants were measured on an Intel Xeon without bf16 units, and held unscaled on an AMD
# EPYC with AVX2 only (docs/plan.md): this is that EPYC's pace, as the pace is read now, the median after a warm-up:
# docs/plan.md, "The pace".) The fixed work is (seconds a step, seconds a step per layer): each layer's modules are
# called, wrapped and differentiated every step, whatever its batch (`layer_overhead_calibration`: init:bert's width
# at two depths, one row a step).
CPU_REFERENCE_PACE = 7.1e-10
CPU_STEP_SECONDS = (0.0055, 0.00245)
# What `trainer.train()` takes once a run besides its steps, on a CPU: the optimizer and scheduler made and prepared,
# the data loader started, the first step's allocations. Measured by benchmarks/plan_runs.py (`start_calibration`:
# a recipe's train_seconds at two step counts, the intercept).
CPU_START_SECONDS = 0.031
CPU_OPTIMIZER_SECONDS = {"adamw": 9.9e-9, "adamw_fused": 2.6e-9, "sgd": 2.1e-9}
GLOO = {"all_reduce": (1.6e-4, 1.8e9), "all_gather": (1.4e-4, 1.4e9), "reduce_scatter": (2.5e-4, 0.85e9)}
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
# One thread's copy rate, at which FSDP2 makes its copies (benchmarks/plan.py, `copy_calibration`).
CPU_COPY_BYTES_PER_SECOND = 6.7e9
# Seconds per byte of activations a step writes, for its element-wise work: measured by benchmarks/plan.py
# (`activation_calibration`: the median over its one-process rows of the step less every other planned item, over
# the planned activations). FORWARD_WORK is the forward pass's share of it, against the whole step's: checkpointing's
# second forward pass does it again, and a sequence scored without gradients (a reference model's) does it once.
CPU_ACTIVATION_SECONDS, FORWARD_WORK = 1.97e-9, 0.5
# An online RL step's sampling writes its answers one token at a time, each a forward pass of the whole model whose
# fixed work (generate's per-token bookkeeping, and each layer's modules called) outweighs a small model's products:
# (seconds a token, seconds a token per layer), measured by benchmarks/plan.py (`decode_calibration`: a tiny
# GPT-2 with LoRA sampling at two depths). CPU_RL_STEP_SECONDS: what TRL's GRPO step does besides (scoring the
# answers, their advantages, its logging), measured by `rl_step_calibration` (the GRPO recipe's step less the rest).
CPU_DECODE_SECONDS = (0.00156, 0.000644)
CPU_RL_STEP_SECONDS = 0.0085
# What a sharded strategy costs a CPU step beyond its collectives' own time (GLOO), per byte they move: its processes
# meet at every layer's collective (DDP's meet about once a step), so each waits out the other's slower stretches
# there, and the strategy allocates and copies its flat buffers (DeepSpeed's gradient partitions, the gathered
# parameters). Measured by benchmarks/plan.py (`sharded_calibration`: on a model of another size than the grid's,
# the strategy's step less DDP's, less their planned difference).
CPU_SHARDED_SECONDS_PER_BYTE = {"fsdp": 1.21e-9, "zero2": 1.28e-9, "zero3": 2.67e-9}
# A text row read from the tokenized set and collated into its batch (padded, its labels made, its tokens counted),
# in the training process: measured by benchmarks/plan.py (`row_calibration`: the shipped recipes' collators over
# their own rows, the median per row).
CPU_ROW_SECONDS = 8.4e-5
# An image row is decoded and transformed by the model's processor as its batch is drawn (models/families/vision.py):
# (seconds a row, seconds per value of its pixel_values), measured by benchmarks/plan.py (`image_calibration`: the
# builtin digits stored as PNG, through ViT's processor at two sizes, on one thread).
CPU_IMAGE_SECONDS = (2.1e-4, 7.38e-9)


@dataclass(frozen=True)
class TimePlan:
    """Seconds a step, the training (the Trainer's start, then its steps: what metrics.json's train_seconds counts)
    and the evaluation take; None where no rate is known."""
    step_seconds: float | None
    train_seconds: float | None
    eval_seconds: float | None
    flops_per_step: float
    rate: float | None
    items: dict = field(default_factory=dict)
    start_seconds: float = 0.0  # the training's once-a-run work before its steady steps (CPU_START_SECONDS)

    def as_dict(self) -> dict:
        return asdict(self)


def logit_positions(shape: dict, recipe, lengths: dict) -> tuple[int, int]:
    """(positions a row projects onto the vocabulary with gradients, positions projected without) for a task scored
    by a language-model head; (0, 0) otherwise. A causal LM's next-token loss makes logits only where a label is
    predicted (training/loss.py: a prompted example's answer, all of a text but its last token); TRL's preference
    trainers project every position of each sequence, the reference's without gradients; an encoder's masked LM and a
    seq2seq decoder make their own loss at every position (of the text, of the target)."""
    if tasks.spec(recipe.task).scoring not in LANGUAGE_MODEL_SCORING or shape["image_tokens"]:
        return 0, 0
    if shape["seq2seq"]:
        return lengths.get("max_target_length") or lengths["max_length"], 0
    trained, scored, tokens = decoder_sequences(recipe, lengths)
    if is_preference(recipe):
        return trained * tokens, scored * tokens
    if recipe.rl is not None:  # (TRL projects the answer's positions only)
        return recipe.rl.max_completion_length, scored * recipe.rl.max_completion_length
    if recipe.task in tasks.prompted():
        return lengths.get("max_target_length") or 0, 0
    return tokens, 0


def _flops_per_token(shape: dict, lora: bool, tokens: int, through: float = 1.0) -> float:
    """Training FLOPs per token (hftoolkit.training.throughput's convention): 6N, or 4N under LoRA plus 6A for the
    adapters' own A parameters (forward, input and weight gradients: negligible at a small rank on a wide model,
    more than the frozen products at a rank near the width), plus attention. N leaves out a language-model head (its
    positions are counted by `logit_positions`); `through`: the share of N a token passes through (a seq2seq model's
    token passes through one of its two stacks)."""
    attention = 4 * shape["layers"] * tokens * shape["hidden"] * (2 if lora else 3)
    adapters = 6 * shape.get("adapter", 0) if lora else 0
    return ((4 if lora else 6) * (shape["non_embedding"] - shape.get("head", 0)) + adapters) * through + attention


def _stack_share(shape: dict, lengths: dict) -> float:
    """The mean share of a seq2seq model's parameters its source and target tokens pass through: an encoder layer
    holds four width-square products and the feed-forward's, a decoder layer four more for its cross-attention."""
    if not shape["seq2seq"]:
        return 1.0
    h, i = shape["hidden"], shape["intermediate"]
    encoder = shape["encoder_layers"] * (4 * h * h + 2 * h * i)
    decoder = shape["decoder_layers"] * (8 * h * h + 2 * h * i)
    source = lengths["max_length"]
    target = lengths.get("max_target_length") or source
    return (source * encoder + target * decoder) / max(1, (source + target) * (encoder + decoder))


def _rate(shape: dict, device: Device | None, precision: str, tokens: int, processes_per_machine: int) -> float | None:
    """FLOP/s one process reaches: a GPU's peak times its utilisation; on a CPU this machine's matmul rate at the
    run's sizes, measured on one thread when several processes share the machine (torchrun gives each one thread)."""
    if device is None:
        return None
    if device.kind == "cuda":
        peak = device.peak_flops.get(precision)
        return peak * device.utilisation if peak else None
    from hftoolkit.training.throughput import matmul_flops_per_second

    # (measured at a batch's tokens up to a few thousand: the rate levels off there, and a huge planned batch must
    # not be allocated to find out)
    sizes = (precision, min(tokens, 4096), shape["hidden"], shape["intermediate"])
    one_thread = matmul_flops_per_second(*sizes, threads=1)
    if processes_per_machine > 1:
        return one_thread
    # A process's threads are never planned slower than one of them: where another process holds a core, each
    # product waits for the thread it preempted, and a small product's reading can fall a hundredfold; that is the
    # machine's load at the moment of the reading, which the cache would keep for the boot, not its speed.
    return max(matmul_flops_per_second(*sizes), one_thread)


def _steps(recipe, train_rows: int | None) -> int | None:
    training = recipe.training
    if training.max_steps or train_rows is None:
        return training.max_steps
    return math.ceil(train_rows / (training.batch_size * training.gradient_accumulation)) * training.epochs


def plan_time(shape: dict, recipe, spread: Spread, device: Device | None, precision: str, lengths: dict,
              train_rows: int | None, eval_rows: int | None) -> TimePlan:
    """Seconds per optimizer step, itemized (the layers' products, the vocabulary projection, the optimizer, the
    processes' communication, the per-step work of Python and the Trainer), for the training and for one evaluation
    (loss pass plus generation)."""
    lora = recipe.lora.enabled
    source = shape["image_tokens"] or lengths["max_length"]
    tokens = source + (lengths.get("max_target_length") or source if shape["seq2seq"] else 0)
    rows = recipe.training.batch_size * recipe.training.gradient_accumulation
    trained, scored = 1, 0
    if not shape["seq2seq"] and not shape["image_tokens"]:
        trained, scored, tokens = decoder_sequences(recipe, lengths)
        source = tokens
    share = _stack_share(shape, lengths)
    # (with checkpointing the forward runs twice: 2 of 6, or of 4)
    flops = trained * rows * tokens * _flops_per_token(shape, lora, tokens, share)
    flops *= (1 + 2 / (4 if lora else 6)) if recipe.training.gradient_checkpointing else 1
    flops += scored * rows * tokens * (2 * (shape["non_embedding"] - shape.get("head", 0))
                                       + 4 * shape["layers"] * tokens * shape["hidden"])
    # The head's product: forward and the input's gradient, and the weight's where the head (or its tied
    # embeddings) trains; the reference's positions forward only.
    projected, referenced = logit_positions(shape, recipe, lengths)
    width = 2 * shape["hidden"] * shape["vocab"]
    vocabulary = rows * width * (projected * (3 if shape.get("head_trained") else 2) + referenced)
    rate = _rate(shape, device, precision, max(1, trained * rows // spread.processes) * source,
                 spread.processes_per_machine)
    if rate is None:
        return TimePlan(None, None, None, flops + vocabulary, None)
    items = {"products": flops / spread.processes / rate, "vocabulary": vocabulary / spread.processes / rate}
    if recipe.rl is not None:  # (at the products' rate: a lower bound where one token at a time is memory-bound)
        items["generation"] = generation_flops(shape, recipe, lengths) / spread.processes / rate
    if device.kind == "cpu":
        items.update(_cpu_items(shape, recipe, spread, precision, lengths, scored / trained))
    step = sum(items.values())
    steps = _steps(recipe, train_rows)
    start = CPU_START_SECONDS * cpu_pace() if device.kind == "cpu" else 0.0
    return TimePlan(step, None if steps is None else start + steps * step,
                    _eval_seconds(shape, recipe, spread, lengths, eval_rows, rate), flops + vocabulary, rate,
                    items, start)


def _cpu_items(shape: dict, recipe, spread: Spread, precision: str, lengths: dict, scored_share: float) -> dict:
    """A CPU step's seconds besides its products: the element-wise work (norms, activations, softmax, dropout,
    dtype casts and their gradients: memory-bound, so in proportion to the activations they write, whose forward
    share checkpointing's second forward pass and the sequences only scored, as a reference model's, do again), the
    optimizer over the trainable parameters a process updates, the collectives of the strategy over gloo and what a
    sharded strategy costs beyond them (`CPU_SHARDED_SECONDS_PER_BYTE`), the reading and collating of text rows or
    the decoding of image rows, the fixed work of sampling an RL step's answers token by token, and the step's fixed
    work, its own and each layer's (the Trainer's callbacks and logging, the modules called, autograd's bookkeeping;
    TRL's scoring of sampled answers). `scored_share`: the sequences only scored, per sequence trained."""
    batch = max(1, math.ceil(recipe.training.batch_size / spread.processes))
    written = sum(activation_bytes(shape, recipe, batch, precision, lengths, False, False))
    passes = 1 + FORWARD_WORK * (scored_share + recipe.training.gradient_checkpointing)
    written *= recipe.training.gradient_accumulation * passes
    sharded = spread.shards_optimizer and spread.processes > 1
    updated = shape["trainable"] / (spread.processes if sharded else 1)
    pace = cpu_pace()
    optimizer = CPU_OPTIMIZER_SECONDS.get(recipe.training.optimizer, CPU_OPTIMIZER_SECONDS["adamw"])
    items = {"element-wise": written * CPU_ACTIVATION_SECONDS * pace, "optimizer": updated * optimizer * pace,
             "communication": _communication_seconds(shape, recipe, spread), "overhead": cpu_step_seconds(shape) * pace}
    if spread.name in CPU_SHARDED_SECONDS_PER_BYTE and spread.processes > 1:
        items["sharding"] = sharded_bytes(shape, recipe, spread) * CPU_SHARDED_SECONDS_PER_BYTE[spread.name] * pace
    rows = batch * recipe.training.gradient_accumulation
    if shape.get("image_values"):  # (drawn in the training process, or in data.num_workers that share its cores)
        per_row = CPU_IMAGE_SECONDS[0] + CPU_IMAGE_SECONDS[1] * shape["image_values"]
        items["images"] = rows * per_row * pace
    else:
        items["rows"] = rows * CPU_ROW_SECONDS * pace
    if recipe.rl is not None:  # (answers are sampled once per rl.num_iterations steps)
        per_token = CPU_DECODE_SECONDS[0] + CPU_DECODE_SECONDS[1] * shape["layers"]
        items["sampling"] = recipe.rl.max_completion_length / recipe.rl.num_iterations * per_token * pace
        items["overhead"] += CPU_RL_STEP_SECONDS * pace
    return items


def cpu_step_seconds(shape: dict) -> float:
    """A CPU step's fixed work at the reference pace: the step's own, and each layer's."""
    fixed, per_layer = CPU_STEP_SECONDS
    return fixed + per_layer * shape["layers"]


def cpu_pace() -> float:
    """How much slower this CPU does element-wise work than the one the CPU constants were measured on."""
    from hftoolkit.training.throughput import elementwise_seconds_per_byte

    return elementwise_seconds_per_byte() / CPU_REFERENCE_PACE


def _communication_seconds(shape: dict, recipe, spread: Spread) -> float:
    """Seconds a step spends in gloo's collectives, one after the other with the products (on a CPU they share its
    cores). Each collective costs its latency and its full tensor's bytes over the measured rate. DDP all-reduces the
    gradients in buckets; FSDP gathers every wrapped layer's parameters in the forward pass and again in the
    backward, and reduce-scatters their gradients (FSDP2 copying each in and out); ZeRO-2 reduce-scatters the
    gradients and gathers the updated parameters; ZeRO-3 gathers and reduces as FSDP does."""
    n = spread.processes
    if n < 2:
        return 0.0
    grads = 4 * shape["trainable"]  # (fp32 gradients: the Trainer's autocast keeps fp32 parameters)
    weights, _ = _weight_bytes(shape, recipe)

    def cost(op: str, count: int, total: float) -> float:
        latency, rate = GLOO[op]
        return count * latency + total / rate

    if spread.name == "ddp":
        return cost("all_reduce", max(1, math.ceil(grads / DDP_BUCKET_BYTES)), grads)
    units = shape["layers"] + 1  # each transformer block wrapped, and the root with the rest
    if spread.shards_parameters:
        copies = FSDP2_COPIES * weights / CPU_COPY_BYTES_PER_SECOND if spread.runtime == "torch" else 0.0
        return cost("all_gather", 2 * units, 2 * weights) + cost("reduce_scatter", units, grads) + copies
    return cost("reduce_scatter", units, grads) + cost("all_gather", units, grads)


def sharded_bytes(shape: dict, recipe, spread: Spread) -> float:
    """Bytes a sharded strategy's collectives move a step (as `_communication_seconds` counts them): FSDP and ZeRO-3
    gather the weights in the forward and the backward pass and reduce-scatter the gradients; ZeRO-2 reduce-scatters
    the gradients and gathers them back updated."""
    grads = 4 * shape["trainable"]
    if spread.shards_parameters:
        return 2 * _weight_bytes(shape, recipe)[0] + grads
    return 2 * grads


def _eval_seconds(shape: dict, recipe, spread: Spread, lengths: dict, eval_rows: int | None,
                  rate: float) -> float | None:
    """A forward pass (2N per token) over the eval rows, and for generative tasks 2N per generated token."""
    if eval_rows is None:
        return None
    source = shape["image_tokens"] or lengths["max_length"]
    tokens = source + (lengths.get("max_target_length") or source if shape["seq2seq"] else 0)
    sequences = 1
    if recipe.task == tasks.REWARD:  # a pair: two sequences of prompt and answer
        sequences, _, tokens = decoder_sequences(recipe, lengths)
    forward = 2 * shape["non_embedding"] + 4 * shape["layers"] * tokens * shape["hidden"]
    flops = sequences * eval_rows * tokens * forward
    if tasks.spec(recipe.task).scoring == "generation" or (recipe.task == tasks.CLM and recipe.eval.max_predictions):
        predicted = eval_rows if recipe.task != tasks.CLM else min(eval_rows, recipe.eval.max_predictions)
        flops += predicted * lengths.get("max_new_tokens", 0) * 2 * shape["non_embedding"]
    return flops / spread.processes / rate
