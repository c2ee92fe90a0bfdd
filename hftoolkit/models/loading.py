"""Checkpoint loading and quantization, the parts every family shares.

A formulation's `load_model` picks the Auto class and the head; this module loads the job's checkpoint with
the config the job resolved (8-bit or 4-bit through bitsandbytes, the task head kept out of quantization) and
hands it to models/lora.py for its adapter.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from hftoolkit.base import extras
from hftoolkit.base.errors import UserError
from hftoolkit.job.spec import Job
from hftoolkit.models.lora import apply_lora, head_modules
from hftoolkit.patches.peft_0_21 import bitsandbytes_hidden
from hftoolkit.sources.checkpoint import checkpoint_errors

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
        quantized = job.recipe.model.quantization != "none" and not _ON_META.get()
        return apply_lora(model, job, task_type, modules_to_save=head, quantized=quantized)


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
    from_kwargs = dict(config=config, revision=job.model.revision, trust_remote_code=m.trust_remote_code, **kwargs)
    if job.recipe.model.dtype != "auto":
        from_kwargs["dtype"] = getattr(torch, DTYPES[job.recipe.model.dtype])
    if job.recipe.model.attention != "auto":  # auto: transformers' choice (sdpa where the model has it)
        if job.recipe.model.attention == "flash_attention_2":
            from hftoolkit.job.hardware import hardware_problems

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
    return merged(model, job.model.adapters)


def merged(model, adapters: tuple[str, ...]):
    """`model` with an earlier run's adapters merged into its weights, in order: the run starts from what that run
    made, as one model (one copy of the weights; a new adapter, and the reference of preference tuning, on top)."""
    from peft import PeftModel

    for adapter in adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
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

    from hftoolkit.base.memory import release_freed_memory

    for tensor in chain(model.parameters(), model.buffers()):
        if tensor.dtype.is_floating_point:  # (quantized weights are integer tensors, made in memory)
            tensor.data = tensor.data.clone()
    release_freed_memory()


def quantization_config(job: Job, skip: list[str]):
    if job.recipe.model.quantization == "none":
        return None
    # (train and eval refuse earlier, job/hardware.library_problems; predict, serve and the rest here, before the load)
    extras.requires("quantization", f"model.quantization: {job.recipe.model.quantization}")
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


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameters as peft counts them: 4-bit weights two per stored byte, ZeRO-3's empty
    placeholders at their full size. peft's count reads only `named_parameters`, so it counts a model without
    an adapter the same way."""
    from peft import PeftModel

    return PeftModel.get_nb_trainable_parameters(model)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
