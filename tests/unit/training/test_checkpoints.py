"""Atomic checkpoints: a checkpoint folder is complete or absent, and retention keeps the newest.

These drive hftoolkit.training.checkpoints directly on small folders; the kill during a real save
and the exact resume after it are in tests/e2e/test_resume.py.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hftoolkit.base.errors import UserError
from hftoolkit.training import checkpoints


def _checkpoint(folder, step: int, complete: bool = True):
    """A folder shaped like checkpoint-<step>: weights, optimizer state and (when complete) the trainer state."""
    import torch
    from safetensors.torch import save_file

    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_file({"lora_A": torch.full((4, 2), float(step))}, str(path / "adapter_model.safetensors"))
    torch.save({"state": {0: {"step": torch.tensor(step)}}}, path / "optimizer.pt")
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def test_commit_fsyncs_every_file_and_folder_before_the_rename(tmp_path, monkeypatch):
    staged = _checkpoint(tmp_path / ".tmp-checkpoint-3", 3)
    (staged / "nested").mkdir()
    (staged / "nested" / "tokenizer.json").write_text("{}")
    events = []
    monkeypatch.setattr(checkpoints, "_fsync", lambda path: events.append(("fsync", path)))
    real_rename = os.rename
    monkeypatch.setattr(checkpoints.os, "rename", lambda a, b: (events.append(("rename", a)), real_rename(a, b)))
    final = tmp_path / "checkpoint-3"
    checkpoints.commit(staged, final)

    renamed_at = events.index(("rename", staged))
    synced_before = {path for kind, path in events[:renamed_at] if kind == "fsync"}
    expected = {staged / p.relative_to(final) for p in final.rglob("*")} | {staged}
    assert len(expected) == 6 and expected <= synced_before, sorted(map(str, expected - synced_before))
    assert ("fsync", tmp_path) in events[renamed_at:], "the parent folder is fsynced after the rename"
    assert not staged.exists() and (final / "nested" / "tokenizer.json").is_file()


def test_a_staged_checkpoint_is_invisible_until_committed(tmp_path):
    _checkpoint(tmp_path, 2)
    staging = tmp_path / ".tmp-checkpoint-4"
    staged = _checkpoint(staging, 4)  # a kill here leaves only the hidden folder
    assert checkpoints.latest_checkpoint(tmp_path).name == "checkpoint-2"
    checkpoints.commit(staged, tmp_path / "checkpoint-4")
    assert checkpoints.latest_checkpoint(tmp_path).name == "checkpoint-4"
    checkpoints.remove_staging(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_a_checkpoint_without_its_trainer_state_is_never_chosen(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, complete=False)
    assert checkpoints.latest_checkpoint(tmp_path).name == "checkpoint-2"


def test_retention_goes_by_step_number_and_keeps_the_newest(tmp_path):
    for step in (2, 4, 10, 12):  # "10" sorts before "4" as text: retention must compare numbers
        _checkpoint(tmp_path, step)
    (tmp_path / ".tmp-checkpoint-14").mkdir()
    deleted = checkpoints.rotate(tmp_path, keep_last=2)
    assert [p.name for p in deleted] == ["checkpoint-2", "checkpoint-4"]
    assert [p.name for p in checkpoints.complete_checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-12"]
    assert checkpoints.rotate(tmp_path, keep_last=0) == [tmp_path / "checkpoint-10"], "never the newest one"
    assert checkpoints.latest_checkpoint(tmp_path).name == "checkpoint-12"


def test_a_kill_during_retention_never_leaves_a_partial_checkpoint(tmp_path, monkeypatch):
    for step in (2, 4):
        _checkpoint(tmp_path, step)

    def killed_midway(path, ignore_errors=False):
        next(p for p in sorted(path.iterdir()) if p.is_file()).unlink()  # one file gone, then the "kill"
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.rotate(tmp_path, keep_last=1)
    monkeypatch.undo()
    assert [p.name for p in checkpoints.complete_checkpoints(tmp_path)] == ["checkpoint-4"]
    assert not (tmp_path / "checkpoint-2").exists(), "the half-deleted one is hidden, not left as checkpoint-2"


def test_saving_the_same_step_again_replaces_the_checkpoint_whole(tmp_path):
    _checkpoint(tmp_path, 6)
    (tmp_path / "checkpoint-6" / "stale.json").write_text("{}")
    staged = _checkpoint(tmp_path / ".tmp-checkpoint-6", 6)
    checkpoints.commit(staged, tmp_path / "checkpoint-6")
    assert not (tmp_path / "checkpoint-6" / "stale.json").exists()
    assert checkpoints.complete_checkpoints(tmp_path) == [tmp_path / "checkpoint-6"]
    assert not list(tmp_path.glob(".tmp-delete-*")), "the replaced one is gone"


@pytest.mark.parametrize("damage, named", [
    (lambda c: (c / "adapter_model.safetensors").write_bytes((c / "adapter_model.safetensors").read_bytes()[:-3]),
     "adapter_model.safetensors is damaged"),
    (lambda c: (c / "adapter_model.safetensors").write_bytes(b"\x05"), "adapter_model.safetensors is damaged"),
    (lambda c: (c / "optimizer.pt").write_bytes((c / "optimizer.pt").read_bytes()[:100]), "optimizer.pt is damaged"),
    (lambda c: (c / "trainer_state.json").write_text('{"global_step": '), "trainer_state.json is damaged"),
])
def test_a_damaged_checkpoint_is_named_with_the_fix(tmp_path, damage, named):
    path = _checkpoint(tmp_path, 8)
    checkpoints.check_checkpoint(path)  # whole: no complaint
    damage(path)
    with pytest.raises(UserError) as caught:
        checkpoints.check_checkpoint(path)
    assert named in str(caught.value) and "delete checkpoint-8 to resume from the checkpoint before it" in str(
        caught.value)


def test_resume_clears_a_previous_attempts_results_but_keeps_its_checkpoints(tmp_path):
    from hftoolkit.runs.rundir import RunDirectory

    run = RunDirectory(tmp_path)
    _checkpoint(tmp_path / "checkpoints", 2)
    (tmp_path / "checkpoints" / ".tmp-checkpoint-4").mkdir()
    for name in ("metrics.json", "predictions.jsonl", "README.md", "log_history.jsonl"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "adapter").mkdir()
    checkpoints.clear_results(run)
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.parent.name != "checkpoint-2")
    assert left == ["checkpoints", "checkpoints/checkpoint-2", "log_history.jsonl"]
    shutil.rmtree(tmp_path / "checkpoints")


def test_resume_accepts_changes_around_the_steps_and_refuses_changes_to_them(tmp_path):
    import yaml

    from hftoolkit.config.recipe import load_recipe, recipe_to_yaml
    from hftoolkit.runs.rundir import RunDirectory
    from tests.helpers import RECIPES

    recipe = RECIPES / "encoder-classification.yaml"
    run = RunDirectory(tmp_path)
    (tmp_path / "recipe.yaml").write_text(recipe_to_yaml(load_recipe(recipe)))
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "failed"}))
    newest = _checkpoint(tmp_path / "checkpoints", 4)
    around = load_recipe(recipe, ["training.on_nonfinite=skip", "training.save_steps=8", "eval.max_predictions=3"])
    assert checkpoints.resume_point(run, recipe_to_yaml(around)) == newest
    for change in ("training.learning_rate=0.02", "training.seed=1", "data.max_length=32", "lora.r=4"):
        with pytest.raises(UserError, match="the recipe differs") as caught:
            checkpoints.resume_point(run, recipe_to_yaml(load_recipe(recipe, [change])))
        assert change.split("=")[0] in str(caught.value)
    assert yaml.safe_load((tmp_path / "recipe.yaml").read_text())["training"]["on_nonfinite"] == "stop"


def test_resume_of_a_run_whose_only_eval_failed_points_at_hftoolkit_eval(tmp_path):
    from hftoolkit.runs.rundir import TRAINED_EVAL_FAILED, RunDirectory

    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    run.write_json("manifest.json", {"status": TRAINED_EVAL_FAILED})
    with pytest.raises(UserError, match=f"run `hftoolkit eval {run.path}` to complete it"):
        checkpoints.resume_point(run, "name: run\n")
