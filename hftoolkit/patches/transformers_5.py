"""transformers 5's save_pretrained writes only on global rank 0, whatever `is_main_process` it is given (the Trainer
gives it `should_save`, which save_on_each_node makes true on every machine's first process), so under
training.save_on_each_node the other machines' checkpoints would hold no weights. peft's save_pretrained (LoRA)
honours is_main_process; `save_on_each_machine` makes a full model do the same."""

from __future__ import annotations

LIBRARY = "transformers"
VERSIONS = ">=5.0,<6"


def save_on_each_machine(model) -> None:
    """Let each machine's first process write `model`'s weights (training.save_on_each_node)."""
    if hasattr(model, "should_save_on_this_rank"):
        model.should_save_on_this_rank = lambda is_main_process: is_main_process


def still_needed() -> list[str]:
    from transformers import PreTrainedModel

    if not hasattr(PreTrainedModel, "should_save_on_this_rank"):
        return ["PreTrainedModel.should_save_on_this_rank is gone: check how save_pretrained picks its writer"]
    return []
