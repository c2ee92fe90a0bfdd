"""The memory a run will take, per process, before any weight is loaded (`hftoolkit plan`), and the model's shape
both plans read.

Everything here is arithmetic on a model's shape (read from a model built on the meta device) and the recipe, so a
plan costs no memory and can be made for a GPU this machine does not have. `plan_memory` adds up the items a
process holds (what each counts, and why: docs/architecture.md, "The memory and time plan"); planning/timing.py
plans the time.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from hftoolkit.config import tasks
from hftoolkit.job.devices import Device
from hftoolkit.planning.generation import generation_cache_bytes
from hftoolkit.planning.items import WEIGHT_BYTES
from hftoolkit.planning.items import loading_bytes as _loading_bytes
from hftoolkit.planning.items import lora_saved as _lora_saved
from hftoolkit.planning.items import model_states as _states
from hftoolkit.planning.items import stack_bytes as _stack
from hftoolkit.planning.items import weight_bytes as _weight_bytes
from hftoolkit.training.strategies.base import Spread

# What a CPU process of a run holds besides its model: measured by benchmarks/plan.py (`calibration_run`: the
# VmHWM of a short run of a model of a fraction of a MiB, less its planned states; the imports alone are less).
# A quantized model's process also imports bitsandbytes, which brings in torch's compiler stack. A preference run
# is TRL's trainer: in fp32 it holds what the torch stack holds; under bf16 autocast on a CPU its pairs, of many
# lengths, make oneDNN compile and keep kernels for each batch length it meets: "trl-bf16" and TRL_BF16_PER_LENGTH
# are measured by benchmarks/plan.py (`trl_calibration`: the preference recipe after two step counts).
CPU_RUNTIME_BYTES = {"torch": 597 * 2**20, "deepspeed": 643 * 2**20, "bitsandbytes": 631 * 2**20,
                     "trl-bf16": 641 * 2**20}
TRL_BF16_PER_LENGTH = 7.55 * 2**20
# The fraction of what a step allocates and frees that glibc's heap keeps resident (docs/architecture.md): measured by
# benchmarks/plan.py (`heap_calibration`: runs trained with the default and with a fixed mmap threshold).
CPU_HEAP_RETAINED = 0.55
# ZeRO-3's defaults (DeepSpeed's, which accelerate and the Trainer keep) for stage3_max_reuse_distance and
# stage3_max_live_parameters, and how many copies of the parameters it then keeps gathered: measured by
# benchmarks/plan.py (`zero3_calibration`: the defaults against both limits set to 0).
ZERO3_LIVE_PARAMETERS, ZERO3_KEPT_COPIES = 1e9, 1.82
# The CUDA context and cuBLAS workspace: not measured here (no GPU); the context is commonly a few hundred MiB and
# cuBLAS reserves a workspace per stream. DeepSpeed adds its own kernels' context. An estimate, stated as such.
CUDA_RUNTIME_BYTES = {"torch": 512 * 2**20 + 32 * 2**20, "deepspeed": 640 * 2**20 + 32 * 2**20}

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# FSDP2 copies each gathered buffer out, twice a step, and each gradient in: six copies of the full weights a step
# (the memory plan's heap holds them; the time plan copies them at one thread's rate).
FSDP2_COPIES = 6


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per process, itemized; the items add up to the peak."""
    items: dict
    peak: int
    fits: bool | None
    available: int | None

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------------ the model's shape

def _config_value(config, *names, default=0):
    return next((getattr(config, n) for n in names if getattr(config, n, None)), default)


# Feed-forward-wide tensors autograd keeps per activation: a fused one keeps its input (its output is the next
# product's input); python-written tanh GELUs keep the tanh, its sum and the halved input besides; a gated MLP also
# keeps the up projection and the product. T5 drops out between the activation and the output product.
ACTIVATION_KEEPS = {"gelu": 2, "gelu_pytorch_tanh": 2, "relu": 1, "silu": 2, "swish": 2, "gelu_new": 5,
                    "gelu_fast": 5, "quick_gelu": 3}
GATED_MLP = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "granite"}
T5_TYPES = {"t5", "mt5", "umt5", "longt5"}
RMS_NORM = GATED_MLP | T5_TYPES


def _dims(config) -> dict:
    """Widths and depths from a config, under the names the families use."""
    hidden = _config_value(config, "hidden_size", "n_embd", "d_model")
    encoder = _config_value(config, "encoder_layers", "num_layers", "num_hidden_layers", "n_layer")
    decoder = _config_value(config, "decoder_layers", "num_decoder_layers")
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    heads = _config_value(config, "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
    image, patch = _config_value(config, "image_size"), _config_value(config, "patch_size")
    dropout = _config_value(config, "attention_probs_dropout_prob", "attn_pdrop", "attention_dropout",
                            "dropout_rate", "dropout", default=0.0)
    # The attention probabilities' own dropout, where the config names one (BART's attention_dropout is 0 while its
    # hidden dropout is not); T5 drops its attention weights at its dropout_rate.
    attention = next((getattr(config, n) for n in ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout",
                                                   "dropout_rate") if getattr(config, n, None) is not None), dropout)
    kind = getattr(config, "model_type", "")
    act = str(_config_value(config, "dense_act_fn", "hidden_act", "activation_function", default="gelu"))
    gated = bool(getattr(config, "is_gated_act", False)) or kind in GATED_MLP
    return {
        "layers": encoder + (decoder or encoder if seq2seq else 0),
        "encoder_layers": encoder if seq2seq else 0, "decoder_layers": (decoder or encoder) if seq2seq else 0,
        "hidden": hidden, "heads": heads,
        "intermediate": _config_value(config, "intermediate_size", "n_inner", "d_ff", "encoder_ffn_dim",
                                      default=4 * hidden),
        "kv_heads": _config_value(config, "num_key_value_heads", default=heads),
        "vocab": _config_value(config, "vocab_size"), "seq2seq": seq2seq,
        "image_tokens": (image // patch) ** 2 + 1 if image and patch else 0,
        "image_values": _config_value(config, "num_channels", default=3) * image * image if image else 0,
        "dropout": float(dropout) > 0, "attention_dropout": float(attention) > 0,
        "norm": "rms" if kind in RMS_NORM else "layer",
        "wide_tensors": ACTIVATION_KEEPS.get(act, 2) + 2 * gated + (kind in T5_TYPES and float(dropout) > 0),
        "ffn_dropout": kind in T5_TYPES and float(dropout) > 0,
        "eager_attention": getattr(config, "_attn_implementation", "eager") in (None, "eager"),
        "dtype_bytes": WEIGHT_BYTES.get(str(getattr(config, "dtype", None) or "").removeprefix("torch."), 4),
    }


def model_shape(model) -> dict:
    """Parameter counts and dimensions of a model on the meta device, plain or wrapped by peft (not quantized)."""
    import torch

    head = _head_names(model)
    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    seen, counts = _tied_head(model), dict.fromkeys(("parameters", "embedding", "trainable", "adapter", "quantizable",
                                                    "quantizable_rows", "adafactor_state", "largest_layer"), 0)
    for name, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        counts["largest_layer"] = max(counts["largest_layer"], sum(p.numel() for _, p in own))
        for n, p in own:
            seen.add(id(p))
            full = f"{name}.{n}" if name else n
            counts["parameters"] += p.numel()
            counts["embedding"] += p.numel() if id(p) in embedding else 0
            counts["adapter"] += p.numel() if "lora_" in full else 0
            if p.requires_grad:
                counts["trainable"] += p.numel()
                counts["adafactor_state"] += sum(p.shape[-2:]) if p.dim() >= 2 else p.numel()
        conv1d = type(module).__name__ == "Conv1D"  # GPT-2's transposed Linear: bitsandbytes replaces it too
        if ((isinstance(module, torch.nn.Linear) or conv1d) and "lora_" not in name
                and not any(part in head for part in name.split("."))):
            counts["quantizable"] += module.weight.numel()
            counts["quantizable_rows"] += module.weight.shape[1 if conv1d else 0]
    base, dims = counts["parameters"] - counts["adapter"], _dims(model.config)
    return {**counts, "base": base, "non_embedding": base - counts["embedding"],
            "block": _block_parameters(model), **dims, "lora_saved": _lora_saved(model, dims),
            **_head(model, embedding)}


def _head(model, embedding: set) -> dict:
    """The language-model head: its parameters where they count among the non-embedding ones (an untied head), and
    whether its weight trains (full fine-tuning, tied or not)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    out = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    weight = getattr(out, "weight", None)
    if weight is None:
        return {"head": 0, "head_trained": False}
    untied = id(weight) not in embedding and not _tied_head(model)
    return {"head": weight.numel() if untied else 0, "head_trained": bool(weight.requires_grad)}


def _tied_head(model) -> set:
    """The LM head's weight where the config ties it to the input embeddings: built from a config alone on the meta
    device it may be a second tensor (from_pretrained ties it); in training it is one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    out = inner.get_output_embeddings() if getattr(inner.config, "tie_word_embeddings", False) else None
    into = inner.get_input_embeddings() if out is not None else None
    tied = into is not None and out.weight is not into.weight and out.weight.shape == into.weight.shape
    return {id(out.weight)} if tied else set()


def _head_names(model) -> set:
    """Module names bitsandbytes leaves unquantized: the output embeddings, the task head (the model's last child,
    as transformers' get_keys_to_not_convert picks it) and peft's modules_to_save."""
    names = {"modules_to_save", "original_module"}
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    out = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    for name, module in inner.named_modules():
        if out is not None and module is out:
            names.add(name.split(".")[-1])
    children = list(inner.named_children())
    if children:
        names.add(children[-1][0])
    return names


def _block_parameters(model) -> int:
    """Parameters of the largest repeated block (a transformer layer): what FSDP and ZeRO-3 gather at once."""
    import torch

    largest = 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            largest = max(largest, max(sum(p.numel() for p in m.parameters()) for m in module))
    return largest


# ------------------------------------------------------------------------------------------------------- memory

def activation_bytes(shape: dict, recipe, batch: int, precision: str, lengths: dict, cuda: bool,
                 checkpointing: bool | None = None) -> tuple[float, float]:
    """(activations, logits and loss buffers) of one forward and backward over a process's micro-batch; with the
    recipe's gradient checkpointing unless `checkpointing` says otherwise."""
    e = PRECISION_BYTES[precision]
    checkpointing = recipe.training.gradient_checkpointing if checkpointing is None else checkpointing
    # (kept where attention is eager, or where its dropout makes a CPU's attention fall back to the plain products)
    matrix = shape["eager_attention"] or (shape.get("attention_dropout", shape["dropout"]) and not cuda)
    source = shape["image_tokens"] or lengths["max_length"]
    # (frozen products' effect per stack, per token: elements at e bytes, dropout masks at 1 byte on a GPU, where
    # dropout keeps a boolean mask, and at e on a CPU, where it multiplies by a mask of the input's dtype)
    frozen = [e * n + (1 if cuda else e) * masks for n, masks in shape.get("lora_saved") or [(0.0, 0.0)]]
    if shape["seq2seq"]:
        target = lengths.get("max_target_length") or source
        acts = (_stack(shape, batch, source, shape["encoder_layers"], e, checkpointing, 0, matrix, frozen[0])
                + _stack(shape, batch, target, shape["decoder_layers"], e, checkpointing, source, matrix, frozen[-1]))
        out_tokens = target
    else:
        trained, scored, tokens = decoder_sequences(recipe, lengths)
        batch, source = batch * trained, source if shape["image_tokens"] else tokens
        acts = _stack(shape, batch, source, shape["layers"], e, checkpointing, 0, matrix, frozen[-1])
        out_tokens = source
    acts += 2 * e * batch * source * shape["hidden"]  # the embeddings' output and the final norm's input
    vocab = shape["vocab"] if tasks.spec(recipe.task).scoring in LANGUAGE_MODEL_SCORING else 0
    # The logits, the loss's fp32 copy (the same tensor in fp32), its log-softmax and the logits' gradient; a
    # preference step's reference pass adds its fp32 log-probabilities while the policy's activations are held.
    copies = 4 * 3 + (e if e != 4 else 0) + (4 if is_preference(recipe) and scored else 0)
    return acts, batch * out_tokens * vocab * copies


# The scorings whose loss projects onto the vocabulary.
LANGUAGE_MODEL_SCORING = ("loss", "generation", "preference", "rl")


def is_preference(recipe) -> bool:
    return tasks.spec(recipe.task).scoring == "preference"


def decoder_sequences(recipe, lengths: dict) -> tuple[int, int, int]:
    """(sequences per example trained with gradients, scored without, tokens per sequence) of a one-stack model. A
    prompted task's example is its prompt and its answer, one sequence; a preference pair two, each scored by the
    reference too (orpo has none); a kto answer one, scored by the reference, with its mismatched KL answer scored
    by both models; a reward pair two, through the score head alone (no reference); a grpo example is one sampled
    answer, scored by the reference where rl.beta > 0 and by the policy that sampled it where it is learned from
    more than once (rl.num_iterations)."""
    if recipe.rl is not None:  # a sampled answer after its prompt, scored again by the reference and the old policy
        rl = recipe.rl
        return 1, int(rl.beta > 0) + int(rl.num_iterations > 1), lengths["max_length"] + rl.max_completion_length
    answered = recipe.task in tasks.prompted() or recipe.task in tasks.paired()
    tokens = lengths["max_length"] + ((lengths.get("max_target_length") or 0) if answered else 0)
    if recipe.task == tasks.REWARD:
        return 2, 0, tokens
    if not is_preference(recipe):
        return 1, 0, tokens
    p = recipe.preference
    return (1, 3, tokens) if p.unpaired else (2, 0 if p.method == "orpo" else 2, tokens)


def plan_memory(shape: dict, recipe, spread: Spread, device: Device | None, precision: str,
                lengths: dict) -> MemoryPlan:
    """Peak bytes per process of a training step (or of loading, on a CPU, when that is larger)."""
    cuda = device is None or device.kind == "cuda"
    runtime = (CUDA_RUNTIME_BYTES if cuda else CPU_RUNTIME_BYTES)[_runtime(recipe, spread, cuda, precision)]
    if _runtime(recipe, spread, cuda, precision) == "trl-bf16":  # a length per step at most, up to the longest pair
        bound = lengths["max_length"] + (lengths.get("max_target_length") or 0)
        runtime += TRL_BF16_PER_LENGTH * min(bound, recipe.training.max_steps or bound)
    states = _states(shape, recipe, spread, precision)
    batch = max(1, math.ceil(recipe.training.batch_size / spread.processes))
    activations, logits = activation_bytes(shape, recipe, batch, precision, lengths, cuda)
    # torch's for-each AdamW (optimizer adamw) makes a temporary the size of its second moments in the step, when
    # the backward pass's activations are gone: whichever of the two is larger counts.
    step = states["optimizer"] / 2 if recipe.training.optimizer == "adamw" else 0.0
    buffers = logits + max(0.0, step - activations - logits) + _strategy_buffers(shape, recipe, spread, states)
    shared = min(states["gradients"], activations + logits) if spread.runtime == "torch" else 0.0
    items = {"runtime": runtime, **states, "activations": activations, "buffers": buffers, "gradients freed": -shared}
    if recipe.rl is not None:  # (held while answers are sampled, freed before the step's forward pass)
        items["generation cache"] = max(0.0, generation_cache_bytes(shape, recipe, spread, precision, lengths)
                                        - activations - logits)
    if not cuda:
        # (with checkpointing the backward pass allocates every layer's activations again, as many as without it;
        # sharded parameters are gathered in the forward and the backward pass and their gradients reduced from
        # full ones: FSDP2 copies each gathered buffer out and each gradient in (6 copies), ZeRO-3 does not (3).
        # FSDP2 frees each layer's gathered parameters after use, the backward pass activations as it gathers: the
        # same freed blocks serve both, the larger counts; ZeRO-3 keeps its gathered ones (the two add up).)
        allocated = activation_bytes(shape, recipe, batch, precision, lengths, cuda, False)[0]
        if spread.shards_parameters and spread.processes > 1:
            gathered = (FSDP2_COPIES if spread.runtime == "torch" else 3) * states["weights"] * spread.processes
            allocated = max(allocated, gathered) if spread.runtime == "torch" else allocated + gathered
        items["heap"] = 0.0 if os.environ.get("MALLOC_MMAP_THRESHOLD_") else CPU_HEAP_RETAINED * allocated
        items["loading"] = max(0.0, _loading_bytes(shape, recipe, spread) - sum(items.values()) + runtime)
    items = {k: int(round(v)) for k, v in items.items()}
    peak = sum(items.values())
    available = None
    if device is not None:
        available = device.memory if cuda else device.memory // max(1, spread.processes_per_machine)
    return MemoryPlan(items, peak, None if available is None else peak <= available, available)


def _runtime(recipe, spread: Spread, cuda: bool, precision: str) -> str:
    """Which measured runtime a process holds: DeepSpeed's, bitsandbytes' for a quantized model on a CPU, TRL's
    under bf16 autocast on a CPU, else the torch stack's."""
    if cuda or spread.runtime != "torch":
        return spread.runtime
    if recipe.model.quantization != "none":
        return "bitsandbytes"
    return "trl-bf16" if is_preference(recipe) and precision != "fp32" else "torch"


def _strategy_buffers(shape: dict, recipe, spread: Spread, states: dict) -> float:
    """DDP's gradient buckets (a full copy of the gradients); FSDP's and ZeRO-3's gathered layer (its parameters,
    and their gradients before the reduce-scatter). ZeRO-3 besides does not release a gathered parameter whose next
    use lies within stage3_max_reuse_distance, up to stage3_max_live_parameters: from the second step on the model
    (up to that many parameters) stays gathered on every process, ZERO3_KEPT_COPIES times."""
    if spread.name == "ddp" and spread.processes > 1:
        return states["gradients"]
    if spread.shards_parameters and spread.processes > 1:
        weights, _ = _weight_bytes({**shape, "base": shape["block"], "quantizable": 0, "quantizable_rows": 0}, recipe)
        kept = 0.0
        if spread.runtime == "deepspeed":
            full = states["weights"] * spread.processes
            kept = ZERO3_KEPT_COPIES * full * min(1.0, ZERO3_LIVE_PARAMETERS / max(1, shape["base"]))
        return 2 * weights + kept
    return 0.0
