"""Output and security: what the toolkit loads, what it runs, what it writes, and what it never overwrites.

- torch.load only with weights_only=True, no pickle, YAML only through safe_load (read from the source);
- a YAML tag that would run code is refused and does not run;
- trust_remote_code stays off unless the recipe sets it with a pinned revision;
- weights are written only as safetensors, and every other binary state in a run loads with weights_only=True;
- a non-empty run directory survives a refused command; --overwrite replaces it.
"""

from __future__ import annotations

import ast
import json

import pytest

from hftoolkit.config.recipe import RecipeError, load_recipe
from tests.helpers import RECIPES, ROOT, plain, run_cli, train_recipe

RECIPE = RECIPES / "encoder-classification.yaml"
SOURCES = sorted((ROOT / "hftoolkit").rglob("*.py"))


def _calls(attribute: str):
    """(file:line, call) for every call of `<something>.<attribute>(...)` in the package."""
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attribute:
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node


def _receiver(call: ast.Call) -> str:
    return ast.unparse(call.func.value)


def test_the_source_scan_sees_the_package():
    assert len(SOURCES) > 20 and any(_receiver(c) == "yaml" for _, c in _calls("safe_load"))


def test_torch_load_is_only_called_with_weights_only_true():
    unsafe = [where for where, call in _calls("load") if _receiver(call) == "torch"
              and not any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                          for k in call.keywords)]
    assert unsafe == [], f"torch.load without weights_only=True at {unsafe}"
    pickles = [where for name in ("load", "loads", "Unpickler") for where, call in _calls(name)
               if _receiver(call) in ("pickle", "cPickle", "dill", "joblib")]
    assert pickles == []


def test_yaml_is_only_read_through_safe_load():
    unsafe = [where for name in ("load", "load_all", "full_load", "full_load_all", "unsafe_load", "unsafe_load_all")
              for where, call in _calls(name) if _receiver(call) == "yaml"]
    assert unsafe == [], f"yaml read without safe_load at {unsafe}"
    loaders = [f"{p.relative_to(ROOT)}" for p in SOURCES
               if any(name in p.read_text() for name in ("yaml.Loader", "UnsafeLoader", "FullLoader", "yaml.CLoader"))]
    assert loaders == []


def test_trust_remote_code_is_never_switched_on_in_the_source():
    literal = [where for name in ("from_pretrained", "from_config") for where, call in _calls(name)
               for k in call.keywords if k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant)
               and k.value.value is True]
    assert literal == []


def test_a_yaml_tag_that_would_run_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    for tag in ("!!python/object/apply:os.system", "!!python/object/new:os.system"):
        recipe = tmp_path / "evil.yaml"
        recipe.write_text(RECIPE.read_text().replace("name: encoder-classification",
                                                     f"name: {tag} ['touch {marker}']"))
        with pytest.raises(RecipeError, match="YAML syntax error"):
            load_recipe(recipe)
        result = run_cli("train", recipe, "--set", f"name={tag} ['touch {marker}']", "--output", tmp_path / "run",
                         expect=2)
        assert "YAML syntax error" in plain(result.output)
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_remote_code_needs_a_pinned_revision_and_is_off_by_default():
    assert load_recipe(RECIPE).model.trust_remote_code is False
    with pytest.raises(RecipeError, match="set model.revision to a pinned commit"):
        load_recipe(RECIPE, ["model.trust_remote_code=true"])
    pinned = load_recipe(RECIPE, ["model.trust_remote_code=true", "model.revision=0123abcd"])
    assert pinned.model.trust_remote_code and pinned.model.revision == "0123abcd"


@pytest.fixture(scope="session")
def checkpointed_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("security") / "run"
    train_recipe(RECIPE, run, "data.max_train_samples=16", "data.max_eval_samples=8", "training.batch_size=8",
                 "training.max_steps=2", "training.save_steps=1", "eval.max_predictions=2")
    return run


def test_weights_are_safetensors_and_every_other_state_loads_with_weights_only(checkpointed_run):
    import torch
    from safetensors.torch import load_file

    files = [p for p in checkpointed_run.rglob("*") if p.is_file()]
    assert len(list(checkpointed_run.glob("checkpoints/checkpoint-*"))) == 2
    weights = [p for p in files if p.suffix == ".safetensors"]
    assert {p.parent.name for p in weights} == {"adapter", "checkpoint-1", "checkpoint-2"}
    assert all(load_file(p) for p in weights)
    binary = [p for p in files if p.suffix not in (".safetensors", ".json", ".jsonl", ".yaml", ".md", ".txt", ".log")]
    assert binary and {p.suffix for p in binary} <= {".pt", ".pth"}, sorted(map(str, binary))
    from transformers.trainer_pt_utils import safe_globals  # numpy arrays (the RNG state), as the Trainer allows

    for path in binary:  # optimizer, scheduler and RNG states: tensors, arrays and plain values, no pickled objects
        with safe_globals():
            torch.load(path, weights_only=True)
    assert not list(checkpointed_run.rglob("training_args.bin")), "the pickled TrainingArguments are not kept"


def test_a_refused_run_leaves_the_existing_run_directory_alone(checkpointed_run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(checkpointed_run, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    result = run_cli("train", RECIPE, "--output", copy, expect=2)
    assert "is not empty: pass --overwrite to replace it, --resume to continue it" in plain(result.output)
    result = run_cli("train", RECIPE, "--output", copy, "--overwrite", "--set", "training.batch_size=0", expect=2)
    assert "training.batch_size" in plain(result.output)
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_overwrite_replaces_the_run_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "old-notes.txt").write_text("from an earlier run")
    sets = ("data.max_train_samples=16", "data.max_eval_samples=8", "training.batch_size=8", "training.max_steps=1",
            "eval.max_predictions=0")
    run_cli("train", RECIPE, "--output", run, "--overwrite", *[x for s in sets for x in ("--set", s)])
    assert not (run / "old-notes.txt").exists()
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
