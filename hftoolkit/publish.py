"""`push`: publish a finished run to the Hugging Face Hub, with a model card the Hub can read.

The card's front matter is `huggingface_hub.ModelCardData` (base model, library, data sets,
metrics with their values as a model-index, tags, pipeline tag), so the Hub links the base
model, lists the data sets and shows the eval results. It is rebuilt from recipe.yaml and
metrics.json at push time, so runs trained before front matter existed get it too.

The repository mirrors what `from_pretrained` expects at its root: the adapter (LoRA runs:
adapter_config.json, adapter_model.safetensors) or the model (config.json, *.safetensors),
the tokenizer or processor files, plus recipe.yaml, metrics.json and the card. Nothing else
of the run goes up: checkpoints/ (optimizer state), predictions.jsonl (eval inputs, which
belong to the data set's owner), log_history.jsonl, and manifest.json (the local command
line, paths and hardware; recipe.yaml is what reproduces the run).

The token is read from the environment (HF_TOKEN) or huggingface_hub's stored login and
handed to `HfApi` only; it is never printed or written.
"""

from __future__ import annotations

import math
from pathlib import Path

from huggingface_hub import CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData, get_token
from huggingface_hub.errors import HFValidationError
from huggingface_hub.repocard import REGEX_YAML_BLOCK
from huggingface_hub.utils import filter_repo_objects, validate_repo_id

from hftoolkit import tasks
from hftoolkit.errors import UserError
from hftoolkit.recipe import Recipe, load_recipe
from hftoolkit.rundir import RunDirectory

# hftoolkit task -> the Hub's pipeline tag and its display name (huggingface.js packages/tasks/src/pipelines.ts).
# The Hub's display names of the pipeline tags the task table uses (tasks.TaskSpec.pipeline_tag).
PIPELINE_NAMES = {
    "text-classification": "Text Classification", "token-classification": "Token Classification",
    "fill-mask": "Fill-Mask", "text-generation": "Text Generation", "translation": "Translation",
    "summarization": "Summarization", "text2text-generation": "Text2Text Generation",
    "image-classification": "Image Classification",
}
# Files of adapter/ or model/ that go to the repository's root: weights (safetensors only), configs,
# tokenizer vocabularies and chat templates; never hidden files. Not peft's template README.md (our card
# replaces it) nor a pickled training_args.bin.
WEIGHT_PATTERNS = ["*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
WEIGHT_IGNORED = [".*", "*/.*"]
RUN_FILES = ["recipe.yaml", "metrics.json"]  # from the run's root; README.md is the card built here
# Sources that are local files, never hub ids: what data.py reads as files, and single-file checkpoints.
LOCAL_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet", ".txt", ".gz", ".gguf", ".safetensors")


def push(run_dir: Path, repo_id: str, private: bool = False, dry_run: bool = False,
         license: str | None = None) -> tuple[list[str], str]:
    """Upload a complete run to the model repository `repo_id` in one commit; returns the paths it holds
    (or would hold, with dry_run) and the card. The repository is created when missing; `private` refuses
    an existing public one rather than publish into it. Files already in the repository that this run does
    not have stay there (a repository may hold more than one push)."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        rule = str(err).removesuffix(" Use `repo_type` argument if needed.")  # a library argument, not ours
        raise UserError(f"--repo-id: {rule} Use the form namespace/name, for example alice/bert-sst2") from None
    run = RunDirectory(run_dir)
    recipe, metrics = _read_complete_run(run)
    card = model_card(recipe, metrics, license=license)
    check_card(card)
    uploads = upload_plan(run, recipe)
    files = sorted([*uploads, "README.md"])
    if dry_run:
        return files, card
    token = get_token()
    if not token:
        raise UserError("push: no Hugging Face token: set HF_TOKEN or run `hf auth login`, then push again")
    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local)) for path, local in uploads.items()]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode("utf-8")))
    api = HfApi(token=token)
    try:
        _hub_validate(card)
        # Without --private the namespace's default applies (public, unless an organization defaults to private).
        api.create_repo(repo_id, repo_type="model", private=private or None, exist_ok=True)
        if private and not api.repo_info(repo_id, repo_type="model").private:
            raise UserError(f"--private: {repo_id} already exists and is public, so the run would be public: "
                            "make the repository private on the Hub first, or push without --private")
        api.create_commit(repo_id, operations, repo_type="model",
                          commit_message=f"hftoolkit push: {recipe.name}")
    except _hub_errors() as err:
        raise UserError(f"push: could not upload to {repo_id}: {_first_line(err)}") from None
    return files, card


def _read_complete_run(run: RunDirectory) -> tuple[Recipe, dict]:
    if not (run / "recipe.yaml").is_file():
        raise UserError(f"{run.path}: not a run directory (no recipe.yaml): pass a folder written by hftoolkit train")
    status = run.manifest().get("status")
    if status != "complete":
        raise UserError(f"{run.path}: the run's status is {status or 'missing'} in manifest.json, not complete: "
                        f"push a finished run, or finish this one with `hftoolkit train --resume {run.path}`")
    if not (run / "metrics.json").is_file():
        raise UserError(f"{run.path}: no metrics.json, so there are no results to publish: "
                        "score it with `hftoolkit eval`")
    return load_recipe(run / "recipe.yaml"), run.metrics()


def upload_plan(run: RunDirectory, recipe: Recipe) -> dict[str, Path]:
    """{path in the repository: local file}: the weights folder's files at the root, and RUN_FILES."""
    folder = run / ("adapter" if recipe.lora.enabled else "model")
    if not folder.is_dir():
        method = "trains LoRA" if recipe.lora.enabled else "fine-tunes the whole model"
        raise UserError(f"{run.path}: no {folder.name}/ folder (the recipe {method}), so the run has no weights "
                        "to publish: train it again")
    found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    plan = {name: folder / name
            for name in filter_repo_objects(found, allow_patterns=WEIGHT_PATTERNS, ignore_patterns=WEIGHT_IGNORED)}
    if not any(name.endswith(".safetensors") for name in plan):
        raise UserError(f"{folder}: no .safetensors weights, so the run has nothing to publish: train it again")
    plan.update({name: run / name for name in RUN_FILES})
    return plan


# ---------------------------------------------------------------- the card


def model_card(recipe: Recipe, metrics: dict, license: str | None = None) -> str:
    """The run's README.md: Hub front matter, then what the run was and how it scored. Deterministic:
    the same recipe and metrics give the same text."""
    pipeline_tag = tasks.spec(recipe.task).pipeline_tag
    task_name = PIPELINE_NAMES[pipeline_tag]
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
        tags=_tags(recipe, metrics), model_name=recipe.name if results else None, eval_results=results or None)
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{_body(recipe, metrics)}"))


def _tags(recipe: Recipe, metrics: dict) -> list[str]:
    tags = ["hftoolkit", recipe.task, recipe.family or metrics.get("family"), recipe.model_type]
    if recipe.lora.enabled:
        tags.append("qlora" if recipe.model.quantization == "4bit" else "lora")
    if recipe.model.quantization != "none":  # the base was loaded quantized for training
        tags.append(recipe.model.quantization.replace("bit", "-bit"))
    return [t for t in tags if t]


def _body(recipe: Recipe, metrics: dict) -> str:
    ckpt = recipe.model.checkpoint
    base = f"`{ckpt}` ({recipe.family or metrics.get('family')}), quantization: {recipe.model.quantization}"
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
        *([f"- Note: {recipe.advice}"] if recipe.advice else []),
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
    """The checkpoint when it names a model on the Hub: not init:, not a local folder or file."""
    return None if checkpoint.startswith("init:") else _hub_id(checkpoint)


def hub_dataset_id(source: str) -> str | None:
    """The source when it names a data set on the Hub, read as data.py reads it: not builtin:, not local."""
    return None if source.startswith("builtin:") else _hub_id(source)


def _hub_id(text: str) -> str | None:
    if not text or text.startswith((".", "/", "~")) or text.lower().endswith(LOCAL_SUFFIXES) or Path(text).exists():
        return None
    try:
        validate_repo_id(text)
    except HFValidationError:
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


# ---------------------------------------------------------------- the Hub


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

