"""The recipes shipped inside the package (`hftoolkit/recipes/`, in the wheel as in a clone, where `recipes/` at the
root links to them), and how a RECIPE argument finds one.

A path that exists is read as it is, so a recipe file in the working folder always wins. Otherwise a shipped
recipe's name (`encoder-classification`), its file name, or its path in a clone (`recipes/encoder-classification.yaml`,
`recipes/accelerate/ddp.yaml`) names the shipped file, so the docs' commands run the same from a clone, from a wheel
or in the Docker image. Light: no I/O beyond the file system, no heavy import.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from hftoolkit import __version__

SHIPPED = Path(__file__).resolve().parents[1] / "recipes"
# The folder name a path in a clone starts with (the root's `recipes/`).
CLONE_PREFIX = "recipes"


def shipped_recipes() -> list[Path]:
    """Every shipped recipe file, launcher configs under accelerate/ included, sorted by path."""
    return sorted(SHIPPED.rglob("*.yaml"))


def shipped_name(path: Path) -> str:
    """A shipped file's name as a RECIPE argument takes it: `encoder-classification`, `accelerate/ddp`."""
    return path.relative_to(SHIPPED).with_suffix("").as_posix()


def find_recipe(path: str | Path) -> Path:
    """The file a RECIPE argument names: itself where it exists, else the shipped file it names, else itself
    (so that the caller's 'not found' names what was typed)."""
    path = Path(path)
    if path.exists() or path.is_absolute() or path.suffix not in ("", ".yaml", ".yml"):
        return path
    parts = path.parts[1:] if path.parts[:1] == (CLONE_PREFIX,) else path.parts
    if not parts:
        return path
    if not path.suffix:
        local = path.with_suffix(".yaml")  # `train NAME` where NAME.yaml is in the working folder: the local one
        if local.is_file():
            return local
    shipped = SHIPPED.joinpath(*parts)
    shipped = shipped if shipped.suffix else shipped.with_suffix(".yaml")
    return shipped if shipped.is_file() else path


def is_shipped(path: str | Path) -> bool:
    return Path(path).resolve().is_relative_to(SHIPPED)


def origin(path: str | Path) -> str:
    """Which file a run read, for its manifest: a shipped recipe by name and version, a user's file by its path."""
    if is_shipped(path):
        return f"{shipped_name(Path(path).resolve())} (shipped with hftoolkit {__version__})"
    return str(Path(path).resolve())


def close_match(path: str | Path) -> str | None:
    """The shipped recipe whose name is nearest what was typed (a typo), or None."""
    typed = Path(path)
    typed = Path(*typed.parts[1:]) if typed.parts[:1] == (CLONE_PREFIX,) and len(typed.parts) > 1 else typed
    names = [shipped_name(p) for p in shipped_recipes()]
    found = difflib.get_close_matches(typed.with_suffix("").as_posix(), names, n=1, cutoff=0.75)
    return found[0] if found else None
