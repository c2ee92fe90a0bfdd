"""Resolve a recipe into a `Job`, once per run: locate the checkpoint, load its config and processor,
read the data, run preflight, decide the precision. Every problem found is raised at once.

Under a launcher the main process resolves first (`main_process_first`), so a hub download, an `init:`
build or a GGUF conversion happens once; the other processes then read the caches it filled.
"""

from __future__ import annotations

import time
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.config.families import model_rules, reads_text
from hftoolkit.config.recipe import Recipe, RecipeError
from hftoolkit.job.hardware import hardware_problems, precision_warning
from hftoolkit.job.precision import precision_and_reason
from hftoolkit.job.spec import Job, ResolvedModel


def resolve_job(recipe: Recipe, *, data: bool = True, weights: Path | None = None, strategy=None) -> Job:
    """The recipe resolved: its model located and loaded without weights, its data read (unless `data` is
    False, as for predict) and checked together with the model. `weights` is a trained run's model/ or
    adapter/ folder: a full model is read from it, an adapter's base from the recipe, the processor from it.
    `strategy` is how training spreads the run (training/strategies), put on the job as it is."""
    from hftoolkit.job.preflight import preflight
    from hftoolkit.sources.data import load_data
    from hftoolkit.sources.streaming import load_stream

    # Hardware and precision are checked here, once, for a training job (eval and predict load on what is there).
    problems = hardware_problems(recipe) if strategy is not None else []
    dropped, model, rows, names = {}, None, None, None
    try:
        model = resolve_model(recipe, weights)
    except UserError as err:
        problems += _lines(err)
    started = time.perf_counter()
    if data:
        try:
            # (rows dropped from a stream are not counted: it is read once, by training)
            rows, names = load_stream(recipe) if recipe.data.streaming else load_data(recipe, dropped)
        except UserError as err:
            problems += _lines(err)
    read = time.perf_counter() - started
    # A stream is checked as training reads it: preflight would read it whole (its rows, its labels).
    seen = None if recipe.data.streaming else rows
    found = preflight(recipe, model, seen, names, dropped if data and seen is not None else None)
    found.problems[:0] = problems
    if found.problems:
        raise RecipeError(found.problems)
    names = names if names is not None else recipe.data.label_names
    precision, stepped_down = precision_and_reason(recipe.training.precision, model.model_type, strategy)
    if stepped_down:
        found.notes.append(f"training.precision: {stepped_down}")
    if strategy is not None and (slow := precision_warning(precision, _has_cuda())):  # (trains, but slowly here)
        found.warnings.append(slow)
    return Job(recipe=recipe, model=model, precision=precision,
               data=rows, label_names=tuple(names) if names is not None else None, findings=found, data_seconds=read,
               strategy=strategy)


def resolve_model(recipe: Recipe, weights: Path | None = None) -> ResolvedModel:
    """The checkpoint located once, its config and processor loaded once (no weights)."""
    from hftoolkit.sources.checkpoint import checkpoint_errors, resolve_checkpoint, started_from

    m = recipe.model
    full = weights is not None and weights.name == "model"
    path = str(weights) if full else resolve_checkpoint(recipe)
    base, adapters = (recipe, ()) if full else started_from(recipe)
    files = weight_files(base, path)
    # The processor: a trained run's own, else the earlier run's (its pad token and chat template), else the base's.
    processor_path = str(weights) if weights is not None else adapters[-1] if adapters else path
    with checkpoint_errors(base):
        config = load_config(base, path)
        family = family_of(recipe, config)
        processor = load_processor(recipe, family, processor_path, config)
    return ResolvedModel(checkpoint=m.checkpoint, path=path, revision=base.model.revision, config=config,
                         family=family, processor=processor, weights=files, adapters=adapters)


def weight_files(recipe: Recipe, path: str) -> tuple[str, ...]:
    """The weight files of a local checkpoint folder. Where its only weights are pickles (pytorch_model.bin),
    each is opened by torch's safe loader first: a pickle that would run code is refused here, before the run
    starts, and never loaded."""
    folder = _local_folder(path)
    if folder is None:
        return ()
    safe = sorted(p.name for p in folder.glob("*.safetensors"))
    pickles = sorted(p.name for p in folder.glob("*.bin") if p.name != "training_args.bin")
    if safe or not pickles:
        return tuple(safe)
    from torch.serialization import get_unsafe_globals_in_checkpoint

    for name in pickles:
        try:
            unsafe = get_unsafe_globals_in_checkpoint(str(folder / name))
        except Exception as err:  # not a torch checkpoint at all
            unsafe = [f"unreadable: {str(err).splitlines()[0][:120]}"]
        if unsafe:
            raise UserError(f"model.checkpoint: {recipe.model.checkpoint} holds its weights only as pickles, and "
                            f"{name} names code that loading it would run ({', '.join(unsafe[:3])}), so it is refused "
                            "unread: use a copy of the model saved as safetensors (save_pretrained does by default)")
    return tuple(pickles)


def load_config(recipe: Recipe, path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, revision=recipe.model.revision,
                                          trust_remote_code=recipe.model.trust_remote_code)
    except (OSError, ValueError) as err:  # config.json unreadable, or a model type transformers does not know
        raise UserError(f"model.checkpoint: could not read the config of {recipe.model.checkpoint} "
                        f"({str(err).splitlines()[0][:200]}): check that it is a complete checkpoint") from None


def family_of(recipe: Recipe, config) -> str:
    """model.family where the recipe sets it, else the family transformers' own tables give the model type;
    refused in one line when that family has no head for the task."""
    from hftoolkit.job.architectures import family_of as family_of_config

    family = recipe.model.family or family_of_config(config)
    if family is None:
        raise UserError(f"model.checkpoint: the family of model type {config.model_type!r} is not clear from "
                        "transformers' tables; set model.family to encoder, decoder, seq2seq or vision")
    if family not in tasks.spec(recipe.task).families:
        raise UserError(f"model.checkpoint: {tasks.no_head(recipe.task, recipe.model.checkpoint, family)}")
    problems = model_rules(config.model_type, recipe.task, recipe.training.precision)
    if problems:
        raise RecipeError([f"model.checkpoint: {problem}" for problem in problems])
    return family


def load_processor(recipe: Recipe, family: str, path: str, config=None):
    """The processor the family reads its input with (config/families.py, PROCESSORS); a folder without its
    files is refused, naming them."""
    if reads_text(family):
        return load_task_tokenizer(recipe, path, config)
    return load_image_processor(recipe, path, config)


def load_image_processor(recipe: Recipe, path: str, config=None):
    from transformers import AutoImageProcessor

    ckpt, local = recipe.model.checkpoint, _local_folder(path)
    if local is not None and not (local / "preprocessor_config.json").is_file():
        raise UserError(f"model.checkpoint: {ckpt} has no image processor file (preprocessor_config.json): "
                        "save the processor of the model it was trained from into it (processor.save_pretrained)")
    try:
        # With no backend named, transformers picks torchvision when installed and PIL otherwise, silently.
        return AutoImageProcessor.from_pretrained(path, revision=recipe.model.revision, config=config)
    except (OSError, ValueError) as err:
        raise UserError(f"model.checkpoint: could not load the image processor of {ckpt} "
                        f"({str(err).splitlines()[0][:200]}): check its preprocessor_config.json") from None


def load_task_tokenizer(recipe: Recipe, path: str, config=None):
    """The tokenizer training uses: pad = eos where there is no pad token, and a space before each word for
    tagging with byte-level BPE."""
    ckpt, local = recipe.model.checkpoint, _local_folder(path)
    try:
        # (given the config, transformers need not load it again to find the tokenizer's class)
        tokenizer = load_tokenizer(path, recipe.model.revision, config=config)
        if recipe.task == tasks.TAGGING and getattr(tokenizer, "add_prefix_space", None) is False:
            tokenizer = load_tokenizer(path, recipe.model.revision, config=config, add_prefix_space=True)
    except (OSError, ValueError, TypeError) as err:
        raise UserError(f"model.checkpoint: could not load the tokenizer of {ckpt} "
                        f"({str(err).splitlines()[0][:200]}): save the tokenizer of the model it was trained from "
                        "into it (tokenizer.save_pretrained)") from None
    if local is not None:
        _check_tokenizer_files(ckpt, local, tokenizer)
    return tokenizer


def load_tokenizer(path: str, revision: str | None = None, **kwargs):
    """A tokenizer with a pad token: a decoder without one (GPT-2) pads with its eos, which is safe because
    padding is masked out of attention and loss."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision, **kwargs)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _local_folder(path: str) -> Path | None:
    """The checkpoint's folder when it is one; None for a hub id (the libraries decide)."""
    folder = Path(path).expanduser()
    return folder if folder.is_dir() else None


def _check_tokenizer_files(ckpt: str, folder: Path, tokenizer) -> None:
    """tokenizer.json, or every vocabulary file the tokenizer's class reads. Without them transformers builds
    an empty tokenizer of the model type's class (a BertTokenizer of its 5 special tokens) that reads
    every word as unknown, and the run trains on nothing but [UNK]."""
    names = dict(getattr(type(tokenizer), "vocab_files_names", {}) or {})
    fast = names.pop("tokenizer_file", "tokenizer.json")
    slow = sorted(set(names.values()))
    if (folder / fast).is_file() or (slow and all((folder / n).is_file() for n in slow)):
        return
    expected = fast + (f", or {' + '.join(slow)}" if slow else "")
    raise UserError(f"model.checkpoint: {ckpt} has config.json but no tokenizer files "
                    f"(expected {expected}): save the tokenizer of the model it was trained from into it "
                    "(tokenizer.save_pretrained)")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _lines(err: UserError) -> list[str]:
    return list(getattr(err, "problems", None) or [err.message])
