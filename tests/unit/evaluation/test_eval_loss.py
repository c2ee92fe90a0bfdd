"""The eval loss is one figure: the mean over every labelled token of the eval set (an answer's tokens), as TRL and
the Trainer's token-averaged losses define it, whatever the batching."""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, train_recipe

# Instruction tuning on a tiny GPT-2: the five kinds of builtin:instructions have answers of different lengths, so
# a mean of batch means differs from the mean over tokens.
TINY_INSTRUCTION = ("model.checkpoint=init:gpt2", "model.gguf_file=null", "model.revision=null",
                    "training.max_steps=40", "training.learning_rate=0.01", "data.max_train_samples=320",
                    "data.max_eval_samples=40",
                    "eval.batch_size=8", "eval.max_predictions=2", "eval.generation.max_new_tokens=2")


def by_hand(run_dir):
    """(mean over answer tokens, the Trainer's mean over examples of their batch's mean) of the run's eval set, its
    examples tokenized as training did and scored one by one."""
    import torch

    from hftoolkit.evaluation.evaluate import shortest_first
    from hftoolkit.workflows.evaluate import load_trained

    job, form, model, processor = load_trained(run_dir, data=True)
    encoded = shortest_first(form.preprocess(job, processor, job.data["eval"]))[0]
    sums, counts = [], []
    with torch.no_grad():
        for ids, labels in zip(encoded["input_ids"], encoded["labels"]):
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            target = torch.tensor(labels[1:])
            sums.append(torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction="sum").item())
            counts.append(int(target.ne(-100).sum()))
    batch = job.recipe.eval.batch_size
    batch_means = []
    for start in range(0, len(sums), batch):
        mean = sum(sums[start:start + batch]) / sum(counts[start:start + batch])
        batch_means += [mean] * len(sums[start:start + batch])
    return sum(sums) / sum(counts), sum(batch_means) / len(batch_means)


@pytest.mark.slow
def test_eval_loss_is_the_mean_over_the_eval_sets_answer_tokens(tmp_path):
    run = tmp_path / "run"
    train_recipe(RECIPES / "smollm2-instruct.yaml", run, *TINY_INSTRUCTION)
    recorded = json.loads((run / "metrics.json").read_text())["eval"]["loss"]
    token_mean, trainer_mean = by_hand(run)
    assert abs(token_mean - trainer_mean) > 0.02, "the check needs answers whose losses differ by kind"
    # (the run evaluates under bf16 autocast, where the CPU has bf16 units; this sum is float32)
    assert recorded == pytest.approx(token_mean, abs=2e-3), (recorded, token_mean, trainer_mean)
