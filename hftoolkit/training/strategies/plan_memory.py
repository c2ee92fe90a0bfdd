"""The bytes of single items of a memory plan (training/strategies/plan.py): the base weights as held, quantized
or not, the optimizer's states and the resident set of loading; apart, so that plan.py stays readable."""

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
