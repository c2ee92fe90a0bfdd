"""The non-finite guard: an exploding learning rate and a batch crafted to give a NaN loss.

`stop` ends the run with an error naming the step and the last good checkpoint, and leaves
a failed run directory that keeps its log but never looks complete; `skip` drops the
update, leaving the weights and the optimizer state exactly as they were.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import RECIPES, plain, train_recipe

RECIPE = RECIPES / "encoder-classification.yaml"
TINY = ("data.max_train_samples=32", "data.max_eval_samples=8", "training.batch_size=8", "training.logging_steps=1",
        "training.save_steps=1", "training.max_steps=8")
EXPLODING = "training.learning_rate=1e30"


def _log(run):
    return [json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_exploding_learning_rate_stops_naming_the_step_and_the_last_good_checkpoint(tmp_path):
    from safetensors.torch import load_file

    run = tmp_path / "run"
    result = train_recipe(RECIPE, run, *TINY, EXPLODING, expect=2)
    message = plain(result.output)
    assert "Traceback" not in result.output
    step = int(message.split("training step ")[1].split(":")[0])
    last_good = run / "checkpoints" / f"checkpoint-{step - 1}"
    assert f"the last good checkpoint is {last_good}" in message, message
    assert "the loss is nan" in message or "the gradient norm is" in message
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and f"training step {step}" in manifest["error"]
    logged = [r["step"] for r in _log(run) if "loss" in r]
    assert logged == list(range(1, step)), "the failed run keeps its log, up to the last good step"
    assert not (run / "metrics.json").exists() and not (run / "adapter").exists(), "a failed run never looks complete"
    weights = load_file(last_good / "adapter_model.safetensors")
    assert all(t.isfinite().all() for t in weights.values()), "the named checkpoint holds finite weights"


def test_exploding_learning_rate_with_skip_stops_after_the_allowed_skips_in_a_row(tmp_path):
    run = tmp_path / "run"
    result = train_recipe(RECIPE, run, *TINY, EXPLODING, "training.on_nonfinite=skip",
                          "training.max_nonfinite_skips=2", expect=2)
    assert "after 2 skipped updates in a row" in plain(result.output), result.output
    skips = [r["nonfinite_skips"] for r in _log(run) if "nonfinite_skips" in r]
    assert skips == [1, 2]
    assert json.loads((run / "manifest.json").read_text())["status"] == "failed"


# ---------------------------------------------------------------- a batch crafted to give NaN


def _crafted_trainer(tmp_path, policy: str):
    """Six single-example batches; the fourth reaches the model as NaN embeddings, so its loss is NaN."""
    import datasets

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.runs.rundir import RunDirectory
    from hftoolkit.training.throughput import TokenCounter
    from hftoolkit.training.trainer import build_trainer
    from hftoolkit.workflows.train import set_seed

    recipe = load_recipe(RECIPE, ["data.label_names=[negative, positive]", "training.batch_size=1",
                                  "training.max_steps=6", "training.logging_steps=1", "training.warmup_ratio=0",
                                  f"training.on_nonfinite={policy}", "training.weight_decay=0.01"])
    job = resolve_job(recipe, data=False)
    family = formulation(job)
    set_seed(0)
    model, tokenizer = family.load_model(job)
    texts = ["a superb film", "a dull plot", "the cast was wonderful", "an awful ending", "truly moving", "boring"]
    encoded = tokenizer(texts)
    ds = datasets.Dataset.from_dict({**encoded, "labels": [1, 0, 1, 0, 0, 1], "poison": [0, 0, 0, 1, 0, 0],
                                     "length": [len(x) for x in encoded["input_ids"]]})
    run = RunDirectory(tmp_path / "run")
    counter = TokenCounter(Poisoning(family.collator(job, tokenizer), model.config.hidden_size))
    return build_trainer(job, run, model, tokenizer, {"train": ds, "eval": ds}, counter,
                         family.metrics(job, tokenizer))


class Poisoning:
    """Collator wrapper: a batch holding an example marked "poison" gets NaN input embeddings instead of token ids."""

    def __init__(self, collate, hidden_size: int):
        self.collate, self.hidden_size = collate, hidden_size

    def __call__(self, features):
        import torch

        poisoned = any(f.pop("poison", 0) for f in features)
        batch = self.collate(features)
        if poisoned:
            ids = batch.pop("input_ids")
            batch["inputs_embeds"] = torch.full((*ids.shape, self.hidden_size), float("nan"))
        return batch


class StepRecorder:
    """Trainer callback: did this step change the trainable weights, the optimizer state, the learning rate?"""

    def __init__(self):
        self.changes = {}

    def snapshot(self, model, optimizer):
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        state = {(id(p), k): v.clone() if hasattr(v, "clone") else v
                 for p, s in optimizer.state.items() for k, v in s.items()}
        return weights, state, [g["lr"] for g in optimizer.param_groups]

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.before = self.snapshot(model, optimizer)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        import torch

        (w0, s0, lr0), (w1, s1, lr1) = self.before, self.snapshot(model, optimizer)
        self.changes[state.global_step] = {
            "weights": any(not torch.equal(w0[n], w1[n]) for n in w0),
            "optimizer": s0.keys() != s1.keys() or any(not _same(s0[k], s1[k]) for k in s0),
            "lr": lr0 != lr1,
        }

    def __getattr__(self, name):  # every other callback event: nothing to do
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def _same(a, b):
    import torch

    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_a_skipped_update_leaves_weights_and_optimizer_state_untouched(tmp_path):
    trainer = _crafted_trainer(tmp_path, "skip")
    recorder = StepRecorder()
    trainer.add_callback(recorder)
    trainer.train()
    skipped = [r["nonfinite_step"] for r in trainer.state.log_history if "nonfinite_step" in r]
    assert len(skipped) == 1 and trainer.nonfinite_skips == 1
    step = skipped[0]
    assert recorder.changes[step] == {"weights": False, "optimizer": False, "lr": False}
    for other in set(recorder.changes) - {step}:
        assert recorder.changes[other]["weights"] and recorder.changes[other]["optimizer"], other
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses), "later losses are not poisoned by the NaN"


@pytest.mark.slow
def test_a_crafted_nan_batch_stops_training_by_default(tmp_path):
    from hftoolkit.training.nonfinite import NonFiniteError

    trainer = _crafted_trainer(tmp_path, "stop")
    with pytest.raises(NonFiniteError) as caught:
        trainer.train()
    step = trainer.state.global_step + 1
    assert f"training step {step}: the loss is nan" in str(caught.value)
    assert "no checkpoint was saved before it" in str(caught.value)
