"""Two steps into transformers 5.

- save_pretrained writes only on global rank 0, whatever `is_main_process` it is given (the Trainer gives it
  `should_save`, which save_on_each_node makes true on every machine's first process), so under
  training.save_on_each_node the other machines' checkpoints would hold no weights. peft's save_pretrained (LoRA)
  honours is_main_process; `save_on_each_machine` makes a full model do the same.
- Under bf16 autocast, torch casts attention's inputs to bf16, and on a CPU its attention kernels are slower in
  bf16 than in fp32, with AMX tiles or without (the matrix products are faster in bf16).
  `attention_in_fp32_on_cpu` wraps the "sdpa" entry of transformers' AttentionInterface so that, there, attention
  runs in fp32; its output goes on in bf16 through the next product as before.
"""

from __future__ import annotations

LIBRARY = "transformers"
VERSIONS = ">=5.0,<6"


def save_on_each_machine(model) -> None:
    """Let each machine's first process write `model`'s weights (training.save_on_each_node)."""
    if hasattr(model, "should_save_on_this_rank"):
        model.should_save_on_this_rank = lambda is_main_process: is_main_process


def attention_in_fp32_on_cpu(enabled: bool = True) -> None:
    """From now on in this process, sdpa attention under CPU bf16 autocast computes in fp32 (`enabled`), or as
    transformers does (not `enabled`). Elsewhere (a GPU, no autocast, fp16) the wrapper only passes the call on."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("sdpa", _fp32_on_cpu_autocast if enabled else sdpa_attention_forward)


def _fp32_on_cpu_autocast(module, query, key, value, attention_mask, **kwargs):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type == "cpu" and torch.is_autocast_enabled("cpu") \
            and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        # (an additive mask, or T5's position bias, is added to the scores: it must come in the query's dtype)
        attention_mask, kwargs = _in_fp32(attention_mask), {k: _in_fp32(v) for k, v in kwargs.items()}
        with torch.autocast("cpu", enabled=False):
            return sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                          **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _in_fp32(value):
    import torch

    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def still_needed() -> list[str]:
    import inspect

    from transformers import AttentionInterface, PreTrainedModel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    problems = []
    if not hasattr(PreTrainedModel, "should_save_on_this_rank"):
        problems.append("PreTrainedModel.should_save_on_this_rank is gone: check how save_pretrained picks its writer")
    if list(inspect.signature(sdpa_attention_forward).parameters)[:5] != \
            ["module", "query", "key", "value", "attention_mask"] or "sdpa" not in AttentionInterface._global_mapping:
        problems.append("transformers' sdpa attention entry changed: check attention_in_fp32_on_cpu's wrapper")
    return problems
