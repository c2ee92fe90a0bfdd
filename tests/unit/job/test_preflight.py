"""Preflight: what it settles itself (clamped lengths, dropped empty rows) and the run still trains; a run whose
eval fails keeps its weights and `hftoolkit eval` completes it; `validate --data` lists every problem at once.

The refusals (data x model problems found before the first step) are rows of tests/e2e/test_bad_inputs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import RECIPES, plain, run_cli, train_recipe

ENCODER = RECIPES / "encoder-classification.yaml"
SUMMARIZATION = RECIPES / "seq2seq-summarization.yaml"
VISION = RECIPES / "vision-classification.yaml"
QUICK = ("training.max_steps=1", "training.batch_size=4", "eval.batch_size=8")


def _csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


@pytest.mark.slow
def test_max_length_beyond_the_position_table_is_clamped_and_the_run_trains(tmp_path):
    long = " ".join(["the film was long"] * 200)  # about 800 tokens: past BERT's 512 positions
    data = _csv(tmp_path / "long.csv", "text,label", [f"{long} {i},{'pos' if i % 2 else 'neg'}" for i in range(8)])
    run = tmp_path / "run"
    result = train_recipe(ENCODER, run, f"data.train={data}", "data.max_length=100000", "data.eval_fraction=0.25",
                          *QUICK)
    assert "preflight: data.max_length: 100000 tokens is more than init:bert takes (512 positions): using 512" \
        in plain(result.output)
    assert _manifest(run)["preflight"]["max_length"] == {"asked": 100000, "used": 512}
    assert yaml.safe_load((run / "recipe.yaml").read_text())["data"]["max_length"] == 512  # what eval and predict use
    assert _manifest(run)["status"] == "complete"


@pytest.mark.slow
def test_target_length_beyond_bart_positions_is_clamped_and_the_run_trains(tmp_path):
    summary = " ".join(["a very long summary"] * 150)  # about 600 target tokens: past the tiny BART's 512
    data = _csv(tmp_path / "docs.csv", "text,target", [f"document {i} about cats,{summary}" for i in range(8)])
    run = tmp_path / "run"
    result = train_recipe(SUMMARIZATION, run, f"data.train={data}", "data.max_target_length=100000",
                          "data.eval_fraction=0.25", "eval.generation.max_new_tokens=4", *QUICK)
    assert "data.max_target_length: 100000 tokens is more than init:bart takes (512 positions)" in plain(result.output)
    assert _manifest(run)["preflight"]["max_target_length"] == {"asked": 100000, "used": 512}


@pytest.mark.slow
def test_empty_texts_are_dropped_counted_and_the_run_trains(tmp_path):
    rows = [f"the film was fine {i},{'pos' if i % 2 else 'neg'}" for i in range(10)]
    train = _csv(tmp_path / "train.csv", "text,label", [*rows, ",pos", "   ,neg"])
    evaluation = _csv(tmp_path / "eval.csv", "text,label", [*rows[:4], ",neg"])
    run = tmp_path / "run"
    result = train_recipe(ENCODER, run, f"data.train={train}", f"data.eval={evaluation}", *QUICK)
    assert "preflight: data.train: dropped 2 rows with an empty text" in plain(result.output)
    assert "preflight: data.eval: dropped 1 row with an empty text" in plain(result.output)
    assert _manifest(run)["preflight"]["dropped_empty"] == {"train": 2, "eval": 1}
    assert len((run / "predictions.jsonl").read_text().splitlines()) == 4


def test_aligned_files_keep_their_line_numbers_and_lose_only_empty_pairs(tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    source = tmp_path / "src.txt"
    source.write_text("the cat\n\na dog\nthe bird\nthe man\n\n")
    target = tmp_path / "tgt.txt"
    target.write_text("de katze\nein vogel\n  \nde vogel\nde mann\n")
    recipe = load_recipe(RECIPES / "seq2seq-translation-t5.yaml",
                         [f"data.train={source}", f"data.train_target={target}", f"data.eval={source}",
                          f"data.eval_target={target}"])
    dropped = {}
    data, _ = load_data(recipe, dropped)
    assert list(zip(data["eval"]["text"], data["eval"]["target"])) == [
        ("the cat", "de katze"), ("the bird", "de vogel"), ("the man", "de mann")]
    assert dropped == {"train": 2, "eval": 2}


def test_csv_labels_become_integer_ids(tmp_path):
    """datasets keeps a string column's type through a map that returns ids under the same name: the ids
    must still reach the collator as integers (strings made every CSV classification run crash)."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    data = _csv(tmp_path / "d.csv", "text,label", ["good,pos", "bad,neg", "fine,pos", "poor,neg"])
    recipe = load_recipe(ENCODER, [f"data.train={data}", f"data.eval={data}"])
    loaded, names = load_data(recipe)
    assert loaded["eval"]["label"][:] == [1, 0, 1, 0] and names == ["neg", "pos"]


def test_an_eval_image_folder_may_hold_one_class(tmp_path):
    from PIL import Image

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    for folder, classes in (("train", ("cat", "dog")), ("eval", ("dog",))):
        for label in classes:
            (tmp_path / folder / label).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / folder / label / f"{i}.png")
    recipe = load_recipe(VISION, [f"data.train={tmp_path / 'train'}", f"data.eval={tmp_path / 'eval'}"])
    data, names = load_data(recipe)
    assert names == ["cat", "dog"] and data["eval"]["label"][:] == [1, 1]


@pytest.mark.slow
def test_decoder_without_a_pad_token_classifies_padding_with_eos(tmp_path):
    from tests.helpers.inputs import tokenizer_without

    ckpt = tokenizer_without(tmp_path, "gpt2", "pad")
    run = tmp_path / "run"
    train_recipe(ENCODER, run, f"model.checkpoint={ckpt}", "lora.targets=[c_attn]", *QUICK)
    assert _manifest(run)["status"] == "complete"


def test_lengths_are_clamped_per_family(tmp_path):
    """A decoder's prompt and target share one sequence; its new tokens share the positions too; T5's relative
    positions have no table to run past; RoBERTa's positions start after the padding index."""
    from transformers import GPT2Config, RobertaConfig, T5Config

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.preflight import Findings, Subject, check_lengths, position_limit
    from hftoolkit.job.spec import Job, ResolvedModel

    def checked(recipe, config, family):
        model = ResolvedModel(checkpoint=recipe.model.checkpoint, path="", revision=None, config=config,
                              family=family, processor=None)
        found = Findings()
        check_lengths(Subject(recipe, model, None, None), found)
        return Job(recipe=recipe, model=model, precision="fp32", findings=found)

    recipe = load_recipe(RECIPES / "decoder-clm.yaml", ["task=translation", "data.max_length=400",
                                                        "data.max_target_length=300",
                                                        "eval.generation.max_new_tokens=1000"])
    job = checked(recipe, GPT2Config(n_positions=512), "decoder")
    found = job.findings
    assert (job.max_length, job.max_target_length) == (256, 256)
    assert job.max_new_tokens == 511
    assert (recipe.data.max_length, recipe.data.max_target_length) == (400, 300)  # the recipe stays as written
    assert found.record == {"max_length": {"asked": 400, "used": 256},
                            "max_target_length": {"asked": 300, "used": 256},
                            "max_new_tokens": {"asked": 1000, "used": 511}}
    assert len(found.notes) == 2
    t5 = load_recipe(RECIPES / "seq2seq-translation-t5.yaml", ["data.max_length=100000"])
    assert checked(t5, T5Config(), "seq2seq").max_length == 100000
    assert position_limit(RobertaConfig(max_position_embeddings=514, pad_token_id=1), None) == 512


@pytest.mark.slow
def test_a_run_whose_eval_fails_keeps_its_adapter_and_eval_completes_it(tmp_path, monkeypatch):
    import hftoolkit.workflows.train

    def failing_eval(*args, **kwargs):
        raise RuntimeError("the eval pass failed on purpose")

    monkeypatch.setattr(hftoolkit.workflows.train, "evaluate", failing_eval)
    run = tmp_path / "run"
    result = train_recipe(ENCODER, run, *QUICK, expect=None)
    assert isinstance(result.exception, RuntimeError)
    manifest = _manifest(run)
    assert manifest["status"] == "trained, eval failed"
    assert manifest["error"] == "RuntimeError: the eval pass failed on purpose"
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert f"hftoolkit eval {run}" in plain(result.output)
    measured = json.loads((run / "metrics.json").read_text())
    assert measured["train_seconds"] > 0 and "eval" not in measured
    monkeypatch.undo()

    result = run_cli("eval", run)
    assert _manifest(run)["status"] == "complete" and _manifest(run)["error"] is None
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train_seconds"] == measured["train_seconds"] and 0 <= metrics["eval"]["accuracy"] <= 1
    assert (run / "predictions.jsonl").read_text().strip() and "accuracy" in (run / "README.md").read_text()

    (run / "metrics.json").unlink()  # a run that never wrote one: eval gives what it can know without training
    run_cli("eval", run)
    rebuilt = json.loads((run / "metrics.json").read_text())
    assert rebuilt["name"] == "encoder-classification" and rebuilt["task"] == "classification"
    assert rebuilt["eval"] == metrics["eval"] and rebuilt["trainable_params"] == metrics["trainable_params"]


@pytest.fixture
def no_weights(monkeypatch):
    """Any model weights loaded fail the test: validate --data reads configs and tokenizers only."""
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError("validate --data loaded model weights")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


def test_validate_data_reports_every_problem_of_every_recipe_at_once(tmp_path, no_weights):
    from tests.helpers.inputs import class_images, sentiment_csv, vit_with, without_tokenizer

    def recipe(base: Path, name: str, checkpoint: Path, **data) -> Path:
        raw = yaml.safe_load(base.read_text())
        raw["model"]["checkpoint"] = str(checkpoint)
        raw["data"].update({k: str(v) for k, v in data.items()})
        (tmp_path / name).write_text(yaml.safe_dump(raw))
        return tmp_path / name

    text = recipe(ENCODER, "text.yaml", without_tokenizer(tmp_path), train=sentiment_csv(tmp_path),
                  eval=sentiment_csv(tmp_path, "e.csv", ("pos", "meh")))
    vision = recipe(VISION, "vision.yaml", vit_with(tmp_path, None), train=class_images(tmp_path, classes=("cat",)))
    result = run_cli("validate", text, vision, "--data", expect=2)
    errors = result.output.split("Error: ", 1)[1].splitlines()
    assert len(errors) == 4, result.output
    assert errors[0].startswith(f"{text}: model.checkpoint: ") and "has config.json but no tokenizer files" in errors[0]
    assert errors[1] == (f"{text}: data.eval: label 'meh' (6 eval rows) never occurs in the train split of "
                         f"{tmp_path / 'train.csv'}, so the model can't learn it: add training examples of it, "
                         "or remove those rows from the eval data")
    assert errors[2].startswith(f"{vision}: model.checkpoint: ") and "(preprocessor_config.json)" in errors[2]
    assert errors[3].startswith(f"{vision}: data.train: ") and "a single class subfolder (cat)" in errors[3]


def test_validate_data_of_a_good_recipe_prints_what_preflight_would_change(tmp_path, no_weights):
    result = run_cli("validate", ENCODER, "--data", "--set", "data.max_length=4096")
    assert plain(result.output).startswith(f"ok: {ENCODER}")
    assert "note: data.max_length: 4096 tokens is more than init:bert takes (512 positions): using 512" \
        in plain(result.output)
    assert not (Path("runs") / "encoder-classification").exists()


def test_train_reports_the_full_run_folder_and_every_missing_column_at_once(tmp_path):
    """A new user's CSV (review, stars) under the quickstart's column names, into a run folder already in use:
    one run says all three things, and the folder is left as it was."""
    train = _csv(tmp_path / "reviews.csv", "review,stars", [f"film {i},{i % 5 + 1}" for i in range(10)])
    evaluation = _csv(tmp_path / "test.csv", "id,review,stars", [f"{i},film {i},{i % 5 + 1}" for i in range(4)])
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("another run's")
    result = train_recipe(ENCODER, run, f"data.train={train}", f"data.eval={evaluation}", *QUICK, expect=2)
    errors = result.output.split("Error: ", 1)[1].splitlines()
    assert errors[0].startswith(f"--output: run directory {run} is not empty")
    assert errors[1:] == [
        f"data.text_column, data.label_column: columns 'text', 'label' not found in {split}; columns found: "
        f"{found}; set data.text_column and data.label_column to the names in the data"
        for split, found in ((train, "review, stars"), (evaluation, "id, review, stars"))]
    assert [p.name for p in run.iterdir()] == ["keep.txt"]


def test_a_relative_data_path_is_read_from_the_current_folder_and_a_missing_one_shown_whole(tmp_path, monkeypatch):
    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    (tmp_path / "data").mkdir()
    _csv(tmp_path / "data" / "reviews.csv", "text,label", [f"film {i},{'pos' if i % 2 else 'neg'}" for i in range(6)])
    monkeypatch.chdir(tmp_path)
    loaded, names = load_data(load_recipe(ENCODER, ["data.train=data/reviews.csv"]))
    assert names == ["neg", "pos"] and len(loaded["train"]) + len(loaded["eval"]) == 6
    with pytest.raises(UserError) as err:
        load_data(load_recipe(ENCODER, ["data.train=data/review.csv"]))
    assert err.value.message == (f"data.train: data file data/review.csv not found (looked for "
                                 f"{tmp_path / 'data' / 'review.csv'}; a relative path is read from the current "
                                 "folder): check the path")


@pytest.mark.slow
def test_packing_where_no_formulation_packs_is_refused_in_one_line_before_training(tmp_path, no_weights):
    """data.packing true on a task that trains one example a row (here the quickstart's classification) used to
    train unpacked, exit 0, without a word."""
    said = (f"{ENCODER}: data.packing: packing whole examples into rows is for tasks clm, translation, summarization "
            "or instruction on decoder models, and task classification trains one example a row whatever the "
            "family: remove data.packing (or set it to false)")
    result = run_cli("validate", ENCODER, "--data", "--set", "data.packing=true", expect=2)
    assert result.output.split("Error: ", 1)[1].splitlines() == [said]
    run = tmp_path / "run"
    trained = train_recipe(ENCODER, run, "data.packing=true", *QUICK, expect=2)
    assert said.removeprefix(f"{ENCODER}: ") in plain(trained.output) and not run.exists()
    assert plain(run_cli("validate", ENCODER, "--data", "--set", "data.packing=false").output) \
        .startswith(f"ok: {ENCODER}")  # false is what these tasks do anyway


def test_preflight_refuses_packing_for_every_task_and_family_whose_formulation_does_not_pack():
    """The decoder's language-model tasks (what preflight lets pack) are exactly the formulations that read
    data.packing."""
    import inspect
    import re

    from hftoolkit.config import tasks
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.preflight import preflight
    from hftoolkit.models.families import family_module

    def packs(form) -> bool:  # families/decoder.py's helpers that read data.packing
        return any(re.search(r"\b_pack(ing|ed)\(", inspect.getsource(c))
                   for c in type(form).__mro__ if c.__module__.startswith("hftoolkit."))

    packing = {(family, task) for family in ("encoder", "decoder", "seq2seq", "vision")
               for task, form in family_module(family).FORMULATIONS.items() if packs(form)}
    packed = tasks.packed()
    assert packing == {("decoder", task) for task in packed}
    recipe = load_recipe(ENCODER, ["data.packing=true"])
    for task in tasks.names():
        problems = preflight(recipe.model_copy(update={"task": task}), None, None, None).problems
        assert bool(problems) == (task not in packed), (task, problems)
