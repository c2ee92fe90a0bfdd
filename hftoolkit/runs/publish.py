"""`push`: publish a finished run to the Hugging Face Hub, with a model card the Hub can read.

The repository holds what `from_pretrained` expects at its root, recipe.yaml, metrics.json and the card. The
token is read from the environment (HF_TOKEN) or huggingface_hub's stored login and handed to `HfApi` only; it
is never printed or written.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, get_token
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import filter_repo_objects, validate_repo_id

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import METRICS, RECIPE
from hftoolkit.runs.card import _first_line, _hub_errors, _hub_validate, check_card, model_card
from hftoolkit.runs.rundir import FinishedRun, open_run

# Files of adapter/ or model/ that go to the repository's root: weights (safetensors only), configs,
# tokenizer vocabularies and chat templates; never hidden files. Not peft's template README.md (our card
# replaces it) nor a pickled training_args.bin.
WEIGHT_PATTERNS = ["*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
WEIGHT_IGNORED = [".*", "*/.*"]
RUN_FILES = [RECIPE, METRICS]  # from the run's root; README.md is the card built here


def push(run_dir: Path, repo_id: str, private: bool = False, dry_run: bool = False,
         license: str | None = None) -> tuple[list[str], str]:
    """Upload a complete run to the model repository `repo_id` in one commit; returns the paths it holds
    (or would hold, with dry_run) and the card. The repository is created when missing; `private` refuses
    an existing public one rather than publish into it. Files already in the repository that this run does
    not have stay there (a repository may hold more than one push).

    The card is rebuilt from recipe.yaml and metrics.json at push time, so runs trained before front matter
    existed get it too. Its front matter (`huggingface_hub.ModelCardData`: base model, library, data sets,
    metrics with their values as a model-index, tags, pipeline tag) lets the Hub link the base model, list the
    data sets and show the eval results."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        rule = str(err).removesuffix(" Use `repo_type` argument if needed.")  # a library argument, not ours
        raise UserError(f"--repo-id: {rule} Use the form namespace/name, for example alice/bert-sst2") from None
    opened, metrics = _read_complete_run(run_dir)
    card = model_card(opened.recipe, metrics, license=license, model_type=resolved_model_type(opened))
    check_card(card)
    uploads = upload_plan(opened)
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
                          commit_message=f"hftoolkit push: {opened.recipe.name}")
    except _hub_errors() as err:
        raise UserError(f"push: could not upload to {repo_id}: {_first_line(err)}") from None
    return files, card


def resolved_model_type(opened: FinishedRun) -> str | None:
    """The model type the run resolved (manifest.json's resolved.model_type); for a run written before the manifest
    said it, what its checkpoint's files say (None for a hub id)."""
    resolved = opened.directory.manifest().get("resolved")
    if resolved is not None:
        return resolved.get("model_type")
    from hftoolkit.sources.checkpoint import model_type_of

    return model_type_of(opened.recipe.model.checkpoint, opened.recipe.model.gguf_file)


def _read_complete_run(run_dir: Path) -> tuple[FinishedRun, dict]:
    opened = open_run(run_dir)
    run = opened.directory
    status = run.manifest().get("status")
    if status != "complete":
        raise UserError(f"{run.path}: the run's status is {status or 'missing'} in manifest.json, not complete: "
                        f"push a finished run, or finish this one with `hftoolkit train --resume {run.path}`")
    if not (run / METRICS).is_file():
        raise UserError(f"{run.path}: no metrics.json, so there are no results to publish: "
                        "score it with `hftoolkit eval`")
    return opened, run.metrics()


def upload_plan(opened: FinishedRun) -> dict[str, Path]:
    """{path in the repository: local file}: the weights folder's files at the root, and RUN_FILES.

    The root is what `from_pretrained` expects: the adapter (LoRA runs: adapter_config.json,
    adapter_model.safetensors) or the model (config.json, *.safetensors), and the tokenizer or processor files.
    Nothing else of the run goes up: checkpoints/ (optimizer state), predictions.jsonl (eval inputs, which belong
    to the data set's owner), log_history.jsonl, and manifest.json (the local command line, paths and hardware;
    recipe.yaml is what reproduces the run)."""
    run, folder = opened.directory, opened.weights
    found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    plan = {name: folder / name
            for name in filter_repo_objects(found, allow_patterns=WEIGHT_PATTERNS, ignore_patterns=WEIGHT_IGNORED)}
    if not any(name.endswith(".safetensors") for name in plan):
        raise UserError(f"{folder}: no .safetensors weights, so the run has nothing to publish: train it again")
    plan.update({name: run / name for name in RUN_FILES})
    return plan


# ---------------------------------------------------------------- the card


# ---------------------------------------------------------------- the Hub


