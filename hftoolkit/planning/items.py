"""The bytes of single items of a memory plan (planning/model.py): the base weights as held, quantized
or not, the model states as a strategy spreads them, the optimizer's states, a layer's activations and the resident
set of loading; apart, so that model.py stays readable."""

from __future__ import annotations

WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def weight_bytes(shape: dict, recipe) -> tuple[float, float]:
    """(bytes of the base weights as held, bytes per base parameter as stored in the checkpoint file)."""
    dtype = recipe.model.dtype
    unquantized = WEIGHT_BYTES.get(dtype, shape["dtype_bytes"])
    quant = recipe.model.quantization
    if quant == "none":
        return shape["base"] * unquantized, unquantized
    q, rest = shape["quantizable"], shape["base"] - shape["quantizable"]
    if quant == "8bit":  # LLM.int8: one int8 per weight and one fp32 scale per output row
        packed = q + 4 * shape["quantizable_rows"]
    else:  # nf4: half a byte per weight, an absmax per block of 64 (fp32, or 8-bit plus an fp32 per 256 blocks)
        scales = q / 64 + 4 * q / (64 * 256) if recipe.model.double_quant else 4 * q / 64
        packed = q / 2 + scales
    # peft's prepare_model_for_kbit_training casts every parameter left unquantized to fp32
    return packed + rest * 4, shape["dtype_bytes"]


def optimizer_bytes(shape: dict, optimizer: str) -> float:
    trainable = shape["trainable"]
    if optimizer in ("adamw_fused", "adamw"):
        return 8 * trainable
    if optimizer in ("adamw_8bit", "paged_adamw_8bit"):  # two uint8 moments, an fp32 absmax per 256 of each
        return 2 * trainable + 2 * 4 * trainable / 256
    if optimizer == "adafactor":
        return 4 * shape["adafactor_state"]
    return 0.0  # the Trainer's sgd: torch.optim.SGD without momentum keeps no state


def loading_bytes(shape: dict, recipe, spread) -> float:
    """The resident set while a CPU process loads its model, above the runtime. Parameters in the checkpoint's
    dtype stay backed by the mapped file (counted once, as weights); a conversion touches the whole file besides
    the converted weights. Whichever process reads the checkpoint under FSDP (the main one) holds the full weights
    while its shard is cut; ZeRO flattens the parameters into one buffer, a second copy for a moment."""
    held, stored = weight_bytes(shape, recipe)
    file_bytes = shape["base"] * stored
    total = held + (file_bytes if (recipe.model.quantization != "none" or held != file_bytes) else 0)
    if spread.shards_parameters and spread.runtime == "torch":
        total += held / spread.processes
    elif spread.runtime == "deepspeed":
        total += held
    return total


# Output projections by name (the feed-forward's own is told by its input width instead).
ATTENTION_OUT = {"o", "o_proj", "out_proj", "c_proj", "dense", "out_lin"}


def lora_saved(model, dims: dict) -> list[tuple[float, float]]:
    """Per stack of layers (an encoder's, a decoder's), per layer and per token: (elements, dropout-mask elements)
    that autograd saves beyond what full fine-tuning saves, where some products are frozen. A frozen product saves
    no input (the input's gradient needs only the weight), so an input no trained product and no undropped adapter
    reads is not kept, nor (under a python RMSNorm) the normalized input its frozen weight multiplies. LoRA's
    dropout, when set, makes each adapted product's input anew: the dropped copy and its mask are kept for the
    adapter, besides its rank-wide output. Zero for every stack under full fine-tuning."""
    import torch

    stacks, found = [], []
    for name, module in model.named_modules():
        nested = any(name.startswith(f"{outer}.") for outer in found)
        depth = len(module) if isinstance(module, torch.nn.ModuleList) else 0
        if depth > 1 and not nested and depth in (dims["layers"], dims["encoder_layers"], dims["decoder_layers"]):
            found.append(name)
            saved = [_block_saved(block, dims) for block in module]
            stacks.append((sum(e for e, _ in saved) / len(saved), sum(m for _, m in saved) / len(saved)))
    return stacks


def _block_saved(block, dims: dict) -> tuple[float, float]:
    """lora_saved of one layer: (elements, dropout-mask elements)."""
    import torch

    groups, extra, masks = {}, 0.0, 0.0
    for name, module in block.named_modules():
        base = getattr(module, "base_layer", module)
        linear = isinstance(base, torch.nn.Linear) or type(base).__name__ in ("Conv1D", "Linear4bit", "Linear8bitLt")
        if not linear or "lora_" in name or ".base_layer" in name or name.endswith("base_layer"):
            own = list(module.parameters(recurse=False))
            if dims["norm"] == "rms" and "norm" in type(module).__name__.lower() and own and not any(
                    p.requires_grad for p in own):
                extra -= dims["hidden"]
            continue
        fan_in = base.weight.shape[0] if type(base).__name__ == "Conv1D" else base.in_features
        parent, _, leaf = name.rpartition(".")
        role = ("ffn_out" if fan_in == dims["intermediate"] else "attention_out" if leaf in ATTENTION_OUT else "in")
        keeps = any(p.requires_grad for p in base.parameters(recurse=False))
        for adapter, dropout in _adapters(module):
            extra += adapter + (fan_in if dropout > 0 else 0)
            masks += fan_in if dropout > 0 else 0
            keeps = keeps or dropout == 0
        group = groups.setdefault((parent, role), [fan_in, False])
        group[1] = group[1] or keeps
    relu_keeps = dims["wide_tensors"] == 1  # a bare ReLU keeps its output, the output product's input
    unkept = sum(fan_in for (_, role), (fan_in, kept) in groups.items()
                 if not kept and not (role == "ffn_out" and relu_keeps))
    return extra - unkept, masks


def _adapters(module) -> list[tuple[int, float]]:
    """(rank, dropout probability) of each LoRA adapter on a product."""
    ranks = getattr(module, "r", None)
    if not isinstance(ranks, dict) or not hasattr(module, "lora_dropout"):
        return []
    return [(r, getattr(module.lora_dropout[k], "p", 0.0)) for k, r in ranks.items()]


def model_states(shape: dict, recipe, spread, precision: str) -> dict:
    """Weights, adapter, gradients, optimizer and master weights per process, divided where the strategy shards."""
    weights, _ = weight_bytes(shape, recipe)
    deepspeed = spread.runtime == "deepspeed"
    half = recipe.model.dtype in ("bfloat16", "float16") or (deepspeed and precision != "fp32")
    if deepspeed and precision != "fp32" and recipe.model.quantization == "none":
        weights = shape["base"] * 2  # DeepSpeed casts the module to the training precision
    lora = recipe.lora.enabled
    trainable_base = shape["trainable"] - (shape["adapter"] if lora else 0)
    grad_bytes = 2 if half else 4
    gradients = shape["adapter"] * 4 * lora + trainable_base * grad_bytes
    master = 0.0
    if deepspeed:  # an fp32 partition of the trainable parameters, and of their gradients for a half model
        master = 4 * shape["trainable"]
        gradients += 4 * shape["trainable"] if half else 0
    n = spread.processes
    return {
        "weights": weights / n if spread.shards_parameters else weights,
        "adapter": shape["adapter"] * 4 / (n if spread.shards_parameters else 1) if lora else 0,
        "gradients": gradients / n if spread.shards_gradients else gradients,
        "optimizer": optimizer_bytes(shape, recipe.training.optimizer) / (n if spread.shards_optimizer else 1),
        "master weights": master / (n if spread.shards_optimizer else 1),
    }


def layer_bytes(shape: dict, batch: int, tokens: int, e: int, keys: int = 0, matrix: bool = False,
                 frozen: float = 0.0) -> float:
    """What autograd keeps for one transformer layer over `batch` rows of `tokens` tokens, at `e` bytes an element.
    Of the width: the attention's input, q, k, v, its output and that output made contiguous for the output
    projection, the norms' inputs and the feed-forward's input (about ten; a python RMSNorm also keeps its
    normalized input). Of the feed-forward's width: what the activation keeps (a fused GELU its input, whose output
    the next product keeps; GPT-2's tanh GELU, written in python, five; a gated SiLU four). A 1-byte mask per
    dropout. `matrix`: the attention probabilities are kept (eager attention, or attention dropout on a CPU, where
    torch's attention falls back to the plain products), and their dropped-out copy where attention drops
    out. `keys`: a seq2seq decoder layer's
    cross-attention over that many encoder tokens. `frozen`: bytes per token that frozen products and LoRA's
    adapters change (see plan_memory.lora_saved)."""
    h, i, a = shape["hidden"], shape["intermediate"], shape["heads"]
    rows, rms, dropout = batch * tokens, shape["norm"] == "rms", shape["dropout"]
    dropped = shape.get("attention_dropout", dropout)  # (the probabilities' own dropout: a copy and a mask)
    kv = 2 * h * shape["kv_heads"] / max(1, a)  # k and v: narrower under grouped-query attention
    total = e * rows * ((8 + 2 * rms) * h + kv + shape["wide_tensors"] * i) + (rows * (3 * h + i * shape["ffn_dropout"])
                                                                            if dropout else 0) + rows * frozen
    if matrix:
        total += batch * a * tokens * tokens * (2 * e + 1 if dropped else e)
    if keys:
        total += e * (rows * (4 + rms) * h + 2 * batch * keys * h) + (rows * h if dropout else 0)
        if matrix:
            total += batch * a * tokens * keys * (2 * e + 1 if dropped else e)
    return total


def stack_bytes(shape: dict, batch: int, tokens: int, layers: int, e: int, checkpointing: bool, keys: int = 0,
           matrix: bool = False, frozen: float = 0.0) -> float:
    """A stack of layers: all of them, or with checkpointing one saved input per layer plus the layer being
    recomputed in the backward pass, whose activations and their gradients are then live together."""
    if not layers:
        return 0.0
    one = layer_bytes(shape, batch, tokens, e, keys, matrix, frozen)
    if checkpointing:
        return layers * e * batch * tokens * shape["hidden"] + 2 * one
    return layers * one
