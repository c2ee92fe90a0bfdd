"""What a model type is, read from transformers' own tables: its family, its heads, its default LoRA targets.

A hand-typed table of model types goes stale with every transformers release (a phi3 or umt5
checkpoint was refused until the user named its family), while transformers already says, per
model type, which heads it has: `modeling_auto.*_MAPPING_NAMES` (model_type -> class name), the
tables the Auto classes load from. So the family is derived from which of those tables know the
type, the head for a task from the table of the Auto class that the family's formulation loads
(families/*.py, FORMULATIONS), and the LoRA targets from peft's table, then ours, then the model's
own attention layers, found structurally.

Light at import: the standard library and `hftoolkit.config.tasks`; transformers, peft and torch are
imported inside the functions that need them.
"""

from __future__ import annotations

from hftoolkit.config import tasks

SEQ_CLS = "AutoModelForSequenceClassification"
TOKEN_CLS = "AutoModelForTokenClassification"
MASKED_LM = "AutoModelForMaskedLM"
CAUSAL_LM = "AutoModelForCausalLM"
SEQ2SEQ_LM = "AutoModelForSeq2SeqLM"
IMAGE_CLS = "AutoModelForImageClassification"

# The modeling_auto table each Auto class loads from (model_type -> class name, or a tuple of names).
MAPPINGS = {
    SEQ_CLS: "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    TOKEN_CLS: "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    MASKED_LM: "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    CAUSAL_LM: "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    SEQ2SEQ_LM: "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    IMAGE_CLS: "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
TEXT_HEADS = (SEQ_CLS, TOKEN_CLS, MASKED_LM)

# The Auto class each family's formulation of a task loads (families/*.py, FORMULATIONS): a decoder writes
# translation, summarization and instructions as one sequence (causal LM), an encoder-decoder with its decoder.
FORMULATION_HEADS: dict[str, dict[str, str]] = {
    "encoder": {"classification": SEQ_CLS, "regression": SEQ_CLS, "tagging": TOKEN_CLS, "mlm": MASKED_LM},
    "decoder": {"clm": CAUSAL_LM, "translation": CAUSAL_LM, "summarization": CAUSAL_LM, "instruction": CAUSAL_LM,
                "classification": SEQ_CLS, "regression": SEQ_CLS, "tagging": TOKEN_CLS},
    "seq2seq": {"translation": SEQ2SEQ_LM, "summarization": SEQ2SEQ_LM, "instruction": SEQ2SEQ_LM,
                "denoise": SEQ2SEQ_LM, "classification": SEQ_CLS, "regression": SEQ_CLS},
    "vision": {"image-classification": IMAGE_CLS},
}

# Tables of models whose input is not text alone, or not an image alone (speech, audio, video, image + text):
# a type in one of them belongs to no family, even where it also has a text head (Whisper's decoder, Gemma 3's
# causal LM over images and text), because the family's processor (a tokenizer, or an image processor) and
# collator can't feed it.
NOT_ONE_MODALITY = (
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_AUDIO_FRAME_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES", "MODEL_FOR_CTC_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES", "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES",
    "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_VISUAL_QUESTION_ANSWERING_MAPPING_NAMES",
    "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_ZERO_SHOT_OBJECT_DETECTION_MAPPING_NAMES",
)

# Words that name another modality's sub-config (audio_config, vision_config) in a config of several models.
OTHER_MODALITIES = ("audio", "vision", "image", "video", "speech")

# Remote code (a model type transformers does not know): the class-name endings of config.architectures, and
# the Auto classes of config.auto_map, that say the family, in the order they are asked.
ARCHITECTURE_ENDINGS = (
    ("vision", ("ForImageClassification",), IMAGE_CLS),
    ("seq2seq", ("ForSeq2SeqLM",), SEQ2SEQ_LM),
    ("decoder", ("ForCausalLM", "LMHeadModel"), CAUSAL_LM),
    ("encoder", ("ForMaskedLM",), MASKED_LM),
)

# LoRA's default targets (the attention's query and value projections, as in the LoRA paper) for the model
# types peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING lacks; several candidates where releases
# renamed them, of which only those the model really has are used.
LORA_TARGETS_PEFT_LACKS: dict[str, list[str]] = {
    "distilbert": ["q_lin", "v_lin"], "albert": ["query", "value"], "camembert": ["query", "value"],
    "mpnet": ["q", "v"], "modernbert": ["Wqkv"], "smollm3": ["q_proj", "v_proj"],
    "mbart": ["q_proj", "v_proj"], "marian": ["q_proj", "v_proj"], "pegasus": ["q_proj", "v_proj"],
    # transformers 5 names ViT's projections q_proj/v_proj; older releases said query/value.
    "vit": ["q_proj", "v_proj", "query", "value"], "deit": ["q_proj", "v_proj", "query", "value"],
    "beit": ["q_proj", "v_proj", "query", "value"], "dinov2": ["q_proj", "v_proj", "query", "value"],
    "swin": ["q_proj", "v_proj", "query", "value"],  # (transformers 5 renamed beit's and swin's projections)
}
# Names of attention projections, for attention modules whose class name does not say "Attention".
ATTENTION_NAMES = {"q", "k", "v", "query", "key", "value", "q_proj", "k_proj", "v_proj", "qkv", "qkv_proj", "Wqkv",
                   "query_key_value", "c_attn"}
# Linear layers as peft wraps them beside torch.nn.Linear and its subclasses (FalconLinear): GPT-2's transposed
# Conv1D, and bitsandbytes' quantized layers.
LINEAR_CLASSES = ("Conv1D", "Linear8bitLt", "Linear4bit")


# ---------------------------------------------------------------- family and heads


def family_of(config) -> str | None:
    """The family ("encoder", "decoder", "seq2seq", "vision") of a transformers config; None where it can't be
    decided (a model of speech, video or several modalities, or one with no head of any family).

    The order matters: BART has a masked-LM and a causal-LM table entry too, but is an encoder-decoder
    first; BERT has a causal LM (BertLMHeadModel) but is an encoder unless its checkpoint was saved as one.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = getattr(config, "model_type", None) or ""
    if model_type not in CONFIG_MAPPING_NAMES:
        return _family_of_remote_code(config)
    if _several_modalities(config) or any(model_type in _mapping(name) for name in NOT_ONE_MODALITY):
        return None
    heads = {auto for auto in MAPPINGS if model_type in _mapping(MAPPINGS[auto])}
    if SEQ2SEQ_LM in heads:
        return "seq2seq"
    if _is_image_model(config, heads, model_type):
        return "vision"
    if CAUSAL_LM in heads and (MASKED_LM not in heads or _saved_as(config, _class_names(CAUSAL_LM, model_type))):
        return "decoder"
    if heads & set(TEXT_HEADS):
        return "encoder"
    return None


def _family_of_remote_code(config) -> str | None:
    """A model type only its checkpoint's code knows: the family that its saved class names (architectures)
    or the Auto classes of its auto_map say, where that agrees with whether it has a vocabulary."""
    text = _has_vocabulary(config)
    if getattr(config, "is_encoder_decoder", False) and text:
        return "seq2seq"
    names = list(getattr(config, "architectures", None) or [])
    auto_map = getattr(config, "auto_map", None) or {}
    for family, endings, auto in ARCHITECTURE_ENDINGS:
        if auto in auto_map or any(name.endswith(endings) for name in names):
            reads_text = family != "vision"
            return family if reads_text == text else None
    return None


def _several_modalities(config) -> bool:
    """A config holding another modality's config (an audio or vision encoder beside the text model)."""
    return any(word in key for key in getattr(config, "sub_configs", None) or {} for word in OTHER_MODALITIES)


def _is_image_model(config, heads: set[str], model_type: str) -> bool:
    """An image classifier with no text head (or saved as one: Perceiver has both), or a model with no
    vocabulary that reads images (a backbone such as ViT-MAE, for which preflight then says it has no
    image-classification head)."""
    if IMAGE_CLS in heads and (not heads & set(TEXT_HEADS) or _saved_as(config, _class_names(IMAGE_CLS, model_type))):
        return True
    sizes = (getattr(config, "image_size", None), getattr(config, "num_channels", None))
    return not _has_vocabulary(config) and any(isinstance(v, int | list | tuple) for v in sizes)


def _has_vocabulary(config) -> bool:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return isinstance(getattr(text, "vocab_size", None), int)


def _saved_as(config, class_names: set[str]) -> bool:
    """Whether the checkpoint was saved as one of `class_names` (config.architectures)."""
    return any(name in class_names for name in getattr(config, "architectures", None) or [])


def head_class(config, task: str, family: str) -> str | None:
    """The transformers Auto class that gives this config's model type a head for `task` as `family`'s
    formulation loads it; None where the family has no formulation of the task, or transformers (or the
    checkpoint's own code, through auto_map) has no such head for the type."""
    auto = FORMULATION_HEADS.get(family, {}).get(task)
    if auto is None:
        return None
    if auto in (getattr(config, "auto_map", None) or {}):
        return auto
    return auto if _class_names(auto, getattr(config, "model_type", None) or "") else None


def tasks_with_heads(config, family: str | None = None) -> tuple[str, ...]:
    """The tasks (in tasks.py's order) that this config can be trained for as `family` (by default its own)."""
    family = family or family_of(config)
    if family is None:
        return ()
    return tuple(task for task in tasks.NAMES if head_class(config, task, family))


def _mapping(name: str) -> dict:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, name, None) or {}


def _class_names(auto: str, model_type: str) -> set[str]:
    """The class names `auto` loads for `model_type` (a table entry may name several)."""
    names = _mapping(MAPPINGS[auto]).get(model_type) or ()
    return {names} if isinstance(names, str) else set(names)


# ---------------------------------------------------------------- LoRA targets


def lora_targets_auto(model) -> tuple[list[str], str | None]:
    """(targets, note): LoRA's default targets for any model, never refused.

    peft's table where it has the model type, then ours (only names the model really has); otherwise
    every linear layer of the attention modules, found structurally, and then, where even those are not
    found, every linear layer outside the output embedding and the task head. The note says what was
    chosen when neither table had the type (a line to print), else None.
    """
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    model_type = model.config.model_type
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    for table in (PEFT_TARGETS, LORA_TARGETS_PEFT_LACKS):
        targets = [t for t in table.get(model_type) or [] if t in leaves]
        if targets:
            return targets, None
    listed = PEFT_TARGETS.get(model_type) or LORA_TARGETS_PEFT_LACKS.get(model_type)
    why = "lora.targets auto: " + (f"the default targets of model type {model_type!r} ({', '.join(listed)}) match "
                                   "none of its layers" if listed else
                                   f"peft has no default for model type {model_type!r}")
    found = _attention_linears(model)
    if found:
        return _targets(model, found), f"{why}; chose the attention's linear layers: {_shown(found)}"
    found = _linears_outside_heads(model)
    return _targets(model, found), (f"{why}, and no attention layer was found; chose every linear layer but the "
                                    f"output embedding and the task head: {_shown(found)}")


def _is_linear(module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear) or type(module).__name__ in LINEAR_CLASSES


def _attention_linears(model) -> list[str]:
    """Full names of the linear layers directly inside a module whose class says Attention, and of linear
    layers named as attention projections anywhere."""
    found = []
    for name, module in model.named_modules():
        inside = "Attention" in type(module).__name__
        for child, sub in module.named_children():
            if _is_linear(sub) and (inside or child in ATTENTION_NAMES):
                found.append(f"{name}.{child}" if name else child)
    return list(dict.fromkeys(found))


def _linears_outside_heads(model) -> list[str]:
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, "base_model_prefix", "")
    children = [name for name, _ in model.named_children()]
    heads = [name for name in children if name != base] if base in children else []  # (a bare base model: none)
    return [name for name, m in model.named_modules()
            if _is_linear(m) and m is not output and name.split(".", 1)[0] not in heads]


def _targets(model, names: list[str]) -> list[str]:
    """`names` as peft targets: a leaf name (q_proj) where every layer of that name is chosen, else the full
    name, so that a name such as `dense` can't also catch the feed-forward layer of the same name."""
    chosen = set(names)
    by_leaf: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if _is_linear(module):
            by_leaf.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    out = []
    for leaf, full in by_leaf.items():
        picked = [n for n in full if n in chosen]
        out += [leaf] if picked and len(picked) == len(full) else picked
    return out


def _shown(names: list[str]) -> str:
    return ", ".join(dict.fromkeys(name.rsplit(".", 1)[-1] for name in names))


# A call that builds the attention mask (transformers.masking_utils), with position_ids among its arguments, or the
# mask arguments gathered in a dict that holds them first.
_MASK_FROM_POSITIONS = (r"(?:create_\w*causal_mask|mask_function)\((?:[^()]|\([^()]*\))*?\bposition_ids\s*=",
                        r"mask_kwargs\s*=\s*\{[^}]*[\"']position_ids[\"']\s*:")

# Names that modeling code gives a state carried along the sequence.
_STATE_ALONG_SEQUENCE = ("conv_state", "ssm_state", "recurrent_state", "linear_attn")


def packs_by_positions(model_type: str) -> bool:
    """Whether the model type's causal LM keeps packed examples apart by their position ids alone.

    transformers 5 does this in masking_utils: called with position_ids and no attention mask, its mask builders
    find where positions restart (find_packed_sequence_indices) and let a token attend only within its own
    example, for the eager, sdpa and flex kernels; flash_attention_2 reads the restarts from position_ids
    itself. A model type takes part only where its modeling code hands position_ids to those builders; one that
    builds its mask from the attention mask alone (bloom, opt) would let packed examples attend to each other.
    Layers that carry a state along the sequence (Mamba, linear attention, short convolutions: Jamba, Qwen3-Next,
    LFM2) would carry it across examples whatever the mask, so their types are refused too.
    That is read from the model type's own modeling module, so a new release's types are known without a list.
    """
    import importlib
    import inspect
    import re

    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if not isinstance(name, str):
        return False
    module_name = model_type_to_module_name(model_type)
    try:
        source = inspect.getsource(importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}"))
    except (ImportError, OSError, TypeError):
        return False
    if any(word in source for word in _STATE_ALONG_SEQUENCE):
        return False
    return any(re.search(pattern, source) for pattern in _MASK_FROM_POSITIONS)
