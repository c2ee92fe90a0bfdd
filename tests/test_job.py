"""One job, resolved once: the recipe is frozen after validation, a run loads each checkpoint's config once and
locates the checkpoint once, and a run directory written before the job existed still loads."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from hftoolkit.config.recipe import load_recipe, replaced
from tests.conftest import run_cli

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
OLD_RUN = Path(__file__).resolve().parent / "fixtures" / "run-before-job"


def test_a_validated_recipe_cannot_be_changed_and_replaced_gives_a_new_one():
    recipe = load_recipe(RECIPES / "encoder-classification.yaml")
    with pytest.raises(ValidationError, match="frozen"):
        recipe.data.max_length = 8
    with pytest.raises(ValidationError, match="frozen"):
        recipe.model = recipe.model
    shorter = replaced(recipe, {"data.max_length": 8})
    assert shorter.data.max_length == 8 and recipe.data.max_length != 8
    with pytest.raises(Exception, match="data.max_length"):  # the copy is validated like the original
        replaced(recipe, {"data.max_length": -1})


@pytest.fixture
def counted(monkeypatch):
    """Counts of AutoConfig.from_pretrained per path, and of checkpoint resolutions (hub, GGUF, init:)."""
    from transformers import AutoConfig

    from hftoolkit.sources import checkpoint

    configs, located = Counter(), Counter()
    load_config, locate = AutoConfig.from_pretrained.__func__, checkpoint.resolve_checkpoint

    def counting_config(cls, path, *args, **kwargs):
        configs[str(path)] += 1
        return load_config(cls, path, *args, **kwargs)

    def counting_locate(recipe):
        located[recipe.model.checkpoint] += 1
        return locate(recipe)

    monkeypatch.setattr(AutoConfig, "from_pretrained", classmethod(counting_config))
    monkeypatch.setattr(checkpoint, "resolve_checkpoint", counting_locate)
    return configs, located


@pytest.mark.parametrize("recipe, sets", [
    ("encoder-classification.yaml", []),
    ("seq2seq-translation-t5.yaml", ["data.max_eval_samples=4", "eval.generation.max_new_tokens=4"]),
    ("vision-classification.yaml", []),
])
def test_train_and_eval_load_each_config_once_and_locate_the_checkpoint_once(tmp_path, counted, recipe, sets):
    configs, located = counted
    run = tmp_path / "run"
    run_cli("train", RECIPES / recipe, "--output", run, "--set", "training.max_steps=2",
            *[a for s in sets for a in ("--set", s)])
    assert list(configs.values()) == [1], configs  # one checkpoint, its config loaded once
    assert list(located.values()) == [1], located
    configs.clear()
    located.clear()
    run_cli("eval", run)
    assert list(configs.values()) == [1], configs  # the base's config, once; the run's tokenizer beside it
    assert list(located.values()) == [1], located


def test_a_run_s_files_follow_the_user_s_umask(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        run_cli("train", RECIPES / "encoder-classification.yaml", "--output", tmp_path / "run",
                "--set", "training.max_steps=2", "--set", "training.save_steps=1")
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files) and any(p.name == "metrics.json" for p in files)
    private = [str(p.relative_to(tmp_path)) for p in files if stat.S_IMODE(p.stat().st_mode) != 0o644]
    assert not private, private


def test_a_run_directory_written_before_the_job_existed_still_evaluates_and_predicts(tmp_path):
    run = tmp_path / "old-run"
    shutil.copytree(OLD_RUN, run)
    recorded = json.loads((run / "metrics.json").read_text())
    result = run_cli("eval", run, "--json")
    assert json.loads(result.stdout)["eval"]["accuracy"] == pytest.approx(recorded["eval"]["accuracy"])
    assert (run / "predictions.jsonl").is_file()
    given, out = tmp_path / "reviews.txt", tmp_path / "predictions.jsonl"
    given.write_text("a wonderful film\n")
    run_cli("predict", run, "--input", given, "--format", "jsonl", "--output", out)
    assert json.loads(out.read_text().splitlines()[0])["label"] in ("negative", "positive")
    listed = json.loads(run_cli("runs", tmp_path, "--json").stdout)
    assert [Path(r["path"]).name for r in listed] == ["old-run"] and listed[0]["status"] == "complete"
