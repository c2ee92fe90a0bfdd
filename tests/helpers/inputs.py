"""Inputs a user gets wrong, built on disk: files of rows, copies of the session's tiny checkpoints with something
taken away or changed, image folders, run folders without weights. tests/e2e/test_bad_inputs.py's catalogue and
tests/unit/job/test_preflight.py build from these."""

from __future__ import annotations

import json
from pathlib import Path


def write_file(tmp: Path, name: str, content: str | bytes) -> Path:
    """tmp/name holding `content` (text as UTF-8), its folders made."""
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def rows_file(tmp: Path, name: str, header: str, rows: list[str]) -> Path:
    """A CSV file: the header line, then one line a row."""
    return write_file(tmp, name, "\n".join([header, *rows]) + "\n")


def sentiment_csv(tmp: Path, name: str = "train.csv", labels=("pos", "neg")) -> Path:
    """12 text,label rows, the labels taken in turn."""
    return rows_file(tmp, name, "text,label",
                     [f"the film was {i} times {labels[i % len(labels)]},{labels[i % len(labels)]}" for i in range(12)])


def tiny_checkpoint_copy(tmp: Path, arch: str = "bert") -> Path:
    """A copy of the session's tiny checkpoint that a case may then damage."""
    import shutil

    from hftoolkit.sources.tiny import ensure_tiny

    copy = tmp / f"tiny-{arch}"
    shutil.copytree(ensure_tiny(arch), copy)
    return copy


def edit_json(path: Path, **changes) -> None:
    """Set each key of the JSON file to its value; a None value removes the key."""
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def without_tokenizer(tmp: Path) -> Path:
    """The tiny BERT with its tokenizer files removed."""
    ckpt = tiny_checkpoint_copy(tmp)
    for path in ckpt.glob("tokenizer*"):
        path.unlink()
    return ckpt


def tokenizer_without(tmp: Path, arch: str, *tokens: str) -> Path:
    """The tiny `arch` checkpoint whose tokenizer config names none of `tokens` (pad, eos, mask, ...)."""
    ckpt = tiny_checkpoint_copy(tmp, arch)
    edit_json(ckpt / "tokenizer_config.json", **{f"{t}_token": None for t in tokens})
    return ckpt


def class_images(tmp: Path, name: str = "images", classes=("cat", "dog")) -> Path:
    """tmp/name with a subfolder of three small PNGs for each class."""
    from PIL import Image

    for c, label in enumerate(classes):
        for i in range(3):
            path = tmp / name / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (i * 40, c * 60, 0)).save(path)
    return tmp / name


def vit_with(tmp: Path, size: int | None) -> Path:
    """The tiny ViT whose preprocessor resizes to `size`, or has no preprocessor_config.json where size is None."""
    ckpt = tiny_checkpoint_copy(tmp, "vit")
    if size is None:
        (ckpt / "preprocessor_config.json").unlink()
    else:
        edit_json(ckpt / "preprocessor_config.json", size={"height": size, "width": size})
    return ckpt


def weightless_run(folder: Path, recipe: str = "encoder-classification.yaml") -> Path:
    """A run folder as the commands that open one see it (the shipped recipe's recipe.yaml, an empty adapter/ folder,
    status complete) with no weights: a command that loads the model before it refuses an input fails on them."""
    import yaml

    from tests.helpers import RECIPES

    (folder / "adapter").mkdir(parents=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(yaml.safe_load((RECIPES / recipe).read_text())))
    (folder / "manifest.json").write_text(json.dumps({"status": "complete"}))
    return folder
