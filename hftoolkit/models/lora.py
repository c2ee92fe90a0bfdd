"""LoRA: which layers the adapter adapts (lora.targets auto, all-linear or named modules), and the peft wrapper.

auto takes peft's table of default targets, then ours for the model types peft lacks, then the model's own
attention layers found structurally, then every linear layer outside the head, saying in one line what it chose
when no table knew the type. Imports torch and peft inside the functions that need them.
"""

from __future__ import annotations

from hftoolkit.base.errors import UserError
from hftoolkit.job.spec import Job

# LoRA's default targets (the attention's query and value projections, as in the LoRA paper) for the model
# types peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING lacks; several candidates where releases
# renamed them, of which only those the model really has are used.
TARGETS_PEFT_LACKS: dict[str, list[str]] = {
    "distilbert": ["q_lin", "v_lin"], "albert": ["query", "value"], "camembert": ["query", "value"],
    "mpnet": ["q", "v"], "modernbert": ["Wqkv"], "smollm3": ["q_proj", "v_proj"],
    "mbart": ["q_proj", "v_proj"], "marian": ["q_proj", "v_proj"], "pegasus": ["q_proj", "v_proj"],
    # transformers 5 names ViT's, BEiT's and Swin's projections q_proj/v_proj; older releases said query/value.
    "vit": ["q_proj", "v_proj", "query", "value"], "deit": ["q_proj", "v_proj", "query", "value"],
    "beit": ["q_proj", "v_proj", "query", "value"], "dinov2": ["q_proj", "v_proj", "query", "value"],
    "swin": ["q_proj", "v_proj", "query", "value"],
}
# Names of attention projections, for attention modules whose class name does not say "Attention".
ATTENTION_NAMES = {"q", "k", "v", "query", "key", "value", "q_proj", "k_proj", "v_proj", "qkv", "qkv_proj", "Wqkv",
                   "query_key_value", "c_attn"}
# Linear layers as peft wraps them beside torch.nn.Linear and its subclasses (FalconLinear): GPT-2's transposed
# Conv1D, and bitsandbytes' quantized layers.
LINEAR_CLASSES = ("Conv1D", "Linear8bitLt", "Linear4bit")
# Model types whose linear layers are Conv1D (weight stored transposed): LoRA needs fan_in_fan_out=True.
CONV1D_MODEL_TYPES = {"gpt2"}


def apply_lora(model, job: Job, task_type: str | None, modules_to_save: list[str] = (), quantized: bool = False):
    """Wrap `model` in a peft LoRA adapter (after kbit preparation when `quantized`); lora.variant picks
    plain LoRA, DoRA (a trained magnitude vector per adapted layer) or rsLoRA (scaling alpha / sqrt(r))."""
    if not job.recipe.lora.enabled:
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    chosen = targets(model, job, list(modules_to_save))
    if quantized:
        # (With gradient checkpointing this also makes the embeddings' output require grad: needed by the
        # reentrant variant only; the Trainer enables the non-reentrant one, as asked here.)
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=job.recipe.training.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = job.recipe.lora
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=chosen, modules_to_save=list(modules_to_save) or None,
                        use_dora=lora.variant == "dora", use_rslora=lora.variant == "rslora",
                        fan_in_fan_out=model.config.model_type in CONV1D_MODEL_TYPES, task_type=task_type)
    return get_peft_model(model, config)


def targets(model, job: Job, head: list[str] = ()) -> list[str]:
    """The recipe's lora.targets, checked against the model's modules.

    all-linear: every linear layer outside the task head (trained in full) and the output projection, as
    QLoRA does, by full name so that a name such as `dense` can't also match a layer inside the head.
    """
    asked = job.recipe.lora.targets
    if asked == "all-linear":
        return linears_outside(model, list(head))
    if asked == "auto":
        from hftoolkit.base import console

        chosen, note = auto_targets(model)
        if note:
            console.note(note)
        return chosen
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in asked if t not in leaves]
    if missing:
        linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if is_linear(m)})
        raise UserError(f"lora.targets: {', '.join(map(repr, missing))} match no module of "
                        f"{job.recipe.model.checkpoint}; linear layers it has: {', '.join(linear)}")
    return list(asked)


def auto_targets(model) -> tuple[list[str], str | None]:
    """(targets, note): LoRA's default targets for any model, never refused; the note (a line to print) says
    what was chosen when neither table had the type, else None."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    model_type = model.config.model_type
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    for table in (PEFT_TARGETS, TARGETS_PEFT_LACKS):
        found = [t for t in table.get(model_type) or [] if t in leaves]
        if found:
            return found, None
    listed = PEFT_TARGETS.get(model_type) or TARGETS_PEFT_LACKS.get(model_type)
    why = "lora.targets auto: " + (f"the default targets of model type {model_type!r} ({', '.join(listed)}) match "
                                   "none of its layers" if listed else
                                   f"peft has no default for model type {model_type!r}")
    found = _attention_linears(model)
    if found:
        return _as_targets(model, found), f"{why}; chose the attention's linear layers: {_shown(found)}"
    found = linears_outside(model, head_modules(model))
    return _as_targets(model, found), (f"{why}, and no attention layer was found; chose every linear layer but the "
                                       f"output embedding and the task head: {_shown(found)}")


def head_modules(model) -> list[str]:
    """Top-level modules outside the base model that hold weights: the task head (kept trainable, saved);
    none for a bare base model."""
    base = getattr(model, "base_model_prefix", "")
    children = dict(model.named_children())
    if base not in children:
        return []
    return [name for name, child in children.items() if name != base and any(True for _ in child.parameters())]


def is_linear(module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear) or type(module).__name__ in LINEAR_CLASSES


def linears_outside(model, head: list[str]) -> list[str]:
    """Full names of every linear layer but the output embedding and those inside the `head` modules."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, m in model.named_modules()
            if is_linear(m) and m is not output and name.split(".", 1)[0] not in head]


def _attention_linears(model) -> list[str]:
    """Full names of the linear layers directly inside a module whose class says Attention, and of linear
    layers named as attention projections anywhere."""
    found = []
    for name, module in model.named_modules():
        inside = "Attention" in type(module).__name__
        for child, sub in module.named_children():
            if is_linear(sub) and (inside or child in ATTENTION_NAMES):
                found.append(f"{name}.{child}" if name else child)
    return list(dict.fromkeys(found))


def _as_targets(model, names: list[str]) -> list[str]:
    """`names` as peft targets: a leaf name (q_proj) where every layer of that name is chosen, else the full
    name, so that a name such as `dense` can't also catch the feed-forward layer of the same name."""
    chosen = set(names)
    by_leaf: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if is_linear(module):
            by_leaf.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    out = []
    for leaf, full in by_leaf.items():
        picked = [n for n in full if n in chosen]
        out += [leaf] if picked and len(picked) == len(full) else picked
    return out


def _shown(names: list[str]) -> str:
    return ", ".join(dict.fromkeys(name.rsplit(".", 1)[-1] for name in names))
