"""What a model type is, read from transformers' own tables (`modeling_auto.*_MAPPING_NAMES`): its family,
its head for each task (the Auto class that config/tasks.py names for the family), and whether its causal LM
keeps packed examples apart. Reading the tables, not a hand-typed list, keeps new model types known with each
transformers release. Light at import: transformers is imported inside the functions.
"""

from __future__ import annotations

import functools

from hftoolkit.config import tasks
from hftoolkit.config.families import reads_text
from hftoolkit.config.tasks import CAUSAL_LM, IMAGE_CLS, MASKED_LM, SEQ2SEQ_LM, SEQ_CLS, TOKEN_CLS

# The heads whose presence decides a model type's family (family_of).
FAMILY_HEADS = (SEQ_CLS, TOKEN_CLS, MASKED_LM, CAUSAL_LM, SEQ2SEQ_LM, IMAGE_CLS)
TEXT_HEADS = (SEQ_CLS, TOKEN_CLS, MASKED_LM)

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
    heads = {auto for auto in FAMILY_HEADS if _class_names(auto, model_type)}
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
            return family if reads_text(family) == text else None
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
    auto = tasks.head(task, family)
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
    return tuple(task for task in tasks.names() if head_class(config, task, family))


def _mapping(name: str) -> dict:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, name, None) or {}


def _class_names(auto: str, model_type: str) -> set[str]:
    """The class names the Auto class `auto` loads for `model_type`, from the modeling_auto table it loads from
    (model_type -> class name; an entry may name several)."""
    import transformers

    names = getattr(transformers, auto)._model_mapping._model_mapping.get(model_type) or ()
    return {names} if isinstance(names, str) else set(names)


# A call that builds the attention mask (transformers.masking_utils), with position_ids among its arguments, or the
# mask arguments gathered in a dict that holds them first.
_MASK_FROM_POSITIONS = (r"(?:create_\w*causal_mask|mask_function)\((?:[^()]|\([^()]*\))*?\bposition_ids\s*=",
                        r"mask_kwargs\s*=\s*\{[^}]*[\"']position_ids[\"']\s*:")

# Names that modeling code gives a state carried along the sequence.
_STATE_ALONG_SEQUENCE = ("conv_state", "ssm_state", "recurrent_state", "linear_attn")


@functools.cache
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
