"""Exact resume: a run killed with SIGKILL and resumed ends where an uninterrupted run ends.

Each scenario runs the recipe once uninterrupted (in-process), once in a real process that
is SIGKILLed (a test hook holds it at the chosen moment, so the kill lands there every
time), then resumes the killed run in-process and compares the per-step loss history and
the final adapter weights.

- encoder: killed after checkpoint 4 of 9 steps, in the middle of epoch 2 of 3, resumed with
  `train --resume RUN_DIR`; the resumed run crosses into epoch 3. (Mid-epoch past the first
  epoch is where the Trainer's length-grouped order used to differ: batching.py.)
- MLM, full fine-tuning, sequential order (epoch 2 meets epoch 1's batches again): killed after
  checkpoint 4, mid-epoch 2. Masks are seeded by content and epoch, so the resumed run masks as
  the uninterrupted one did (a count of batches met, used before, restarted from zero: 0.32 apart).
- seq2seq: killed inside the save of checkpoint 8, so checkpoint 6 (the end of epoch 2) is the
  newest complete one; resumed at that epoch boundary with `train RECIPE --resume`.
- preference (DPO and KTO through TRL's trainers): killed after checkpoint 4, mid-epoch 2, as the encoder.
- grpo (TRL's GRPO trainer, answers sampled in the run): killed after checkpoint 4 of 6 steps; the resumed run samples
  the answers the uninterrupted one did, so its rewards per step match too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import RECIPES, plain, run_cli, train_recipe
from tests.helpers.resume import (
    TOLERANCE,
    assert_same_training,
    kill_when_paused,
    killed_on_error,
    losses,
    start_training,
)

ENCODER = RECIPES / "encoder-classification.yaml"
MLM = RECIPES / "encoder-mlm.yaml"
SEQ2SEQ = RECIPES / "seq2seq-translation-t5.yaml"
PREFERENCE = RECIPES / "decoder-preference.yaml"
# 24 examples in batches of 8: 3 steps an epoch, 3 epochs, a checkpoint every 2 steps, a loss every step.
STEPS = 9
TINY = ("data.max_train_samples=24", "data.max_eval_samples=8", "training.batch_size=8", "training.epochs=3",
        "training.save_steps=2", "training.logging_steps=1", "eval.max_predictions=4")
SEQ2SEQ_TINY = (*TINY, "eval.generation.max_new_tokens=8")


def reference_and_killed(recipe, root: Path, sets, **hooks) -> tuple[Path, Path]:
    """(root/reference, trained uninterrupted in-process; root/killed, SIGKILLed where the test hook pauses it)."""
    reference, killed = root / "reference", root / "killed"
    process = start_training(recipe, killed, sets, **hooks)
    with killed_on_error(process):
        train_recipe(recipe, reference, *sets)  # while the other process starts up
    kill_when_paused(process)
    return reference, killed


@pytest.fixture(scope="session")
def encoder_runs(tmp_path_factory):
    """(uninterrupted run, killed-then-resumed run) of the encoder recipe."""
    root = tmp_path_factory.mktemp("encoder-resume")
    reference, killed = reference_and_killed(ENCODER, root, TINY, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="4")
    assert json.loads((killed / "manifest.json").read_text())["status"] == "running", "killed, not finished"
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert not (killed / "metrics.json").exists() and not (killed / "adapter").exists()
    run_cli("train", "--resume", killed)
    return reference, killed


@pytest.mark.slow
def test_encoder_resumed_mid_epoch_matches_the_uninterrupted_run(encoder_runs):
    reference, resumed = encoder_runs
    assert_same_training(reference, resumed, steps=STEPS)
    manifest = json.loads((resumed / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["resumed_from"].endswith("checkpoint-4")
    assert json.loads((resumed / "metrics.json").read_text())["eval"]["accuracy"] == pytest.approx(
        json.loads((reference / "metrics.json").read_text())["eval"]["accuracy"])


@pytest.mark.slow
def test_mlm_resumed_mid_epoch_masks_as_the_uninterrupted_run(tmp_path):
    from safetensors.torch import load_file

    sets = (*TINY, "training.sampling=sequential")
    reference, killed = reference_and_killed(MLM, tmp_path, sets, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="4")
    run_cli("train", "--resume", killed)
    ref_losses, res_losses = losses(reference), losses(killed)
    assert sorted(res_losses) == list(range(1, STEPS + 1))
    assert max(abs(ref_losses[s] - res_losses[s]) for s in ref_losses) <= TOLERANCE, (ref_losses, res_losses)
    ref_weights, res_weights = (load_file(run / "model" / "model.safetensors") for run in (reference, killed))
    assert max(float((ref_weights[k] - res_weights[k]).abs().max()) for k in ref_weights) <= TOLERANCE
    metrics = [json.loads((run / "metrics.json").read_text())["eval"] for run in (reference, killed)]
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=TOLERANCE), "eval masks as epoch 0 in both"


@pytest.mark.slow
def test_seq2seq_killed_during_a_save_keeps_the_previous_checkpoint_and_resumes_exactly(tmp_path):
    import torch
    from safetensors.torch import load_file

    from hftoolkit.training.checkpoints import check_checkpoint

    # the hook holds the process after checkpoint 8's files are written, before the rename
    reference, killed = reference_and_killed(SEQ2SEQ, tmp_path, SEQ2SEQ_TINY, HFTOOLKIT_TEST_PAUSE_IN_SAVE="8")
    checkpoints = killed / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [".tmp-checkpoint-8", "checkpoint-4", "checkpoint-6"]
    previous = checkpoints / "checkpoint-6"
    check_checkpoint(previous)  # loadable: every safetensors file whole, every state archive readable
    assert load_file(previous / "adapter_model.safetensors")
    assert torch.load(previous / "optimizer.pt", weights_only=True)["state"]

    run_cli("train", SEQ2SEQ, "--resume", "--output", killed, *[x for s in SEQ2SEQ_TINY for x in ("--set", s)])
    assert_same_training(reference, killed, steps=STEPS)
    assert json.loads((killed / "manifest.json").read_text())["resumed_from"].endswith("checkpoint-6")
    assert not list(checkpoints.glob(".tmp-*")), "the half-written checkpoint is cleared on resume"
    kept = sorted(p.name for p in checkpoints.iterdir())
    assert kept == sorted(p.name for p in (reference / "checkpoints").iterdir()), "the same checkpoints are kept"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dpo", "kto"])  # (kto: its own trainer, and its train set read in a fixed order)
def test_preference_resumed_mid_epoch_matches_the_uninterrupted_run(tmp_path, method):
    sets = (*TINY, "eval.generation.max_new_tokens=4", f"preference.method={method}")
    reference, killed = reference_and_killed(PREFERENCE, tmp_path, sets, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="4")
    assert json.loads((killed / "manifest.json").read_text())["status"] == "running", "killed, not finished"
    run_cli("train", "--resume", killed)
    assert_same_training(reference, killed, steps=STEPS * (2 if method == "kto" else 1))  # (kto: two answers a pair)
    metrics = [json.loads((run / "metrics.json").read_text())["eval"] for run in (reference, killed)]
    assert metrics[1]["reward_margin"] == pytest.approx(metrics[0]["reward_margin"], abs=TOLERANCE)


@pytest.mark.slow
def test_grpo_resumed_matches_the_uninterrupted_run_in_weights_and_rewards(tmp_path):
    reward = tmp_path / "vowels.py"
    reward.write_text("def vowels(completions, **_):\n"
                      "    return [sum(ch in 'aeiou' for ch in c) / max(len(c), 1) for c in completions]\n")
    sets = ("data.max_train_samples=32", "data.max_eval_samples=8", "training.max_steps=6", "training.save_steps=2",
            "training.logging_steps=1", "rl.max_completion_length=8", "eval.generation.max_new_tokens=8",
            f"rl.rewards=[{{function: {reward}:vowels}}]", "rl.beta=0.05")
    reference, killed = reference_and_killed(RECIPES / "decoder-grpo.yaml", tmp_path, sets,
                                             HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="4")
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    run_cli("train", "--resume", killed)
    assert_same_training(reference, killed, steps=6)
    logged = [[json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]
              for run in (reference, killed)]
    rewards = [{r["step"]: (r["reward"], r["kl"]) for r in rows if "reward" in r} for rows in logged]
    assert len(rewards[0]) == 6 and rewards[1] == pytest.approx(rewards[0], abs=TOLERANCE)


# ---------------------------------------------------------------- resume refuses what it cannot do exactly


def _unfinished_copy(run, tmp_path):
    """A copy of a finished run that looks killed after its first checkpoint."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for name in ("metrics.json", "predictions.jsonl", "README.md"):
        (copy / name).unlink()
    shutil.rmtree(copy / "adapter")
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "status": "running", "finished": None}))
    return copy


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_resume_refuses_a_complete_run_and_leaves_it_alone(encoder_runs):
    reference, _ = encoder_runs
    before = _snapshot(reference)
    result = run_cli("train", "--resume", reference, expect=2)
    assert "is already complete, so there is nothing to resume" in plain(result.output)
    assert _snapshot(reference) == before


@pytest.mark.slow
def test_resume_refuses_a_changed_recipe_and_leaves_the_run_alone(encoder_runs, tmp_path):
    copy = _unfinished_copy(encoder_runs[0], tmp_path)
    before = _snapshot(copy)
    sets = [x for s in (*TINY, "training.learning_rate=0.02") for x in ("--set", s)]
    result = run_cli("train", ENCODER, "--resume", "--output", copy, *sets, expect=2)
    message = plain(result.output)
    assert "the recipe differs from the one" in message and "training.learning_rate" in message, message
    assert _snapshot(copy) == before


def test_resume_refuses_a_folder_that_is_not_a_run(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    result = run_cli("train", ENCODER, "--resume", "--output", folder, *[x for s in TINY for x in ("--set", s)],
                     expect=2)
    assert "is not a run directory" in plain(result.output)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    result = run_cli("train", "--resume", folder, expect=2)
    assert f"{folder}: not a run folder (no recipe.yaml)" in plain(result.output)
