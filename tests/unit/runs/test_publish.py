"""`push`: the files a run publishes, its model card's Hub metadata, refusals, and the upload calls.

Run directories are written by hand (no training); the Hub is never contacted: HfApi is replaced
by a recorder, and the one unmocked push runs with HF_HUB_OFFLINE set (conftest).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import ModelCard, constants
from huggingface_hub.repocard_data import model_index_to_eval_results

from hftoolkit.base.errors import UserError
from hftoolkit.config.recipe import recipe_to_yaml, validate_recipe
from hftoolkit.runs import publish
from hftoolkit.runs.card import check_card
from tests.helpers import run_cli

SENTINEL = "hf_SENTINELtoken0123456789abcdefABCDEF"
EVAL = {"loss": 0.3125, "accuracy": 0.9132653061224489, "f1": 0.9, "matthews_correlation": 0.0}
WEIGHT_FILES = ["adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "vocab.txt"]


def make_run(root: Path, name: str = "bert-sst2", checkpoint: str = "google-bert/bert-base-uncased",
             train: str = "stanfordnlp/sst2", lora: bool = True, quantization: str = "none",
             status: str = "complete", evaluation: dict | None = None, **data) -> Path:
    """A run directory as train writes it, with dummy weights and every file push must leave behind."""
    recipe = validate_recipe({
        "name": name, "task": "classification", "description": "SST-2 sentiment.",
        "model": {"checkpoint": checkpoint, "family": "encoder", "quantization": quantization},
        "lora": {"enabled": lora, "r": 4}, "data": {"train": train, **data}, "training": {"seed": 3}})
    run = root / name
    weights = run / ("adapter" if lora else "model")
    weights.mkdir(parents=True)
    (run / "recipe.yaml").write_text(recipe_to_yaml(recipe))
    (run / "manifest.json").write_text(json.dumps({"status": status, "command": "hftoolkit train /home/me/x.yaml"}))
    (run / "metrics.json").write_text(json.dumps({
        "name": name, "family": "encoder", "task": "classification", "checkpoint": checkpoint,
        "quantization": quantization, "lora_rank": 4 if lora else None, "main_metric": "accuracy",
        "greater_is_better": True, "eval": EVAL if evaluation is None else evaluation, "train_seconds": 12.5,
        "peak_memory_mb": 812.0, "trainable_params": 1234, "total_params": 110000000}))
    for junk in ("log_history.jsonl", "predictions.jsonl"):
        (run / junk).write_text('{"input": "private eval text"}\n')
    (run / "README.md").write_text("# old card without front matter\n")
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors").write_bytes(b"\0" * 8)
    (run / "checkpoints" / "checkpoint-2" / "optimizer.pt").write_bytes(b"\0" * 8)
    names = WEIGHT_FILES if lora else ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for file in names:
        (weights / file).write_bytes(b"{}" if file.endswith(".json") else b"\0" * 16)
    (weights / "README.md").write_text("---\nlibrary_name: peft\n---\n# peft's template card\n")
    (weights / "training_args.bin").write_bytes(b"pickle")
    (weights / ".partial.json").write_bytes(b"{")
    return run


@pytest.fixture
def hub(monkeypatch):
    """HfApi replaced by a recorder (the repository already exists with `private`); the Hub's metadata check too."""
    calls = SimpleNamespace(api_kwargs=None, create_repo=[], repo_info=[], commits=[], validated=[], private=True)

    class FakeApi:
        def __init__(self, **kwargs):
            calls.api_kwargs = kwargs

        def create_repo(self, repo_id, **kwargs):
            calls.create_repo.append((repo_id, kwargs))

        def repo_info(self, repo_id, **kwargs):
            calls.repo_info.append(repo_id)
            return SimpleNamespace(private=calls.private)

        def create_commit(self, repo_id, operations, **kwargs):
            calls.commits.append((repo_id, list(operations), kwargs))

    monkeypatch.setattr(publish, "HfApi", FakeApi)
    monkeypatch.setattr(ModelCard, "validate", lambda card, repo_type=None: calls.validated.append(str(card)))
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    return calls


def front_matter(card: str):
    return check_card(card)


# ---------------------------------------------------------------- what is uploaded


@pytest.mark.slow
def test_dry_run_lists_weights_tokenizer_recipe_metrics_and_card_only(tmp_path):
    run = make_run(tmp_path)
    files, card = publish.push(run, "alice/bert-sst2", dry_run=True)
    # The adapter's files at the root (where PeftModel.from_pretrained looks), with the run's recipe, metrics
    # and the new card: no checkpoints, predictions, logs, manifest, pickles, half-written or template files.
    assert files == sorted([*WEIGHT_FILES, "metrics.json", "recipe.yaml", "README.md"])
    assert card.startswith("---\n") and "# bert-sst2" in card
    assert (run / "README.md").read_text() == "# old card without front matter\n"  # the run is left as it was

    full = make_run(tmp_path, name="bert-full", lora=False)
    files, card = publish.push(full, "alice/bert-full", dry_run=True)
    assert files == ["README.md", "config.json", "metrics.json", "model.safetensors", "recipe.yaml",
                     "tokenizer.json", "tokenizer_config.json"]
    assert front_matter(card).library_name == "transformers"


# ---------------------------------------------------------------- the card


def test_card_front_matter_passes_huggingface_hub_parsing_with_the_run_metrics(tmp_path):
    run = make_run(tmp_path, eval="nyu-mll/glue", eval_split="validation")
    _, card = publish.push(run, "alice/bert-sst2", dry_run=True)
    data = front_matter(card)
    assert data.base_model == "google-bert/bert-base-uncased"
    assert data.library_name == "peft"
    assert data.datasets == ["stanfordnlp/sst2", "nyu-mll/glue"]
    assert data.pipeline_tag == "text-classification"
    assert data.metrics == list(EVAL)
    assert {"hftoolkit", "classification", "encoder", "lora"} <= set(data.tags)
    assert data.get("license") is None  # nothing in a run says which license applies
    # The model-index, read back by huggingface_hub's own parser: every eval value, exactly as in metrics.json.
    name, results = model_index_to_eval_results(ModelCard(card).data.to_dict()["model-index"])
    assert name == "bert-sst2"
    assert {r.metric_type: r.metric_value for r in results} == EVAL
    assert {(r.task_type, r.dataset_type, r.dataset_split) for r in results} == {
        ("text-classification", "nyu-mll/glue", "train")}
    # The body keeps what the card always said.
    for line in ("- Base checkpoint: `google-bert/bert-base-uncased` (encoder), quantization: none",
                 "- Method: LoRA r=4, alpha=16; trainable parameters 1,234 of 110,000,000",
                 "- Data: `stanfordnlp/sst2`, eval `nyu-mll/glue`; seed 3",
                 "- Train time 12.5 s; peak memory 812.0 MB", "| accuracy (main) | 0.9133 |",
                 "Reproduce: `hftoolkit train recipe.yaml`"):
        assert line in card


@pytest.mark.parametrize("checkpoint, train, quantization, tags", [
    ("init:bert", "builtin:sentiment", "none", {"bert", "lora"}),
    ("{local}", "data/train.csv", "4bit", {"qlora", "4-bit"}),
    ("models/bert", "../shared/data/sst2/train.tsv", "8bit", {"lora", "8-bit"}),  # relative folder that exists
    ("models/tiny.gguf", "corpus.jsonl", "none", {"lora"}),
])
def test_card_names_only_hub_ids_as_base_model_and_datasets(tmp_path, monkeypatch, checkpoint, train,
                                                              quantization, tags):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "bert").mkdir(parents=True)
    (tmp_path / "models" / "bert" / "config.json").write_text('{"model_type": "bert"}')
    run = make_run(tmp_path / "runs", checkpoint=checkpoint.replace("{local}", str(tmp_path / "models" / "bert")),
                   train=train, quantization=quantization)
    files, card = publish.push(run, "alice/x", dry_run=True)
    data = front_matter(card)
    assert data.get("base_model") is None and data.get("datasets") is None
    assert tags <= set(data.tags)
    _, results = model_index_to_eval_results(ModelCard(card).data.to_dict()["model-index"])
    assert {r.metric_type: r.metric_value for r in results} == EVAL  # scored on local data: still reported
    assert {r.dataset_type for r in results} == {Path(train).name}


def test_card_tags_the_model_type_the_run_resolved_also_for_a_hub_id(tmp_path):
    """A hub id's files are not at hand when the card is written; the run's manifest says what it resolved."""
    run = make_run(tmp_path)  # google-bert/bert-base-uncased, and a manifest from before `resolved` was recorded
    assert "bert" not in front_matter(publish.push(run, "alice/bert-sst2", dry_run=True)[1]).tags
    manifest = json.loads((run / "manifest.json").read_text())
    resolved = {"model_type": "bert", "family": "encoder"}
    (run / "manifest.json").write_text(json.dumps({**manifest, "resolved": resolved}))
    assert "bert" in front_matter(publish.push(run, "alice/bert-sst2", dry_run=True)[1]).tags


def test_card_is_deterministic_and_leaves_non_finite_values_out_of_the_model_index(tmp_path):
    run = make_run(tmp_path, evaluation={"loss": float("nan"), "accuracy": 0.5, "note": "text"})
    (_, first), (_, second) = (publish.push(run, "alice/x", dry_run=True) for _ in range(2))
    assert first == second
    data = front_matter(first)
    assert data.metrics == ["accuracy"]
    assert [(r.metric_type, r.metric_value) for r in data.eval_results] == [("accuracy", 0.5)]
    assert "| loss | nan |" in first  # the table still shows it


def test_check_card_fails_on_what_the_hub_would_reject():
    with pytest.raises(ValueError, match="front matter"):
        check_card("# a card without metadata\n")
    broken_index = ("---\nmodel-index:\n- name: x\n  results:\n  - task:\n      type: text-classification\n"
                    "    metrics:\n    - type: accuracy\n      value: 0.5\n---\n# x\n")  # no dataset
    with pytest.raises(ValueError, match="model_index"):
        check_card(broken_index)
    with pytest.raises(ValueError):
        check_card("---\nbase_model: not//an id\n---\n# x\n")
    with pytest.raises(ValueError, match="serialize back"):  # an empty value huggingface_hub would drop
        check_card("---\nlicense:\nlibrary_name: peft\n---\n# x\n")


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("damage, message", [
    (lambda run: (run / "manifest.json").write_text('{"status": "running"}'), "status is running"),
    (lambda run: (run / "manifest.json").write_text('{"status": "failed"}'), "status is failed"),
    (lambda run: (run / "manifest.json").unlink(), "status is missing"),
    (lambda run: (run / "metrics.json").unlink(), "no metrics.json"),
    (lambda run: (run / "recipe.yaml").unlink(), "not a run folder"),
    (lambda run: __import__("shutil").rmtree(run / "adapter"), "no adapter/ or model/ folder"),
    (lambda run: (run / "adapter" / "adapter_model.safetensors").unlink(), "no .safetensors weights"),
])
def test_incomplete_runs_are_refused_in_one_line(tmp_path, damage, message):
    run = make_run(tmp_path)
    damage(run)
    with pytest.raises(UserError, match=message) as err:
        publish.push(run, "alice/x", dry_run=True)
    assert "\n" not in err.value.message


@pytest.mark.parametrize("repo_id", ["alice/bert/sst2", "alice/bert--sst2", "-alice/x", "alice/x.git", ""])
def test_invalid_repo_ids_are_refused(tmp_path, repo_id):
    with pytest.raises(UserError, match="--repo-id: .*Use the form namespace/name") as err:
        publish.push(make_run(tmp_path), repo_id, dry_run=True)
    assert "\n" not in err.value.message and "repo_type" not in err.value.message


# ---------------------------------------------------------------- the upload


def test_push_creates_the_repo_and_uploads_exactly_the_dry_run_files_in_one_commit(tmp_path, hub, capsys, caplog):
    run = make_run(tmp_path)
    planned, card = publish.push(run, "alice/bert-sst2", dry_run=True)
    files, pushed_card = publish.push(run, "alice/bert-sst2", private=True)
    assert (files, pushed_card) == (planned, card)
    assert hub.api_kwargs == {"token": SENTINEL}
    assert hub.validated == [card]  # the Hub's own metadata check ran before anything was created
    assert hub.create_repo == [("alice/bert-sst2", {"repo_type": "model", "private": True, "exist_ok": True})]
    assert hub.repo_info == ["alice/bert-sst2"]  # private asked for: the existing repository is checked
    [(repo_id, operations, kwargs)] = hub.commits
    assert repo_id == "alice/bert-sst2" and kwargs["commit_message"] == "hftoolkit push: bert-sst2"
    assert sorted(op.path_in_repo for op in operations) == planned
    sources = {op.path_in_repo: op.path_or_fileobj for op in operations}
    assert sources["README.md"] == card.encode()
    assert sources["adapter_model.safetensors"] == str(run / "adapter" / "adapter_model.safetensors")
    assert sources["recipe.yaml"] == str(run / "recipe.yaml")
    # The token went to HfApi and nowhere else: not uploaded, not written into the run, not printed or logged.
    uploaded = b"".join(s if isinstance(s, bytes) else Path(s).read_bytes() for s in sources.values())
    written = b"".join(p.read_bytes() for p in run.rglob("*") if p.is_file())
    shown = capsys.readouterr()
    assert SENTINEL.encode() not in uploaded + written
    assert SENTINEL not in shown.out + shown.err + caplog.text


def test_public_push_skips_the_visibility_check_and_private_push_refuses_a_public_repo(tmp_path, hub):
    run = make_run(tmp_path)
    publish.push(run, "alice/x")
    assert hub.create_repo[0][1]["private"] is None and hub.repo_info == []  # the namespace's default applies
    hub.private = False
    with pytest.raises(UserError, match="already exists and is public"):
        publish.push(run, "alice/x", private=True)
    assert len(hub.commits) == 1  # only the first push committed


def test_push_without_a_token_is_refused_but_a_dry_run_needs_none(tmp_path, hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(publish, "get_token", lambda: None)  # no stored login either
    run = make_run(tmp_path)
    assert publish.push(run, "alice/x", dry_run=True)[0]
    with pytest.raises(UserError, match="no Hugging Face token: set HF_TOKEN") as err:
        publish.push(run, "alice/x")
    assert "\n" not in err.value.message
    assert hub.api_kwargs is None and hub.commits == []


def test_hub_metadata_rejection_is_one_line_and_nothing_is_created(tmp_path, hub, monkeypatch):
    def reject(card, repo_type=None):
        raise ValueError('"license" must be one of [apache-2.0, mit, ...]\nsecond line')

    monkeypatch.setattr(ModelCard, "validate", reject)
    with pytest.raises(UserError, match='rejects the model card.s metadata: "license" must be one of') as err:
        publish.push(make_run(tmp_path), "alice/x", license="not-a-license")
    assert "\n" not in err.value.message
    assert hub.create_repo == [] and hub.commits == []


@pytest.mark.skipif(not constants.HF_HUB_OFFLINE, reason="needs HF_HUB_OFFLINE=1 (conftest) to stay off the network")
def test_real_push_offline_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    with pytest.raises(UserError, match="could not upload to alice/x: .*offline mode is enabled") as err:
        publish.push(make_run(tmp_path), "alice/x")
    assert SENTINEL not in err.value.message and "\n" not in err.value.message


def test_license_goes_into_the_front_matter_only_when_given(tmp_path):
    run = make_run(tmp_path)
    assert front_matter(publish.push(run, "alice/x", dry_run=True, license="apache-2.0")[1]).license == "apache-2.0"


# ---------------------------------------------------------------- the command


def test_cli_dry_run_prints_the_files_then_the_card_and_never_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    run = make_run(tmp_path)
    out = run_cli("push", run, "--repo-id", "alice/bert-sst2", "--dry-run").output
    files, card = publish.push(run, "alice/bert-sst2", dry_run=True)
    assert out.index("adapter_model.safetensors") < out.index(card)
    assert all(f"  {name}\n" in out for name in files)
    assert SENTINEL not in out
    assert check_card(out[out.index("---\n"):]).base_model == "google-bert/bert-base-uncased"
    result = run_cli("push", run, "--repo-id", "alice/a/b", "--dry-run", expect=2)
    assert "--repo-id" in result.output
