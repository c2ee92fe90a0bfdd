"""The model card of a run: Hub front matter (`huggingface_hub.ModelCardData`) and a body a reader can use."""

from __future__ import annotations

import math
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.repocard import REGEX_YAML_BLOCK
from huggingface_hub.utils import validate_repo_id

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.config.recipe import Recipe

# The Hub's display names of pipeline tags (huggingface.js packages/tasks/src/pipelines.ts) that are not the tag's
# words capitalized.
PIPELINE_NAMES = {"fill-mask": "Fill-Mask"}


# Sources that are local files, never hub ids: what data.py reads as files, and single-file checkpoints.
LOCAL_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet", ".txt", ".gz", ".gguf", ".safetensors")


def model_card(recipe: Recipe, metrics: dict, license: str | None = None, model_type: str | None = None) -> str:
    """The run's README.md: Hub front matter, then what the run was and how it scored; `model_type` is the one the
    run resolved (job.model.model_type, manifest.json's resolved.model_type), a tag. Deterministic: the same
    recipe, metrics and model type give the same text."""
    pipeline_tag = tasks.spec(recipe.task).pipeline_tag
    task_name = PIPELINE_NAMES.get(pipeline_tag) or pipeline_tag.replace("-", " ").title()
    scores = {k: v for k, v in metrics.get("eval", {}).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    dataset_type, dataset_name, split = _eval_dataset(recipe)
    results = [EvalResult(task_type=pipeline_tag, task_name=task_name, dataset_type=dataset_type,
                          dataset_name=dataset_name, dataset_split=split, metric_type=k, metric_value=v)
               for k, v in scores.items()]
    sources = (recipe.data.train, recipe.data.eval or "")
    datasets = list(dict.fromkeys(d for d in map(hub_dataset_id, sources) if d))
    data = ModelCardData(
        base_model=hub_model_id(recipe.model.checkpoint),
        library_name="peft" if recipe.lora.enabled else "transformers", license=license,
        datasets=datasets or None, metrics=list(scores) or None, pipeline_tag=pipeline_tag,
        tags=_tags(recipe, metrics, model_type), model_name=recipe.name if results else None,
        eval_results=results or None)
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{_body(recipe, metrics)}"))


def _tags(recipe: Recipe, metrics: dict, model_type: str | None) -> list[str]:
    family = recipe.model.family or metrics.get("family")
    tags = ["hftoolkit", recipe.task, family, model_type]
    if recipe.lora.enabled:
        tags.append("qlora" if recipe.model.quantization == "4bit" else "lora")
    if recipe.model.quantization != "none":  # the base was loaded quantized for training
        tags.append(recipe.model.quantization.replace("bit", "-bit"))
    return [t for t in tags if t]


def _body(recipe: Recipe, metrics: dict) -> str:
    ckpt = recipe.model.checkpoint
    family = recipe.model.family or metrics.get("family")
    base = f"`{ckpt}` ({family}), quantization: {recipe.model.quantization}"
    if ckpt.startswith("init:"):
        base += f"; a tiny random model that `hftoolkit init-model {ckpt.removeprefix('init:')}` builds, not on the Hub"
    method = f"LoRA r={recipe.lora.r}, alpha={recipe.lora.alpha:g}" if recipe.lora.enabled else "full fine-tuning"
    if metrics.get("trainable_params") is not None and metrics.get("total_params") is not None:
        method += f"; trainable parameters {metrics['trainable_params']:,} of {metrics['total_params']:,}"
    data = f"`{recipe.data.train}`" + (f", eval `{recipe.data.eval}`" if recipe.data.eval else "")
    cost = "; ".join(part for part in (
        f"train time {metrics['train_seconds']:.1f} s" if metrics.get("train_seconds") is not None else None,
        f"peak memory {metrics['peak_memory_mb']} MB" if metrics.get("peak_memory_mb") is not None else None) if part)
    main = metrics.get("main_metric")
    rows = "\n".join(f"| {k}{' (main)' if k == main else ''} | {v:.4g} |" for k, v in metrics.get("eval", {}).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
    lines = [
        f"# {recipe.name}", "",
        recipe.description or f"{recipe.task} fine-tuned with hftoolkit.", "",
        f"- Base checkpoint: {base}",
        *([f"- Note: {advice}"] if (advice := tasks.advice(recipe.task, family)) else []),
        f"- Method: {method}",
        f"- Data: {data}; seed {recipe.training.seed}",
    ]
    if cost:
        lines.append(f"- {cost[0].upper()}{cost[1:]}")
    lines += ["", "| metric | value |", "|---|---|", rows, "",
              "Reproduce: `hftoolkit train recipe.yaml` (the resolved recipe beside this card).", ""]
    return "\n".join(lines)


def _eval_dataset(recipe: Recipe) -> tuple[str, str, str | None]:
    """(type, name, split) of the data the eval ran on, as data.load_data reads it."""
    d = recipe.data
    if d.eval:
        source, split, note = d.eval, d.train_split, ""
    elif d.eval_split:
        source, split, note = d.train, d.eval_split, ""
    else:
        source, split, note = d.train, d.train_split, f", {d.eval_fraction:.0%} held out (seed {recipe.training.seed})"
    if d.max_eval_samples:
        note += f", at most {d.max_eval_samples} examples"
    hub_id = hub_dataset_id(source)
    if hub_id:
        return hub_id, hub_id + note, split
    shown = source if source.startswith("builtin:") else Path(source).name
    return shown, shown + note, None


def hub_model_id(checkpoint: str) -> str | None:
    """The checkpoint when it names a model on the Hub: not init:, not a local folder or file; for an
    `installed:<name>` checkpoint, the Hub model its package copies."""
    from hftoolkit.sources.installed import CHECKPOINTS, installed_name

    if checkpoint.startswith("init:"):
        return None
    if installed_name(checkpoint) is not None:
        return next((c.hub_id for c in CHECKPOINTS if c.name == installed_name(checkpoint)), None)
    return _hub_id(checkpoint)


def hub_dataset_id(source: str) -> str | None:
    """The source when it names a data set on the Hub, read as data.py reads it: not builtin:, not local."""
    return None if source.startswith("builtin:") else _hub_id(source)


def _hub_id(text: str) -> str | None:
    from hftoolkit.sources.locations import is_hub_id

    if not is_hub_id(text) or text.lower().endswith(LOCAL_SUFFIXES) or Path(text).exists():
        return None
    return text


def check_card(text: str) -> ModelCardData:
    """Parse a card as huggingface_hub does, strictly, without the network; raises ValueError.

    Checks: the front matter is found by the Hub server's own regex (REGEX_YAML_BLOCK) at the top,
    is a YAML mapping, and loads into ModelCardData with ignore_metadata_errors off, which parses the
    model-index (model_index_to_eval_results: name, task.type, dataset.type and .name, metrics' type
    and value all present) and requires a model name for eval results; the base model and every data
    set are well-formed repo ids; and the card serializes back to the same text (nothing dropped).
    """
    match = REGEX_YAML_BLOCK.search(text)
    if not match or match.start() != 0:
        raise ValueError("model card: no YAML front matter at the top")
    card = ModelCard(text, ignore_metadata_errors=False)
    data = card.data
    for repo in _as_list(data.base_model) + _as_list(data.datasets):
        validate_repo_id(repo)
    if str(card) != text:
        raise ValueError("model card: the front matter does not serialize back to the same text")
    return data


def _as_list(value) -> list:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def _hub_validate(card: str) -> None:
    """The Hub's own metadata check (POST /api/validate-yaml), before the repository is created."""
    try:
        ModelCard(card).validate(repo_type="model")
    except ValueError as err:
        raise UserError(f"push: the Hub rejects the model card's metadata: {_first_line(err)}") from None


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What HfApi raises when the Hub can't be reached or refuses: OSError covers HfHubHTTPError and
    offline mode; HTTPError (from the HTTP client huggingface_hub uses) covers transport failures."""
    from huggingface_hub.errors import HTTPError

    return OSError, HTTPError


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
