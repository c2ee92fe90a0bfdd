"""Where things are, each stated once: the toolkit's cache, a user's path with ~ expanded, and whether a name
reads as a hub repository id rather than a path."""

from __future__ import annotations

import os
from pathlib import Path

from hftoolkit.base.errors import UserError


def cache_root() -> Path:
    """Where the toolkit keeps what it builds once (tiny checkpoints, converted GGUF files, the matmul rate)."""
    return Path(os.environ.get("HFTOOLKIT_CACHE", Path.home() / ".cache" / "hftoolkit"))


def expand(path: str, key: str) -> Path:
    """`path` with ~ expanded; `key` names the recipe key (or option) that gave it, for the error."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # ~name of a user this machine does not know
        raise UserError(f"{key}: {path} starts with an unknown ~user: write the full path") from None


def is_path_like(name: str) -> bool:
    """Written as a path: it starts with . / or ~ (a hub id never does)."""
    return name.startswith((".", "/", "~"))


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a Hub repository id (`name` or `namespace/name`; dots allowed, as in
    `Qwen/Qwen2.5-0.5B`) rather than a path: a path starts with . / or ~, or has more than one part."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not name or is_path_like(name) or name.count("/") > 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True
