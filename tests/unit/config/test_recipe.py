"""Recipe validation: good recipes pass, every problem of a bad one is reported with its path."""

from __future__ import annotations

import pytest
import yaml

from hftoolkit.config import tasks
from hftoolkit.config.families import static_family
from hftoolkit.config.recipe import RecipeError, load_recipe, validate_recipe
from hftoolkit.job.resolve import resolve_job
from tests.helpers import RECIPES, plain, run_cli

GOOD = {
    "name": "t", "task": "classification",
    "model": {"checkpoint": "init:bert"},
    "data": {"train": "builtin:sentiment"},
}


def advice(recipe):
    """The course's advice `hftoolkit validate` prints for a recipe whose family is known without loading."""
    return tasks.advice(recipe.task, static_family(recipe.model.checkpoint, recipe.model.family))


def write(tmp_path, data, name="r.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


# Every recipe, found by glob so none is forgotten; launcher configs have their own test file. Nothing else lives
# under recipes/ (the benchmark tasks are package data: hftoolkit/evaluation/harness_tasks/).
SHIPPED = sorted(p for p in RECIPES.rglob("*.yaml") if "accelerate" not in p.relative_to(RECIPES).parts)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_recipe_validates(path):
    recipe = load_recipe(path)
    first = path.read_text().splitlines()[0]
    assert first.startswith("# hftoolkit train recipes/"), f"{path.name} must open with the command that runs it"
    assert recipe.description, f"{path.name} needs a description for `hftoolkit recipes`"


def test_defaults_fill_in(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD))
    assert recipe.lora.enabled and recipe.lora.targets == "auto"
    assert recipe.training.sampling == "random"
    assert static_family(recipe.model.checkpoint, recipe.model.family) == "encoder"


def test_unknown_keys_get_suggestions_and_all_errors_come_at_once(tmp_path):
    raw = {**GOOD, "model": {"checkpoint": "init:bert", "quantisation": "8bit"},
           "data": {"train": "x.csv", "max_lenght": 64}, "training": {"batch_size": 0, "epochs": "many"}}
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, raw))
    text = str(err.value)
    assert len(err.value.problems) == 4
    assert "r.yaml: model.quantisation: unknown key: did you mean 'quantization'?" in text
    assert "data.max_lenght: unknown key: did you mean 'max_length'?" in text
    assert "training.batch_size: input should be greater than 0" in text
    assert "training.epochs" in text and '"many"' in text


def test_unknown_key_without_close_match_lists_known_keys():
    with pytest.raises(RecipeError) as err:
        validate_recipe({**GOOD, "lora": {"zzz": 1}})
    assert "known keys: enabled, r, alpha, dropout, targets" in str(err.value)


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "name: x\ntask: classification\nmodel: [unclosed\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "line 4" in str(err.value) or "line 3" in str(err.value)
    assert "YAML syntax error" in str(err.value)


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="a recipe is a YAML mapping"):
        load_recipe(write(tmp_path, "- a\n- b\n"))


def test_overrides_are_parsed_as_yaml_and_validated(tmp_path):
    path = write(tmp_path, GOOD)
    recipe = load_recipe(path, ["training.epochs=3", "lora.targets=[query, key]", "model.quantization=8bit"])
    assert recipe.training.epochs == 3
    assert recipe.lora.targets == ["query", "key"]
    assert recipe.model.quantization == "8bit"
    with pytest.raises(RecipeError) as err:
        load_recipe(path, ["training.batch_sise=4", "training.learning_rate=-1"])
    text = str(err.value)
    assert "--set training.batch_sise=4: training.batch_sise: unknown key: did you mean 'batch_size'?" in text
    assert "--set training.learning_rate=-1: training.learning_rate" in text
    with pytest.raises(RecipeError, match="expected key=value"):
        load_recipe(path, ["training.epochs"])
    with pytest.raises(RecipeError, match="is not a section"):
        load_recipe(path, ["name.x=1"])


@pytest.mark.parametrize("task, families", [("clm", "a decoder"), ("translation", "a seq2seq or decoder"),
                                            ("image-classification", "a vision"), ("denoise", "a seq2seq")])
def test_a_task_without_a_head_in_the_family_names_the_families_that_have_one(task, families):
    with pytest.raises(RecipeError) as err:
        validate_recipe({**GOOD, "task": task})
    assert f"task {task!r} can't be done by 'init:bert', an encoder model" in str(err.value)
    assert f"use {families} checkpoint" in str(err.value)


@pytest.mark.parametrize("task, checkpoint", [
    ("classification", "init:gpt2"), ("classification", "init:bart"), ("classification", "init:t5"),
    ("tagging", "init:gpt2"), ("translation", "init:gpt2"), ("summarization", "init:gpt2"),
])
def test_other_families_with_a_head_are_accepted_with_the_course_advice(task, checkpoint):
    recipe = validate_recipe({**GOOD, "task": task, "model": {"checkpoint": checkpoint}})
    family = {"init:gpt2": "decoder", "init:bart": "seq2seq", "init:t5": "seq2seq"}[checkpoint]
    assert advice(recipe).startswith(f"task {task!r} on the {family} family: ")  # not "with a encoder"
    assert "the course recommends the" in advice(recipe)
    assert advice(validate_recipe(GOOD)) is None


def test_t5_fp16_and_remote_code_rules():
    t5 = {**GOOD, "task": "translation", "model": {"checkpoint": "init:t5"}, "training": {"precision": "fp16"}}
    with pytest.raises(RecipeError, match="bf16 or fp32"):  # refused once the checkpoint's model type is read
        resolve_job(validate_recipe(t5), data=False)
    with pytest.raises(RecipeError, match="pinned commit"):
        validate_recipe({**GOOD, "model": {"checkpoint": "org/model", "trust_remote_code": True}})
    ok = validate_recipe({**GOOD, "model": {"checkpoint": "org/model", "trust_remote_code": True,
                                           "revision": "0123abc"}})
    assert ok.model.trust_remote_code


def test_local_checkpoint_family_read_from_config(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(RecipeError, match="a decoder model") as err:  # refused once resolved
        resolve_job(validate_recipe({**GOOD, "task": "mlm", "model": {"checkpoint": str(tmp_path)}}), data=False)
    assert err.value.problems[0].startswith("model.checkpoint: task 'mlm' can't be done by")


def test_quantized_weights_need_lora_and_perplexity_tasks_refuse_label_smoothing():
    with pytest.raises(RecipeError, match="set lora.enabled to true"):
        validate_recipe({**GOOD, "model": {"checkpoint": "init:bert", "quantization": "8bit"},
                         "lora": {"enabled": False}})
    with pytest.raises(RecipeError, match="set training.label_smoothing to 0"):
        validate_recipe({**GOOD, "task": "mlm", "training": {"label_smoothing": 0.1}})


def test_override_text_with_a_colon_stays_text(tmp_path):
    path = write(tmp_path, GOOD)
    recipe = load_recipe(path, ["data.source_prefix=translate English to German: "])
    assert recipe.data.source_prefix == "translate English to German: "


HARNESS_LINE = ("{path}: an lm-evaluation-harness task file (task {task}), not a recipe: keep it in a folder of task "
                "files apart from the recipes, and pass that folder to `hftoolkit eval --benchmark-path` (or a "
                "recipe's eval.benchmarks.path)")


def test_validate_names_a_harness_task_file_or_a_launch_config_in_one_line(tmp_path):
    """Files of another kind passed to validate (`validate recipes/*/*.yaml`) are named for what they are, in one
    line each, instead of a YAML syntax error (`!function`) or a screen of unknown keys."""
    from hftoolkit.evaluation.harness import SHIPPED_TASKS

    hub_task = write(tmp_path, {"task": "my_arc", "dataset_path": "allenai/ai2_arc", "output_type": "multiple_choice",
                                "test_split": "test", "doc_to_text": "{{question}}"}, "arc.yaml")
    shipped = sorted(SHIPPED_TASKS.glob("*.yaml"))
    launch = RECIPES / "accelerate" / "ddp.yaml"
    typo = write(tmp_path, {**GOOD, "task": "clasification"}, "typo.yaml")  # a recipe still reads as one
    result = run_cli("validate", hub_task, *shipped, launch, typo, expect=2)
    errors = result.output.split("Error: ", 1)[1].splitlines()
    assert errors[:4] == [
        HARNESS_LINE.format(path=hub_task, task="my_arc"),
        HARNESS_LINE.format(path=shipped[0], task="hftoolkit_everyday_mc"),
        HARNESS_LINE.format(path=shipped[1], task="hftoolkit_sums_gen"),
        f"{launch}: an accelerate launch config, not a recipe: name it in a recipe's training.accelerate_config, "
        "or pass it to `hftoolkit train --accelerate-config`"]
    assert len(errors) == 5 and errors[4].startswith(f"{typo}: task: ") and "classification" in errors[4]


def test_recipes_lists_recipes_only(tmp_path, monkeypatch):
    from hftoolkit.config import shipped
    from hftoolkit.evaluation.harness import SHIPPED_TASKS

    folder = tmp_path / "recipes"
    (folder / "accelerate").mkdir(parents=True)
    write(folder, {**GOOD, "description": "a recipe"}, "r.yaml")
    (folder / "sums_gen.yaml").write_text((SHIPPED_TASKS / "sums_gen.yaml").read_text())  # `!function` inside
    (folder / "accelerate" / "ddp.yaml").write_text("distributed_type: MULTI_GPU\n")
    monkeypatch.setattr(shipped, "SHIPPED", folder)
    assert plain(run_cli("recipes").output) == "r a recipe"


def test_no_shipped_recipe_folder_holds_a_harness_task_file():
    from hftoolkit.evaluation.harness import harness_task_file

    assert [p for p in RECIPES.rglob("*.yaml") if harness_task_file(p)] == []
