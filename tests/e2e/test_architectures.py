"""Any family for a task its head supports: every (task, family) pair beyond the course's choice trains end
to end on a tiny init: checkpoint, is scored by the task's main metric, and predicts."""

from __future__ import annotations

import ast
import json
import math

import pytest

from hftoolkit.config import tasks
from tests.helpers import RECIPES, plain, run_cli, train_recipe

SHORT = ("training.max_steps=6", "training.logging_steps=2", "data.max_eval_samples=24", "eval.max_predictions=8")
# (task, the task's smoke recipe, a checkpoint of another family than the course's, that family)
PAIRS = [
    ("classification", "encoder-classification.yaml", "init:gpt2", "decoder"),
    ("classification", "encoder-classification.yaml", "init:bart", "seq2seq"),
    ("classification", "encoder-classification.yaml", "init:t5", "seq2seq"),
    ("tagging", "encoder-tagging.yaml", "init:gpt2", "decoder"),
    ("translation", "seq2seq-translation-t5.yaml", "init:gpt2", "decoder"),
    ("summarization", "seq2seq-summarization.yaml", "init:gpt2", "decoder"),
]


# Regression trains with a decoder and an encoder-decoder in tests/e2e/test_realjobs.py, on a planted STS-B (no
# built-in set has float labels); instruction with an encoder-decoder in tests/e2e/test_smollm2.py (its recipe names a
# GGUF file); a reward model on a decoder in tests/unit/training/test_reward.py (a pair is scored, not predicted).
ELSEWHERE = {("regression", "decoder"), ("regression", "seq2seq"), ("instruction", "seq2seq"), ("reward", "decoder")}


def test_the_pairs_tested_here_are_every_pair_the_task_table_allows_beyond_the_recommended_family():
    allowed = {(t.name, f) for t in tasks.TASKS for f in t.families if f != t.recommended}
    assert allowed == {(task, family) for task, _, _, family in PAIRS} | ELSEWHERE


@pytest.mark.slow
@pytest.mark.parametrize("task, recipe, checkpoint, family", PAIRS, ids=[f"{p[0]}-{p[2]}" for p in PAIRS])
def test_pair_trains_scores_and_predicts(task, recipe, checkpoint, family, tmp_path):
    validated = run_cli("validate", RECIPES / recipe, "--set", f"model.checkpoint={checkpoint}")
    assert f"the course recommends the {tasks.spec(task).recommended} family" in plain(validated.output)

    run = tmp_path / "run"
    train_recipe(RECIPES / recipe, run, f"model.checkpoint={checkpoint}", *SHORT)
    metrics = json.loads((run / "metrics.json").read_text())
    spec = tasks.spec(task)
    assert metrics["family"] == family and metrics["task"] == task
    assert metrics["main_metric"] == spec.main_metric
    assert math.isfinite(metrics["eval"][spec.main_metric]), metrics["eval"]
    assert math.isfinite(metrics["eval"]["loss"])
    assert 0 < metrics["trainable_params"] < metrics["total_params"]
    assert "the course recommends" in (run / "README.md").read_text(), "the model card carries the advice"

    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 8
    given = "the film was great" if task != "tagging" else "alice visited paris"
    predicted = run_cli("predict", run, "--input", given).output.rstrip("\n").split("\t")
    if spec.labels == "class":
        assert predicted[1] in ("negative", "positive") and 0 < float(predicted[2]) <= 1
    elif spec.labels == "tags":
        assert len(ast.literal_eval(predicted[1])) == 3  # one tag per word
    else:
        assert len(predicted) == 2  # input and generated text (possibly empty after 6 steps)


@pytest.mark.slow
def test_decoder_prompt_and_target_learns_the_target_only(tmp_path):
    """Translation with GPT-2: the loss covers the target tokens, so the prompt's labels are all ignored."""
    from datasets import Dataset

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import decoder, formulation

    job = resolve_job(load_recipe(RECIPES / "seq2seq-translation-t5.yaml", ["model.checkpoint=init:gpt2"]), data=False)
    recipe, tokenizer = job.recipe, job.model.processor
    row = formulation(job).preprocess(job, tokenizer, Dataset.from_dict({"text": ["a cat"], "target": ["un chat"]}))[0]
    prompt = (tokenizer(recipe.data.source_prefix + "a cat")["input_ids"]
              + tokenizer(decoder.PROMPT_END, add_special_tokens=False)["input_ids"])
    target = tokenizer("un chat", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert row["input_ids"] == prompt + target
    assert row["labels"] == [-100] * len(prompt) + target
