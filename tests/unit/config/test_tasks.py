"""A task is added in one place, config/tasks.py's TASKS, and every consumer reads it from there; the families it
names must each give a formulation of it."""

from __future__ import annotations

import pytest

from hftoolkit.config import tasks
from hftoolkit.config.tasks import CAUSAL_LM, TaskSpec

QUESTION_ANSWERING = TaskSpec(
    "question-answering", columns=("text", "target"), labels=None, scoring="generation", main_metric="f1",
    greater_is_better=True, metrics=("f1",), heads={"encoder": "AutoModelForQuestionAnswering", "decoder": CAUSAL_LM},
    recommended="encoder", why="the answer is a span of the input", pipeline_tag="question-answering",
    packs=True)


def missing_formulations() -> list[tuple[str, str]]:
    """(family, task) for every family the table names for a task without a formulation of it."""
    from hftoolkit.models.families import family_module

    return [(family, t.name) for t in tasks.TASKS for family in t.families
            if t.name not in family_module(family).FORMULATIONS]


def test_every_family_a_task_names_has_its_formulation():
    assert missing_formulations() == []


@pytest.fixture
def question_answering(monkeypatch):
    monkeypatch.setattr(tasks, "TASKS", (*tasks.TASKS, QUESTION_ANSWERING))
    return QUESTION_ANSWERING.name


def test_a_task_added_to_the_table_is_a_recipe_s_task_with_its_families(question_answering):
    from hftoolkit.config.recipe import RecipeError, validate_recipe

    def recipe(checkpoint: str):
        return validate_recipe({"name": "qa", "task": question_answering, "model": {"checkpoint": checkpoint},
                                "data": {"train": "qa.csv"}})

    assert recipe("init:bert").task == question_answering
    assert tasks.advice(question_answering, "decoder").startswith("task 'question-answering' on the decoder family")
    with pytest.raises(RecipeError, match="use an encoder or decoder checkpoint"):
        recipe("init:t5")


def test_a_task_added_to_the_table_reaches_heads_benchmarks_packing_and_reports(question_answering, tmp_path):
    import json

    from transformers import AutoConfig

    from hftoolkit.config.recipe import validate_recipe
    from hftoolkit.evaluation.harness import check_benchmarkable
    from hftoolkit.job import architectures
    from hftoolkit.job.preflight import preflight
    from hftoolkit.runs.card import model_card
    from hftoolkit.runs.summary import load_run

    bert = AutoConfig.for_model("bert")
    assert architectures.head_class(bert, question_answering, "encoder") == "AutoModelForQuestionAnswering"
    assert question_answering in architectures.tasks_with_heads(bert)
    assert question_answering in architectures.tasks_with_heads(AutoConfig.for_model("gpt2"), "decoder")
    check_benchmarkable("decoder", question_answering, "eval --benchmark")  # a causal-LM head: scored
    assert question_answering in tasks.language_model_tasks("decoder")
    packed = validate_recipe({"name": "qa", "task": question_answering, "model": {"checkpoint": "init:gpt2"},
                              "data": {"train": "qa.csv", "packing": True}})
    assert not [p for p in preflight(packed, None, None, None).problems if p.startswith("data.packing")]
    (tmp_path / "metrics.json").write_text(json.dumps({"name": "qa", "task": question_answering, "eval": {"f1": 0.5}}))
    run = load_run(tmp_path)
    assert (run.main_metric, run.greater_is_better) == ("f1", True)
    assert "Question Answering" in model_card(packed, {"eval": {"f1": 0.5}})


def test_the_families_a_new_task_names_must_give_it_a_formulation(question_answering, monkeypatch):
    from hftoolkit.models.families import decoder, encoder

    assert missing_formulations() == [("encoder", question_answering), ("decoder", question_answering)]
    monkeypatch.setitem(encoder.FORMULATIONS, question_answering, object())
    monkeypatch.setitem(decoder.FORMULATIONS, question_answering, object())
    assert missing_formulations() == []
