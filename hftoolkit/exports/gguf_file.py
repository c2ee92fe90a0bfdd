"""GGUF, the file llama.cpp, Ollama and LM Studio run: a merged causal LM and its tokenizer in one file.

Written with the `gguf` package (llama.cpp's own gguf-py) the way llama.cpp's convert_hf_to_gguf.py writes it: the
same tensor names (gguf's TensorNameMap), the same metadata keys, the same per-tensor types (norms and 1-D tensors
float32, 2-D weights in the chosen type, q8_0 falling back to f16 where a row is not a whole number of 32-value
blocks), llama's rope rows permuted per head, and the tokenizer's vocabulary, merges, special ids and chat template in
the header. Nothing is compiled and nothing is downloaded. `read_back` opens the file with transformers' own GGUF
loader, so an export is checked by the reader that undoes each of these transforms, not by this module.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import NamedTuple

from hftoolkit.base.errors import UserError

QUANTIZATIONS = ("f32", "f16", "bf16", "q8_0")


@dataclass(frozen=True)
class Architecture:
    """How one transformers model type is written: its GGUF architecture, its hyperparameter keys and the tensor
    transforms the reader reverses (transformers' modeling_gguf_pytorch_utils TENSOR_PROCESSORS)."""

    gguf_arch: str  # general.architecture, one of gguf.MODEL_ARCH_NAMES' values
    hyperparameters: str  # "rms" (llama-like: RMSNorm, rope) or "gpt2" (LayerNorm, learned positions)
    rope_permuted: bool = False  # q and k rows in llama.cpp's rope layout (convert_hf_to_gguf.py LlamaModel.permute)
    conv1d: bool = False  # GPT-2's Conv1D weights, stored (in, out): written transposed, as nn.Linear's (out, in)
    tied_output_written: bool = False  # the converter writes output.weight even when tied (GPT-2's, for old readers)


# Model type -> how it is written. Mistral is llama to llama.cpp (its converter writes MistralForCausalLM as llama);
# transformers reads such a file back as a LlamaForCausalLM, the same computation.
ARCHITECTURES = {
    "llama": Architecture("llama", "rms", rope_permuted=True),
    "mistral": Architecture("llama", "rms", rope_permuted=True),
    "qwen2": Architecture("qwen2", "rms"),
    "gpt2": Architecture("gpt2", "gpt2", conv1d=True, tied_output_written=True),
}

# llama.cpp's names of the byte-level BPE pre-tokenizers (tokenizer.ggml.pre), found as its converter finds them: by
# the hash of the token ids of one probe text (convert_hf_to_gguf.py get_vocab_base_pre). Only the vocabularies of
# the architectures above are listed; any other tokenizer is named by the shape of its pre-tokenizer below.
_PROBE = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ '
          '🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ '
          '------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, '
          '\'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL')
_PRE_BY_HASH = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM(2)
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
}
# When two llama.cpp names split text alike, the one its converter writes.
_PREFERRED_PRE = ("llama-bpe", "qwen2", "tekken", "gpt-4o")

_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}
_TENSOR_TYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}


def writable_types() -> tuple[str, ...]:
    """The model types (config.model_type) this module writes, each proven by a round trip in its tests."""
    return tuple(ARCHITECTURES)


def refusal(model_type: str) -> str | None:
    """None if `model_type` can be written as GGUF, else one line naming it and the types that can."""
    if model_type in ARCHITECTURES:
        return None
    return (f"model type {model_type} can't be exported as GGUF: the GGUF writer handles the decoder types "
            f"{', '.join(writable_types())}; export it with `merge` (safetensors), or an encoder run as ONNX")


def write_gguf(model, tokenizer, path: Path, quantization: str, chat_template: str | None = None,
               name: str | None = None) -> None:
    """Write `model` (a merged transformers causal LM) and `tokenizer` as the GGUF file `path`, atomically: the file
    is written beside `path` under a temporary name and renamed into place, so `path` is complete or absent.

    Args:
        quantization: one of QUANTIZATIONS, the type of the 2-D weights (general.file_type says which).
        chat_template: written as tokenizer.chat_template, so llama.cpp and Ollama chat the way the run was trained;
            None writes the tokenizer's own template, if it has one.
        name: general.name; by default the model's checkpoint folder or id.
    """
    if quantization not in QUANTIZATIONS:
        raise UserError(f"GGUF quantization {quantization} is unknown: choose one of {', '.join(QUANTIZATIONS)}")
    config = model.config
    reason = refusal(config.model_type)
    if reason:
        raise UserError(reason)
    _check_config(config)
    import gguf
    import numpy as np

    arch = ARCHITECTURES[config.model_type]
    writer = gguf.GGUFWriter(path=None, arch=arch.gguf_arch)
    _write_metadata(writer, gguf, config, quantization, name)
    _write_tokenizer(writer, gguf, tokenizer, _vocab_size(model), chat_template)
    plan = _tensor_plan(gguf, model, arch, quantization)
    for tensor in plan:
        nbytes = int(np.prod(gguf.quants.quant_shape_to_byte_shape(tensor.shape, tensor.kind)))
        writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float32), nbytes, raw_dtype=tensor.kind)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer.write_header_to_file(path=Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        weights = model.state_dict()
        for tensor in plan:  # one tensor at a time: the file's size is never held in memory
            writer.write_tensor_data(_encoded(gguf, model, arch, tensor, weights))
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        Path(tmp).unlink(missing_ok=True)
        raise


def read_back(path: Path):
    """(model, tokenizer) from the GGUF file `path` through transformers' own GGUF loader: every weight
    dequantized to float32, the model in eval mode. What a user's `from_pretrained(..., gguf_file=...)` gets."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from hftoolkit.sources.gguf import parsed_once

    path = Path(path)
    folder, file = str(path.parent), path.name
    try:
        # dequantize=True: without it, architectures transformers can run packed would keep GGUF blocks.
        with parsed_once():
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32,
                                                         quantization_config=GgufConfig(dequantize=True))
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    except (ValueError, KeyError, NotImplementedError, OSError) as err:
        raise UserError(f"{path}: transformers cannot read the GGUF file back ({str(err).splitlines()[0][:200]}): "
                        "the export is not usable; report it with the model type") from None
    return model.eval(), tokenizer


def _check_config(config) -> None:
    """Refuse, in one line, what the file could hold but one of its readers would compute differently."""
    what = None
    if config.model_type == "gpt2":
        # transformers' GGUF reader builds GPT2Config from the file without n_positions or n_inner
        if config.n_positions != 1024 or config.n_inner not in (None, 4 * config.n_embd):
            what = (f"{config.n_positions} positions and an MLP of {config.n_inner or 4 * config.n_embd} "
                    "(transformers' GGUF reader assumes GPT-2's 1024 and 4 x width)")
        elif config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):  # llama.cpp's GELU is tanh's
            what = f"activation {config.activation_function}"
        elif config.scale_attn_by_inverse_layer_idx or config.reorder_and_upcast_attn:
            what = "rescaled attention"
    else:
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            what = f"rope scaling {rope['rope_type']}"
        elif getattr(config, "hidden_act", "silu") != "silu":  # llama.cpp's llama and qwen2 graphs apply SiLU
            what = f"activation {config.hidden_act}"
        elif getattr(config, "attention_bias", False) and config.model_type != "qwen2":
            what = "attention biases"  # transformers' GGUF reader rebuilds llama without them
        elif getattr(config, "mlp_bias", False):
            what = "MLP biases"
        elif getattr(config, "use_sliding_window", False):
            what = "sliding-window attention"
        elif config.model_type == "qwen2" and _head_dim(config) != config.hidden_size // config.num_attention_heads:
            what = f"head size {_head_dim(config)}"  # transformers reads a qwen2 file with no head size
    if what:
        raise UserError(f"this {config.model_type} model has {what}, which its GGUF export would not carry "
                        "faithfully: export it with `merge` (safetensors) instead")


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _vocab_size(model) -> int:
    """Rows of the input embedding, which may exceed the tokenizer's vocabulary (padded for speed)."""
    return model.get_input_embeddings().weight.shape[0]


def _write_metadata(writer, gguf, config, quantization: str, name: str | None) -> None:
    """general.* and the hyperparameters, under the keys convert_hf_to_gguf.py writes for these architectures."""
    source = str(getattr(config, "_name_or_path", "") or "").rstrip("/")
    name = name or (Path(source).name if source else None) or (config.architectures or [config.model_type])[0]
    if name == "mistral":  # transformers' reader takes a llama file of that exact name for an architecture gguf lacks
        name = "Mistral"
    writer.add_type("model")
    writer.add_name(name)
    writer.add_file_type(getattr(gguf.LlamaFileType, _FILE_TYPES[quantization]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    if ARCHITECTURES[config.model_type].hyperparameters == "gpt2":  # convert_hf_to_gguf.py GPT2Model
        writer.add_context_length(config.n_positions)
        writer.add_embedding_length(config.n_embd)
        writer.add_block_count(config.n_layer)
        writer.add_feed_forward_length(config.n_inner or 4 * config.n_embd)
        writer.add_head_count(config.n_head)
        writer.add_layer_norm_eps(float(config.layer_norm_epsilon))
        writer.add_vocab_size(config.vocab_size)
        return
    heads = config.num_attention_heads
    head_dim = _head_dim(config)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_rope_freq_base(float((config.rope_parameters or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != config.hidden_size // heads:  # a head size that isn't hidden / heads (Mistral-Nemo's, say)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)


def _write_tokenizer(writer, gguf, tokenizer, vocab_size: int, chat_template: str | None) -> None:
    """tokenizer.ggml.*: a byte-level BPE vocabulary as llama.cpp's `gpt2` tokenizer (convert_hf_to_gguf.py
    _set_vocab_gpt2), one token per embedding row, then the special ids, the BOS/EOS flags and the chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else {}
    bpe = spec.get("model", {})
    if bpe.get("type") != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        kind = bpe.get("type") or type(tokenizer).__name__
        raise UserError(f"the run's tokenizer ({kind}) is not a byte-level BPE tokenizer, the one kind the GGUF "
                        "writer handles (GPT-2, SmolLM2, Llama 3, Qwen2): export with `merge` (safetensors) instead")

    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise UserError(f"the tokenizer has token id {max(vocab.values())} but the model embeds {vocab_size} tokens: "
                        "resize the model's embeddings to the tokenizer (model.resize_token_embeddings) before export")
    by_id = {i: token for token, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:  # embedding rows no token uses
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        if i in added:
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer(tokenizer, spec))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])])

    for kind, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        token_id = getattr(tokenizer, f"{kind}_token_id", None)
        if token_id is not None:
            add(token_id)
    # What the tokenizer adds around a text, as llama.cpp will: seen by encoding one, not read from a flag.
    probe = tokenizer("a")["input_ids"]
    writer.add_add_bos_token(tokenizer.bos_token_id is not None and probe[0] == tokenizer.bos_token_id)
    writer.add_add_eos_token(tokenizer.eos_token_id is not None and probe[-1] == tokenizer.eos_token_id)
    writer.add_add_space_prefix(bool(_byte_level(spec).get("add_prefix_space", False)))

    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: "default" becomes tokenizer.chat_template
        template = [{"name": key, "template": value} for key, value in template.items()]
    if template:
        writer.add_chat_template(template)


def _byte_level(spec: dict) -> dict:
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    return next((p for p in parts if p.get("type") == "ByteLevel"), {})


def _pre_tokenizer(tokenizer, spec: dict) -> str:
    """tokenizer.ggml.pre: the llama.cpp pre-tokenizer that splits text as this tokenizer does, by the probe's hash
    for the known vocabularies, else by the shape of the tokenizer's pre-tokenizer."""
    digest = sha256(str(tokenizer.encode(_PROBE)).encode()).hexdigest()
    if digest in _PRE_BY_HASH:
        return _PRE_BY_HASH[digest]
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    shape = [p.get("type") for p in parts]
    if shape == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if shape == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"  # a digit at a time, then GPT-2's split (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM)
    if shape == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        regex = (parts[0].get("pattern") or {}).get("Regex")
        names = _known_splits().get(regex, [])
        if names:
            return next((n for n in _PREFERRED_PRE if n in names), names[0])
    raise UserError(f"the tokenizer's pre-tokenizer ({' + '.join(map(str, shape)) or 'none'}) is not one llama.cpp "
                    "is known to split text like: llama.cpp would tokenize differently; export with `merge` instead")


def _known_splits() -> dict[str, list[str]]:
    """regex -> the llama.cpp pre-tokenizer names transformers' GGUF reader splits with it, from its own table."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return {}
    names: dict[str, list[str]] = {}
    for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items():
        names.setdefault(regex, []).append(name)
    return names


class _Tensor(NamedTuple):
    """One weight as the file holds it: where it comes from, its GGUF name, GGML type and shape (rows last-major,
    as numpy orders them; the file lists them the other way round)."""

    hf_name: str
    name: str
    kind: int
    shape: tuple[int, ...]


def _tensor_plan(gguf, model, arch: Architecture, quantization: str) -> list[_Tensor]:
    """Every weight under its GGUF name and type, as llama.cpp's converter writes it, before a byte is written; a
    weight the tensor map has no name for stops the export (a file without it would load as another model)."""
    config = model.config
    names = gguf.get_tensor_name_map(_model_arch(gguf, arch.gguf_arch), config.num_hidden_layers)
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is model.get_input_embeddings().weight
    plan, unnamed = [], []
    for hf_name, tensor in model.state_dict().items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            unnamed.append(hf_name)
        elif not (tied and name == "output.weight" and not arch.tied_output_written):  # else llama.cpp reuses
            shape = tuple(tensor.shape)  # token_embd, as it does for a file with no output
            if _transposed(arch, name, shape):
                shape = shape[::-1]
            plan.append(_Tensor(hf_name, name, _tensor_type(gguf, name, shape, quantization), shape))
    if unnamed:
        raise UserError(f"{len(unnamed)} weight(s) of this {config.model_type} model have no GGUF name "
                        f"({', '.join(unnamed[:3])}): its layout differs from {config.model_type}'s; "
                        "export with `merge` (safetensors) instead")
    return plan


def _encoded(gguf, model, arch: Architecture, tensor: _Tensor, weights: dict):
    """The bytes (as a numpy array) of one planned tensor: float32 on the CPU, transformed, then quantized."""
    import torch

    config = model.config
    with torch.no_grad():
        data = weights[tensor.hf_name].detach().to(device="cpu", dtype=torch.float32)
    if _transposed(arch, tensor.name, tuple(data.shape)):
        data = data.T.contiguous()
    if arch.rope_permuted and tensor.name.endswith((".attn_q.weight", ".attn_k.weight")):
        heads = config.num_attention_heads
        data = _rope_rows(data, heads if ".attn_q." in tensor.name else (config.num_key_value_heads or heads))
    return gguf.quants.quantize(data.numpy(), tensor.kind)


def round_like_file(model, quantization: str) -> None:
    """Round the model's weights in place to what a GGUF file of this quantization stores (each tensor's type as
    the plan gives it, q8_0's blocks along the rows as written): the run's model as the file holds it, which the
    export's check compares the read-back file with. (llama.cpp's row order of q and k is left out: rounding each
    value, or each row's blocks, is the same in either order.)"""
    import gguf
    import torch

    arch = ARCHITECTURES[model.config.model_type]
    weights = model.state_dict()
    with torch.no_grad():
        for tensor in _tensor_plan(gguf, model, arch, quantization):
            data = weights[tensor.hf_name].detach().to(device="cpu", dtype=torch.float32)
            transposed = _transposed(arch, tensor.name, tuple(data.shape))
            data = data.T.contiguous() if transposed else data
            stored = gguf.quants.quantize(data.numpy(), tensor.kind)
            rounded = torch.from_numpy(gguf.quants.dequantize(stored, tensor.kind)).reshape(data.shape)
            weights[tensor.hf_name].copy_((rounded.T if transposed else rounded).to(weights[tensor.hf_name].dtype))


def _transposed(arch: Architecture, name: str, shape: tuple[int, ...]) -> bool:
    return arch.conv1d and len(shape) == 2 and name.startswith("blk.")


def _model_arch(gguf, arch_name: str):
    return next(arch for arch, name in gguf.MODEL_ARCH_NAMES.items() if name == arch_name)


def _rope_rows(weight, heads: int):
    """llama.cpp's rope layout: within each head, the rows of the two rotated halves interleaved, as
    convert_hf_to_gguf.py LlamaModel.permute writes them (transformers' reader undoes it on load)."""
    rows = weight.shape[0]
    # (heads, 2, head_dim / 2, in) -> (heads, head_dim / 2, 2, in)
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _tensor_type(gguf, gguf_name: str, shape, quantization: str):
    """The GGML type of one tensor: 1-D tensors and norms float32 (llama.cpp's kernels expect it), else the
    quantization's; q8_0 only where a row holds whole 32-value blocks, else f16 (convert_hf_to_gguf.py's fallback)."""
    types = gguf.GGMLQuantizationType
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or gguf_name.startswith("position_embd."):
        return types.F32
    kind = getattr(types, _TENSOR_TYPES[quantization])
    if kind == types.Q8_0 and shape[-1] % gguf.GGML_QUANT_SIZES[types.Q8_0][0]:
        return types.F16
    return kind
