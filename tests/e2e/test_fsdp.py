"""FSDP2 executed on CPU processes (gloo), through the path a GPU run takes: Trainer -> accelerate -> fully_shard.

For LoRA and for full fine-tuning, one session-scoped set of runs serves every assertion:
- `one`: the recipe on 1 process (in-process), the reference (the same runs tests/e2e/test_zero.py holds its runs to:
  tests/helpers/launches.py's sharded_sets and encoder_on_one_process);
- `fsdp`: `train --accelerate-config recipes/accelerate/fsdp.yaml` on 2 processes, a checkpoint every 2 of 4 steps;
- `killed` (full fine-tuning only: every weight and both of Adam's moments for it sharded, the most a sharded
  checkpoint holds; a LoRA run's checkpoint is written and read by the same accelerate calls): the same through the
  kill chain (tests/helpers/kills.py), one training process SIGKILLed after checkpoint 1, then `train --resume` on
  2 processes (every other interruption: tests/e2e/test_kills.py, under DDP). It starts first and waits at its first
  pause (asleep) while `fsdp` runs.

Tolerances: 1 vs 2 processes sum float32 in another order, so per-step losses and final weights are held to
tests/helpers/launches.py's derived bounds (LOSS_RTOL, Adam's 2 x lr x steps, NOISY_SHARE); a resumed run
replays the same sums in the same order, so it must equal the uninterrupted 2-process run to the bit.
The runs use a copy of the tiny BERT with dropout 0 (each process draws its own dropout masks).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import RECIPES, run_cli, train_recipe
from tests.helpers.kills import assert_same_run, kill_chain
from tests.helpers.launches import (
    LOSS_RTOL,
    NOISY_SHARE,
    SAME_BATCHES,
    STEPS,
    encoder_on_one_process,
    run_bounded,
    sharded_sets,
    step_losses,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

ENCODER = RECIPES / "encoder-classification.yaml"
FSDP = RECIPES / "accelerate" / "fsdp.yaml"
MODES = {"lora": True, "full": False}  # mode -> lora.enabled


def _weights(run):
    from safetensors.torch import load_file

    folder = run / "adapter" if (run / "adapter").is_dir() else run / "model"
    return load_file(folder / ("adapter_model.safetensors" if folder.name == "adapter" else "model.safetensors"))


def _argv(sets) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _train(mode: str, tmp_path_factory, checkpoint) -> dict:
    """{"mode", "one", "fsdp", and for full fine-tuning "killed"} run directories, as the module docstring says."""
    root = tmp_path_factory.mktemp(f"fsdp-{mode}")
    sets = sharded_sets(checkpoint, MODES[mode])
    launch = [sys.executable, "-m", "hftoolkit", "train", ENCODER, "--accelerate-config", FSDP, *_argv(sets)]
    trained = {"mode": mode, "fsdp": root / "fsdp"}

    def uninterrupted():
        rc, output, _ = run_bounded([*launch, "--output", root / "fsdp"])
        assert rc == 0, output[-4000:]
        assert output.count("run directory:") == 1, "the results are printed by the main process only"
        trained["one"] = encoder_on_one_process(tmp_path_factory, sets)  # (tests/e2e/test_zero.py's reference too)

    if mode != "full":
        uninterrupted()
        return trained
    killed = root / "killed"  # a checkpoint at every step
    chain_args = [str(ENCODER), *_argv((*sets, "training.save_steps=1"))]
    kill_chain(root, chain_args, killed, ["one-worker"], ("--accelerate-config", str(FSDP)), reference=uninterrupted)
    return {**trained, "killed": killed}


@pytest.fixture(scope="session")
def lora_runs(tmp_path_factory, no_dropout):
    return _train("lora", tmp_path_factory, no_dropout["bert"])


@pytest.fixture(scope="session")
def full_runs(tmp_path_factory, no_dropout):
    return _train("full", tmp_path_factory, no_dropout["bert"])


@pytest.fixture(scope="session", params=list(MODES))
def runs(request):
    """mode -> its runs (lora_runs or full_runs)."""
    return request.getfixturevalue(f"{request.param}_runs")


def test_fsdp_shards_every_parameter_over_both_processes(runs):
    from hftoolkit.base.run_layout import FILES

    run = runs["fsdp"]
    names = {p.name for p in run.iterdir()}
    assert set(FILES) <= names and ("adapter" if runs["mode"] == "lora" else "model") in names, names
    assert not [n for n in names if n.startswith(".")], f"temporary files left: {names}"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and "--accelerate-config" in manifest["command"]
    ran = json.loads((run / "manifest.json").read_text())["distributed"]
    assert ran["type"] == "FSDP" and ran["sharding"] == "FSDP" and ran["processes"] == 2
    assert ran["sharded_parameters"] == ran["of_parameters"] > 0
    # Each process holds about half of the elements (a tensor of odd length leaves one row more on one side).
    assert len(ran["local_fraction"]) == 2 and sum(ran["local_fraction"]) == pytest.approx(1, abs=1e-3)
    assert all(abs(share - 0.5) < 0.01 for share in ran["local_fraction"]), ran["local_fraction"]
    # RAM-efficient loading (fsdp.yaml): only the main process read the checkpoint; the other received its weights.
    assert ran["read_checkpoint"] == [True, False]


def test_fsdp_trains_as_one_process_does(runs):
    import torch
    import yaml

    one, two = step_losses(runs["one"]), step_losses(runs["fsdp"])
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    rel = max(abs(two[s] - one[s]) / abs(one[s]) for s in one)
    assert rel < LOSS_RTOL, f"per-step losses differ: 1 process {one}, FSDP on 2 {two}"
    lr = yaml.safe_load((runs["one"] / "recipe.yaml").read_text())["training"]["learning_rate"]
    w1, w2 = _weights(runs["one"]), _weights(runs["fsdp"])
    assert w1.keys() == w2.keys()
    assert {k: tuple(v.shape) for k, v in w1.items()} == {k: tuple(v.shape) for k, v in w2.items()}, "whole tensors"
    gaps = torch.cat([(w1[k] - w2[k]).abs().flatten() for k in w1])
    assert float(gaps.max()) <= 2 * lr * STEPS
    assert float((gaps > lr / 100).float().mean()) <= NOISY_SHARE
    print(f"{runs['mode']}: max rel loss diff {rel:.2g}, max weight diff {float(gaps.max()):.2g}")


def test_saved_weights_are_the_gathered_state(runs):
    """adapter/ or model/ holds every tensor whole, equal to the full state the last checkpoint gathered from both
    processes (accelerate's FULL_STATE_DICT save; its LoRA save once kept only rank 0's slice)."""
    import torch

    saved = _weights(runs["fsdp"])
    gathered = torch.load(runs["fsdp"] / "checkpoints" / f"checkpoint-{STEPS}" / "pytorch_model_fsdp.bin",
                          weights_only=True)
    # (peft's names in the model: the adapter's name "default", the head's trained copy under modules_to_save)
    gathered = {k.replace(".modules_to_save.default", "").replace(".default", ""): v for k, v in gathered.items()}
    if runs["mode"] == "full":
        assert saved.keys() <= gathered.keys()
    else:
        assert saved.keys() == gathered.keys()
    for name, tensor in saved.items():
        assert tensor.shape == gathered[name].shape and torch.equal(tensor, gathered[name]), name


def test_killed_and_resumed_fsdp_run_ends_as_the_uninterrupted_one(full_runs):
    """One training process SIGKILLed after checkpoint 1, then --resume from the sharded checkpoint: the run ends as
    the uninterrupted one, to the bit."""
    assert_same_run(full_runs["killed"], full_runs["fsdp"])


def test_merge_folds_the_fsdp_adapter(runs, tmp_path):
    """merge on the FSDP run: a LoRA run's adapter folded into the base gives the adapter model's logits; a full
    fine-tuning run's model/ is the merged model already, which merge says in one line."""
    if runs["mode"] != "lora":
        result = run_cli("merge", runs["fsdp"], "--out", tmp_path / "merged", expect=2)
        assert "fine-tuned the whole model, so there is no adapter to merge" in result.output
        assert not (tmp_path / "merged").exists()
        return
    import torch
    from transformers import AutoModelForSequenceClassification

    from hftoolkit.workflows.evaluate import load_trained

    run_cli("merge", runs["fsdp"], "--out", tmp_path / "merged")
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged")
    _, _, adapter_model, processor = load_trained(runs["fsdp"], full_precision=True)
    batch = processor(["the film was brilliant", "every scene was dull"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(adapter_model(**batch).logits, merged(**batch).logits, atol=1e-5)


def test_a_seq2seq_model_whose_embedding_is_shared_three_ways_trains_as_one_process_does(tmp_path, no_dropout):
    """T5 keeps one embedding weight in three modules (shared, the encoder's and the decoder's embed_tokens), which
    FSDP2 refused to shard as two units; full fine-tuning trains that weight too."""
    seq2seq = RECIPES / "seq2seq-translation-t5.yaml"
    sets = (f"model.checkpoint={no_dropout['t5']}", *SAME_BATCHES, "lora.enabled=false", "data.max_eval_samples=8",
            "eval.max_predictions=2", "eval.generation.max_new_tokens=4")
    rc, output, _ = run_bounded([sys.executable, "-m", "hftoolkit", "train", seq2seq, "--accelerate-config", FSDP,
                                 *_argv(sets), "--output", tmp_path / "fsdp"])
    assert rc == 0, output[-4000:]
    train_recipe(seq2seq, tmp_path / "one", *sets)
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "fsdp")
    assert one.keys() == two.keys() == set(range(1, STEPS + 1))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=LOSS_RTOL), step
