"""Eval during training (eval.every), early stopping and keep_best, including across a SIGKILL and resume.

All runs use the tiny encoder recipe on 24 examples in batches of 8: 3 steps an epoch, 3 epochs, 9 steps.
A tiny random BERT barely learns in 9 steps, so its eval accuracy ties from the first eval on: the best
eval (the first to reach the highest score) is then an early step, not the last one, which is what
keep_best must keep.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, run_cli, train_recipe
from tests.helpers.resume import kill_when_paused, killed_on_error, start_training

ENCODER = RECIPES / "encoder-classification.yaml"
TINY = ("data.max_train_samples=24", "data.max_eval_samples=8", "training.batch_size=8", "training.epochs=3",
        "training.logging_steps=1", "eval.max_predictions=4")
STEPS = 9


def history(run) -> list[dict]:
    return [json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]


def evals(run) -> dict[int, dict]:
    """step -> the eval logged during training at that step (the final eval is logged after the last step)."""
    rows = [r for r in history(run) if "eval_loss" in r]
    return {r["step"]: r for r in rows[:-1]}


def adapter(path):
    from safetensors.torch import load_file

    return load_file(path / "adapter_model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


@pytest.mark.slow
def test_eval_every_n_steps_logs_the_task_metrics_to_the_log_history(tmp_path):
    run = tmp_path / "run"
    train_recipe(ENCODER, run, *TINY, "eval.every=3")
    during = evals(run)
    assert sorted(during) == [3, 6, 9]
    assert all({"eval_loss", "eval_accuracy", "eval_f1"} <= row.keys() for row in during.values())
    from hftoolkit.job.precision import resolve_precision

    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["tokens_per_second"] and metrics["precision"] == resolve_precision("auto", "bert")  # this machine's
    assert "best_step" not in metrics  # (keep_best is off)


def test_eval_every_epoch_on_a_perplexity_task_logs_perplexity(tmp_path):
    run = tmp_path / "run"
    train_recipe(RECIPES / "encoder-mlm.yaml", run, *TINY, "eval.every=epoch", "training.sampling=sequential")
    during = evals(run)
    assert sorted(during) == [3, 6, 9]
    for row in during.values():
        assert row["eval_perplexity"] == pytest.approx(__import__("math").exp(row["eval_loss"]))
    # Every eval masks as the final one does (epoch 0's masks): after the last step, the same model, the same loss.
    final = [r for r in history(run) if "eval_loss" in r][-1]
    assert during[9]["eval_loss"] == pytest.approx(final["eval_loss"], abs=1e-6)


@pytest.mark.slow
def test_eval_during_training_of_a_generation_task_scores_generated_text(tmp_path):
    run = tmp_path / "run"
    train_recipe(RECIPES / "seq2seq-translation-t5.yaml", run, *TINY, "eval.every=epoch",
                 "eval.generation.max_new_tokens=4", "eval.early_stopping={patience: 5}")
    during = evals(run)
    assert sorted(during) == [3, 6, 9]
    assert all("eval_bleu" in row and "eval_chrf" in row for row in during.values())


@pytest.mark.slow
def test_early_stopping_stops_before_the_last_epoch(tmp_path):
    # No change can beat a threshold of 1 on accuracy: the second eval counts as no improvement and,
    # with patience 1, stops training there.
    run = tmp_path / "run"
    train_recipe(ENCODER, run, *TINY, "eval.every=2", "eval.early_stopping.patience=1",
                 "eval.early_stopping.threshold=1")
    steps = [r["step"] for r in history(run) if "loss" in r]
    assert max(steps) == 4 < STEPS
    assert sorted(evals(run)) == [2, 4]
    assert (run / "adapter").is_dir()


@pytest.mark.slow
def test_keep_best_keeps_the_best_checkpoint_and_its_weights(tmp_path):
    run = tmp_path / "run"
    train_recipe(ENCODER, run, *TINY, "eval.every=1", "eval.keep_best=true", "training.keep_last=1")
    metrics = json.loads((run / "metrics.json").read_text())
    during = evals(run)
    best = metrics["best_step"]
    scores = [during[s]["eval_accuracy"] for s in sorted(during)]
    assert best == 1 + scores.index(max(scores)) and best < STEPS, "the first eval with the highest accuracy"
    assert metrics["best_metric"] == pytest.approx(max(scores))
    # keep_last=1 keeps the newest checkpoint, and the best one besides.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"checkpoint-{best}", f"checkpoint-{STEPS}"]
    # The run's adapter is the best checkpoint's, and the final eval scores it.
    assert same_weights(adapter(run / "adapter"), adapter(run / "checkpoints" / f"checkpoint-{best}"))
    assert not same_weights(adapter(run / "adapter"), adapter(run / "checkpoints" / f"checkpoint-{STEPS}"))
    assert metrics["eval"]["loss"] == pytest.approx(during[best]["eval_loss"], abs=1e-6)


@pytest.mark.slow
def test_keep_best_survives_a_sigkill_and_resume(tmp_path):
    sets = (*TINY, "eval.every=1", "eval.keep_best=true", "training.keep_last=1")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    process = start_training(ENCODER, killed, sets, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="4")
    with killed_on_error(process):
        train_recipe(ENCODER, reference, *sets)
    kill_when_paused(process)
    best = json.loads((reference / "metrics.json").read_text())["best_step"]
    assert best < 4, "the scenario needs a best checkpoint older than the one the run is killed after"
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == [f"checkpoint-{best}", "checkpoint-4"]
    state = json.loads((killed / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["best_global_step"] == best
    assert state["best_model_checkpoint"].endswith(f"checkpoints/checkpoint-{best}"), "the committed folder"

    run_cli("train", "--resume", killed)
    ref, res = (json.loads((r / "metrics.json").read_text()) for r in (reference, killed))
    assert res["best_step"] == ref["best_step"] == best
    assert res["eval"]["loss"] == pytest.approx(ref["eval"]["loss"], abs=1e-6)
    assert same_weights(adapter(killed / "adapter"), adapter(reference / "adapter"))


def test_eval_keys_are_validated_together():
    from hftoolkit.config.recipe import RecipeError, validate_recipe

    good = {"name": "t", "task": "classification", "model": {"checkpoint": "init:bert"},
            "data": {"train": "builtin:sentiment"}}
    with pytest.raises(RecipeError) as err:
        validate_recipe({**good, "eval": {"keep_best": True, "every": "often"}})
    assert "eval.every: expected none, epoch or a number of steps above 0 (got \"often\")" in str(err.value)
    with pytest.raises(RecipeError) as err:
        validate_recipe({**good, "eval": {"early_stopping": {"patience": 2}}})
    assert "eval: early_stopping judges the evals made during training, and every is none" in str(err.value)
    with pytest.raises(RecipeError) as err:
        validate_recipe({**good, "eval": {"every": 5, "keep_best": True}, "training": {"save_steps": 10}})
    assert "leave training.save_steps unset" in str(err.value)
    assert validate_recipe({**good, "eval": {"every": 5, "keep_best": True}, "training": {"save_steps": 5}})
