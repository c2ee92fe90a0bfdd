"""Launched runs (several processes, or machines on loopback): a time bound on each command, the batches a 1-process
and a 2-process run share, and the assertions that they trained alike.

What summing float32 in another order (two processes, another kernel) can change, derived rather than tuned:
- a loss: float noise in the weights changes it only to second order where the gradient is near zero, and
  by float noise times the gradient elsewhere: a relative 1e-4 holds with room on any x86 CPU;
- a weight: Adam divides each gradient by its own running size, so where a gradient is near zero (below
  its float noise) the step's size and sign are noise: any value up to the learning rate, each step.
  Such a weight may end up to 2 x lr x steps away; every other weight within float noise.
So the weights are held to that bound, and most of them much closer: other batches, or a lost half of one,
move nearly every weight by about the learning rate, which NOISY_SHARE catches.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import RECIPES, train_recipe
from tests.helpers.processes import kill_tree, start_in_group

BOUND_S = 240  # per launched run; a loaded 2-core machine takes ~45 s for one
STEPS = 4
LOSS_RTOL = 1e-4
NOISY_SHARE = 0.02  # at most this share of the adapter's weights may differ by more than lr / 100
# A reward model's loss sees only score differences: the direction that moves both scores of a pair together gets a
# gradient of rounding noise alone, which Adam turns into steps of up to lr in every weight it reaches.
REWARD_NOISY_SHARE = 0.06
# Derived for fp32 (bf16 autocast rounds each product to 8 bits of mantissa): the runs pin it.
SAME_BATCHES = ("training.precision=fp32", "lora.dropout=0", "data.max_train_samples=64", "training.batch_size=16",
                f"training.max_steps={STEPS}",
                "training.logging_steps=1", "training.sampling=sequential", "training.warmup_ratio=0")

# The encoder recipe on 2 DDP processes, read by two tests: tests/e2e/test_distributed.py holds it to one process's
# run, tests/e2e/test_kills.py's DDP chain resumes to it. Six steps with a checkpoint each (the chain interrupts its
# run after checkpoints 1 to 4); 21 eval examples in per-process batches of 8 (the last eval step is padded with
# repeated examples, which the gathered metrics and predictions must not count).
ENCODER_DDP_STEPS = 6
ENCODER_DDP_SETS = (*SAME_BATCHES, f"training.max_steps={ENCODER_DDP_STEPS}", "data.max_train_samples=96",
                    "training.save_steps=1", "data.max_eval_samples=21", "eval.batch_size=8")
_trained: dict[tuple, tuple[Path, str]] = {}  # runs trained once per pytest process, only read (below)


def sharded_sets(checkpoint: Path, lora: bool) -> tuple[str, ...]:
    """What tests/e2e/test_fsdp.py and tests/e2e/test_zero.py train the encoder recipe with, on 2 processes and on
    one (encoder_on_one_process, their shared reference): SAME_BATCHES, LoRA or full fine-tuning, a checkpoint every
    2 steps, 16 eval examples of which 4 predicted."""
    return (f"model.checkpoint={checkpoint}", *SAME_BATCHES, f"lora.enabled={str(lora).lower()}",
            "data.max_eval_samples=16", "eval.max_predictions=4", "training.save_steps=2")


def run_bounded(cmd: list[str], env: dict | None = None) -> tuple[int, str, float]:
    """Run `cmd` in its own session; past BOUND_S kill its whole tree and fail the test."""
    started = time.perf_counter()
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = start_in_group(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        output, _ = proc.communicate()
        pytest.fail(f"still running after {BOUND_S} s (a process hangs): {' '.join(map(str, cmd))}\n{output[-3000:]}")
    return proc.returncode, output, time.perf_counter() - started


def encoder_on_two_processes(tmp_path_factory, checkpoint: Path) -> tuple[Path, str]:
    """(run directory, what the command printed) of `hftoolkit train recipes/encoder-classification.yaml
    --num-processes 2` with ENCODER_DDP_SETS on `checkpoint`: trained by the first test that asks, in this pytest
    process (the tests that read it are in the `processes` xdist group, which one process runs), and only read."""
    key = ("encoder-ddp", str(checkpoint))
    if key not in _trained:
        run = tmp_path_factory.mktemp("encoder-ddp") / "two"
        sets = [a for s in (f"model.checkpoint={checkpoint}", *ENCODER_DDP_SETS) for a in ("--set", s)]
        rc, output, seconds = run_bounded([sys.executable, "-m", "hftoolkit", "train",
                                           RECIPES / "encoder-classification.yaml", "--output", run,
                                           "--num-processes", "2", *sets])
        assert rc == 0, output[-4000:]
        print(f"encoder on 2 processes: {seconds:.0f} s")
        _trained[key] = run, output
    return _trained[key]


def encoder_on_one_process(tmp_path_factory, sets: tuple[str, ...]) -> Path:
    """The encoder recipe with `sets` trained in this process: once per pytest process for the same sets (the
    launched runs of tests/e2e/test_fsdp.py and tests/e2e/test_zero.py are held to the same ones), and only read."""
    key = ("encoder-one", tuple(sets))
    if key not in _trained:
        run = tmp_path_factory.mktemp("encoder-one") / "one"
        train_recipe(RECIPES / "encoder-classification.yaml", run, *sets)
        _trained[key] = run, ""
    return _trained[key][0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def step_losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    assert len(losses) == len({s for s, _ in losses}), f"{run}: a step logged twice: {losses}"
    return dict(losses)


def adapter_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run / "adapter" / "adapter_model.safetensors")


def assert_complete_run(run: Path, command_part: str) -> None:
    """Every file of the run directory contract, once; no staging leftovers; status complete."""
    from hftoolkit.base.run_layout import FILES

    names = {p.name for p in run.iterdir()}
    assert set(FILES) <= names and "adapter" in names, f"{run}: missing {set(FILES) - names}"
    assert not [n for n in names if n.startswith(".")], f"{run}: temporary files left: {names}"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["error"] is None
    assert command_part in manifest["command"], manifest["command"]  # the command the user typed


def assert_same_training(one: Path, two: Path, noisy_share: float = NOISY_SHARE, steps: int = STEPS) -> dict:
    """Per-step losses and final adapter weights of the 1-process and 2-process runs of `steps` steps agree: at
    most `noisy_share` of the weights apart by more than lr / 100."""
    losses_one, losses_two = step_losses(one), step_losses(two)
    assert sorted(losses_one) == sorted(losses_two) == list(range(1, steps + 1))
    rel = max(abs(losses_two[s] - losses_one[s]) / abs(losses_one[s]) for s in losses_one)
    assert rel < LOSS_RTOL, f"per-step losses differ: 1 process {losses_one}, 2 processes {losses_two}"
    import torch
    import yaml

    lr = yaml.safe_load((one / "recipe.yaml").read_text())["training"]["learning_rate"]
    w1, w2 = adapter_weights(one), adapter_weights(two)
    assert w1.keys() == w2.keys()
    gaps = torch.cat([(w1[k] - w2[k]).abs().flatten() for k in w1])
    diff, share = float(gaps.max()), float((gaps > lr / 100).float().mean())
    assert diff <= 2 * lr * steps, f"final adapter weights differ by up to {diff}, more than Adam's steps allow"
    assert share <= noisy_share, f"{share:.1%} of the adapter's weights differ by more than lr/100: other batches?"
    return {"max_rel_loss_diff": rel, "max_abs_weight_diff": diff, "share_apart": share}
