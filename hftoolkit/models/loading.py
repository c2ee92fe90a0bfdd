"""Checkpoint loading, quantization and LoRA: the parts every family shares.

A formulation's `load_model` picks the Auto class and the head; this module loads the job's
checkpoint with the config the job resolved (8-bit or 4-bit through bitsandbytes, with the task
head kept out of quantization), and wraps it in a LoRA adapter whose default targets come from
peft's table, then ours, then the model's own attention (job/architectures.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from hftoolkit.errors import UserError
from hftoolkit.job.spec import Job
from hftoolkit.patches.peft_0_21 import bitsandbytes_hidden
from hftoolkit.sources.checkpoint import checkpoint_errors

# Modules that are Conv1D (weight stored transposed): LoRA needs fan_in_fan_out=True.
CONV1D_MODEL_TYPES = {"gpt2"}
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


# Inside `on_meta_device`: models are built from their config on the meta device, nothing read (plans).
_ON_META = ContextVar("on_meta_device", default=False)


@contextmanager
def on_meta_device():
    """Inside the block a formulation's load_model builds its model from the config alone, on the meta device: the
    task head and the LoRA adapter as a run has them, no weight read or allocated, nothing quantized (a plan counts
    the quantized bytes from the layers bitsandbytes would replace)."""
    token = _ON_META.set(True)
    try:
        yield
    finally:
        _ON_META.reset(token)


def load_task_model(auto_class, job: Job, task_type: str | None, with_head: bool = True, **kwargs):
    """Load a checkpoint into `auto_class` and wrap it in LoRA; the task head stays full precision and trainable."""
    head = task_head_of(auto_class, job, **kwargs) if with_head else []
    with bitsandbytes_hidden(needed=job.recipe.model.quantization != "none" and not _ON_META.get()):
        import peft  # noqa: F401  (imported first here, where bitsandbytes can be hidden from it)

        model = load_pretrained(auto_class, job, keep_full_precision=head, **kwargs)
        return apply_lora(model, job, task_type, modules_to_save=head)


def task_head_of(auto_class, job: Job, **kwargs) -> list[str]:
    """The head modules `auto_class` adds, read from a weightless (meta-device) copy of the model."""
    from accelerate import init_empty_weights
    from transformers.modeling_utils import set_zero3_state

    # set_zero3_state: transformers' switch for "no deepspeed.zero.Init here", which under ZeRO-3 would try to
    # partition the meta tensors of this weightless copy.
    with init_empty_weights(), set_zero3_state():
        return head_modules(auto_class.from_config(configured(job, kwargs)[0],
                                                   trust_remote_code=job.recipe.model.trust_remote_code))


def configured(job: Job, kwargs: dict) -> tuple:
    """(the job's config with the attributes in `kwargs` set, the kwargs left for from_pretrained): the config
    is loaded once per run, and each load takes a copy with its task's labels."""
    import copy

    config = copy.deepcopy(job.model.config)
    settings = {k: v for k, v in kwargs.items() if hasattr(config, k) or k in ("id2label", "label2id")}
    config.update(settings)
    return config, {k: v for k, v in kwargs.items() if k not in settings}


def load_pretrained(auto_class, job: Job, keep_full_precision: list[str] = (), **kwargs):
    """from_pretrained with the recipe's dtype, quantization and remote-code policy."""
    import torch

    config, kwargs = configured(job, kwargs)
    m = job.recipe.model
    from_kwargs = dict(config=config, revision=m.revision, trust_remote_code=m.trust_remote_code, **kwargs)
    if job.recipe.model.dtype != "auto":
        from_kwargs["dtype"] = getattr(torch, DTYPES[job.recipe.model.dtype])
    if job.recipe.model.attention != "auto":  # auto: transformers' choice (sdpa where the model has it)
        if job.recipe.model.attention == "flash_attention_2":
            from hftoolkit.job.machine import hardware_problems

            problems = [p for p in hardware_problems(job.recipe) if p.startswith("model.attention")]
            if problems:
                raise UserError(problems[0])
        from_kwargs["attn_implementation"] = job.recipe.model.attention
    if _ON_META.get():
        return _meta_model(auto_class, from_kwargs)
    quant = quantization_config(job, keep_full_precision)
    strategy = job.strategy
    if quant is not None:
        from_kwargs.update(quantization_config=quant, device_map={"": _device()})
        if strategy is not None and job.recipe.model.dtype == "auto":
            from_kwargs.update(strategy.load_arguments(quant))
    elif strategy is not None and strategy.receives_weights():
        return weightless_model(auto_class, from_kwargs)
    from safetensors import SafetensorError  # a truncated or damaged weights file

    checkpoint = job.model.path
    try:
        with checkpoint_errors(job.recipe):
            model = auto_class.from_pretrained(checkpoint, **from_kwargs)
    except (OSError, ValueError, SafetensorError) as err:
        if job.recipe.model.attention != "auto" and job.recipe.model.attention in str(err):
            raise UserError(f"model.attention: {job.recipe.model.checkpoint} can't run attention "
                            f"{job.recipe.model.attention} ({str(err).splitlines()[0][:200]}): "
                            "set model.attention to auto") from None
        raise UserError(f"model.checkpoint: could not load {job.recipe.model.checkpoint} "
                        f"({str(err).splitlines()[0][:200]}): check that it is a complete checkpoint") from None
    if quant is not None and _device() == "cpu":
        _release_checkpoint_memory(model)
    return model


def _meta_model(auto_class, from_kwargs: dict):
    from accelerate import init_empty_weights
    from transformers.modeling_utils import set_zero3_state

    keys = ("config", "dtype", "attn_implementation", "trust_remote_code")
    with init_empty_weights(), set_zero3_state():
        return auto_class.from_config(**{k: v for k, v in from_kwargs.items() if k in keys})


def weightless_model(auto_class, from_kwargs: dict):
    """The model from its config alone, nothing read from the checkpoint: parameters in untouched memory
    (the operating system maps pages only when written, and the broadcast writes them), buffers computed
    as the model builds them (position ids, rotary frequencies: the broadcast skips non-persistent ones).

    Not left on the meta device: the Trainer builds its optimizer before sharding, and accelerate maps the
    optimizer's parameters to the sharded ones by data pointer, which is 0 for every meta tensor.
    """
    import torch
    from accelerate import init_empty_weights

    keys = ("config", "dtype", "attn_implementation", "trust_remote_code")
    with init_empty_weights(include_buffers=False):
        model = auto_class.from_config(**{k: v for k, v in from_kwargs.items() if k in keys})
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.is_meta:
                setattr(module, name, torch.nn.Parameter(torch.empty_like(param, device="cpu"),
                                                         requires_grad=param.requires_grad))
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # (tied parameters were replaced one by one above)
    return model


def _release_checkpoint_memory(model) -> None:
    """After a quantized load on CPU: copy the unquantized tensors out of the checkpoint's memory map,
    and hand the memory that quantizing freed back to the operating system.

    Why: quantizing reads every weight through the safetensors file's memory map, and the tensors
    left unquantized (embeddings, norms, the head) still point into it, so the whole file stays
    resident; glibc also keeps the freed fp32 scratch. Together they lifted an 8-bit run's peak memory
    above full fine-tuning's (benchmarks/memory.py measures it).
    """
    from itertools import chain

    from hftoolkit.memory import release_freed_memory

    for tensor in chain(model.parameters(), model.buffers()):
        if tensor.dtype.is_floating_point:  # (quantized weights are integer tensors, made in memory)
            tensor.data = tensor.data.clone()
    release_freed_memory()


def quantization_config(job: Job, skip: list[str]):
    if job.recipe.model.quantization == "none":
        return None
    import torch
    from transformers import BitsAndBytesConfig

    # None, not []: transformers then skips its defaults (output embeddings, tied weights such as GPT-2's lm_head);
    # an explicit list replaces them, and a quantized lm_head tied to the embeddings fails in its first forward.
    skip = list(skip) or None
    if job.recipe.model.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    compute = job.recipe.model.compute_dtype
    if compute == "auto":  # the dtype training computes in
        compute = {"bf16": "bfloat16", "fp16": "float16"}.get(job.precision, "float32")
    storage = job.strategy.quantization_arguments(getattr(torch, compute)) if job.strategy is not None else {}
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=getattr(torch, compute),
                              bnb_4bit_use_double_quant=job.recipe.model.double_quant, llm_int8_skip_modules=skip,
                              **storage)


def head_modules(model) -> list[str]:
    """Top-level modules outside the base model that hold weights: the task head (kept trainable, saved)."""
    base = getattr(model, "base_model_prefix", "")
    return [name for name, child in model.named_children()
            if name != base and any(True for _ in child.parameters())]


def lora_targets_for(model, job: Job, head: list[str] = ()) -> list[str]:
    """The recipe's LoRA targets, checked against the model's modules.

    auto: the model type's query and value projections (peft's table, then ours), else its attention's
    linear layers, said in one line (job/architectures.py).
    all-linear: every linear layer of the base model, as QLoRA does; the task head (trained in full)
    and the output projection are left out. Returned as full module names, so that a name such as
    `dense` can't also match a layer inside the head.
    """
    if job.recipe.lora.targets == "all-linear":
        return _all_linear(model, head)
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if job.recipe.lora.targets != "auto":
        missing = [t for t in job.recipe.lora.targets if t not in names]
        if missing:
            raise UserError(f"lora.targets: {', '.join(map(repr, missing))} match no module of "
                            f"{job.recipe.model.checkpoint}; linear layers it has: {', '.join(_linear_names(model))}")
        return list(job.recipe.lora.targets)
    from hftoolkit import console
    from hftoolkit.job.architectures import lora_targets_auto

    targets, note = lora_targets_auto(model)
    if note:
        console.note(note)
    return targets


def _is_linear(module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear) or type(module).__name__ in ("Conv1D", "Linear8bitLt", "Linear4bit")


def _linear_names(model) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if _is_linear(m)})


def _all_linear(model, head: list[str]) -> list[str]:
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skipped = tuple(f"{h}." for h in head)
    return [name for name, m in model.named_modules()
            if _is_linear(m) and m is not output and name not in head and not name.startswith(skipped)]


def apply_lora(model, job: Job, task_type: str | None, modules_to_save: list[str] = ()):
    """Wrap `model` in a peft LoRA adapter (after kbit preparation when quantized); lora.variant picks
    plain LoRA, DoRA (a trained magnitude vector per adapted layer) or rsLoRA (scaling alpha / sqrt(r))."""
    if not job.recipe.lora.enabled:
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    targets = lora_targets_for(model, job, list(modules_to_save))
    if job.recipe.model.quantization != "none" and not _ON_META.get():
        # (With gradient checkpointing this also makes the embeddings' output require grad: needed by the
        # reentrant variant only; the Trainer enables the non-reentrant one, as asked here.)
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=job.recipe.training.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = job.recipe.lora
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=targets, modules_to_save=list(modules_to_save) or None,
                        use_dora=lora.variant == "dora", use_rslora=lora.variant == "rslora",
                        fan_in_fan_out=model.config.model_type in CONV1D_MODEL_TYPES, task_type=task_type)
    return get_peft_model(model, config)


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameters; 4-bit weights count two per stored byte (their storage dtype may be wider:
    bnb_4bit_quant_storage)."""
    trainable = total = 0
    for p in model.parameters():
        n = getattr(p, "ds_numel", p.numel())  # (ZeRO-3 leaves an empty placeholder: ds_numel is its size)
        n *= 2 * p.element_size() if type(p).__name__ == "Params4bit" else 1
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
