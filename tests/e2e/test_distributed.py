"""Training on several processes (CPU, 2 processes, gloo) equals training on one.

The equality runs use a copy of the tiny checkpoint with every dropout at 0 (and lora.dropout=0):
each process draws dropout masks from its own random stream, so with dropout on, 1 and 2
processes would differ by design. Sampling is sequential, so both runs see the same global
batches: 2 processes at 8 each take, per step, the same 16 examples that 1 process takes.
Every launched command has a time bound and fails instead of waiting on a hung process (tests/helpers/launches.py,
with the derivation of the tolerances).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import RECIPES, run_cli, train_recipe
from tests.helpers.launches import (
    ENCODER_DDP_SETS,
    ENCODER_DDP_STEPS,
    LOSS_RTOL,
    REWARD_NOISY_SHARE,
    SAME_BATCHES,
    assert_complete_run,
    assert_same_training,
    encoder_on_two_processes,
    run_bounded,
)

ENCODER = RECIPES / "encoder-classification.yaml"
SEQ2SEQ = RECIPES / "seq2seq-translation-t5.yaml"
CPU_2PROC = RECIPES / "accelerate" / "cpu-2proc.yaml"
PREFERENCE = RECIPES / "decoder-preference.yaml"


def read_json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several processes each: one such test at a time on a 2-core machine
def test_encoder_on_two_processes_trains_and_scores_as_on_one(tmp_path, tmp_path_factory, no_dropout):
    """`hftoolkit train --num-processes 2` (the run tests/e2e/test_kills.py's DDP chain resumes to: 6 steps, 21 eval
    examples in per-process batches of 8, the last eval step padded with repeated examples) against one process."""
    sets = (f"model.checkpoint={no_dropout['bert']}", *ENCODER_DDP_SETS)
    started = time.perf_counter()
    train_recipe(ENCODER, tmp_path / "one", *sets)
    one_s = time.perf_counter() - started
    run_two, output = encoder_on_two_processes(tmp_path_factory, no_dropout["bert"])
    assert output.count("run directory:") == 1, "the metrics table is printed by the main process only"
    assert_complete_run(run_two, "--num-processes 2")
    figures = assert_same_training(tmp_path / "one", run_two, steps=ENCODER_DDP_STEPS)
    ran = [json.loads((run / "manifest.json").read_text())["distributed"] for run in (tmp_path / "one", run_two)]
    precision = json.loads((run_two / "metrics.json").read_text())["precision"]
    assert ran[0] == {"type": "NO", "processes": 1, "machines": 1, "sharding": None, "precision": precision,
                      "devices": ["cpu"]}
    assert ran[1] == {"type": "MULTI_CPU", "processes": 2, "machines": 1, "sharding": None, "precision": precision,
                      "devices": ["cpu:0", "cpu:0"]}

    eval_one = json.loads((tmp_path / "one" / "metrics.json").read_text())["eval"]
    eval_two = json.loads((run_two / "metrics.json").read_text())["eval"]
    assert eval_one.keys() == eval_two.keys()
    for key in eval_one:  # accuracy & co. count examples: a repeated or lost one would change them
        assert eval_two[key] == pytest.approx(eval_one[key], rel=LOSS_RTOL, abs=1e-9), key
    # Predictions are shared out over the processes and gathered back: every eval example once, in order.
    one, two = (read_json_lines(run / "predictions.jsonl") for run in (tmp_path / "one", run_two))
    assert len(two) == 21
    assert [(p["input"], p["label"]) for p in two] == [(p["input"], p["label"]) for p in one]
    assert [p["probability"] for p in two] == pytest.approx([p["probability"] for p in one], abs=1e-4)
    print(f"encoder: 1 process {one_s:.0f} s, {figures}")


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several processes each: one such test at a time on a 2-core machine
def test_seq2seq_under_accelerate_launch_trains_and_scores_as_on_one(tmp_path, no_dropout):
    sets = (f"model.checkpoint={no_dropout['t5']}", *SAME_BATCHES,
            "data.max_eval_samples=20", "eval.batch_size=5", "eval.generation.max_new_tokens=12")
    started = time.perf_counter()
    train_recipe(SEQ2SEQ, tmp_path / "one", *sets)
    one_s = time.perf_counter() - started
    # The other way in: accelerate's own launcher, with the shipped CPU config, running the package.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", CPU_2PROC, "-m", "hftoolkit",
           "train", SEQ2SEQ, "--output", tmp_path / "two", *[a for s in sets for a in ("--set", s)]]
    rc, output, two_s = run_bounded(cmd, env={"ACCELERATE_USE_CPU": "true"})
    assert rc == 0, output[-4000:]
    assert_complete_run(tmp_path / "two", "--set training.sampling=sequential")
    figures = assert_same_training(tmp_path / "one", tmp_path / "two")

    eval_one = json.loads((tmp_path / "one" / "metrics.json").read_text())["eval"]
    eval_two = json.loads((tmp_path / "two" / "metrics.json").read_text())["eval"]
    assert {"loss", "bleu", "chrf"} <= eval_one.keys() == eval_two.keys()
    for key in eval_one:
        assert eval_two[key] == pytest.approx(eval_one[key], rel=LOSS_RTOL, abs=1e-9), key
    # Generation-scored eval: each example generated once (shared out, gathered in order).
    one, two = (read_json_lines(tmp_path / run / "predictions.jsonl") for run in ("one", "two"))
    assert len(two) == 20 and two == one
    print(f"seq2seq: 1 process {one_s:.0f} s, 2 processes {two_s:.0f} s, {figures}")


DPO_SETS = (*SAME_BATCHES, "data.max_eval_samples=32", "eval.batch_size=8", "eval.max_predictions=2",
            "eval.generation.max_new_tokens=2")


@pytest.fixture(scope="module")
def dpo_on_one_process(tmp_path_factory):
    """The DPO recipe on one process, which both launches below are held to."""
    run = tmp_path_factory.mktemp("dpo") / "one"
    train_recipe(PREFERENCE, run, *DPO_SETS)
    return run


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several processes each: one such test at a time on a 2-core machine
@pytest.mark.parametrize("spread", [["--num-processes", "2"],
                                    ["--accelerate-config", str(RECIPES / "accelerate" / "deepspeed-zero3.yaml")]],
                         ids=["ddp", "zero3"])
def test_preference_on_two_processes_trains_and_scores_as_on_one(tmp_path, dpo_on_one_process, spread):
    """TRL's DPO trainer under DDP, and under ZeRO-3, whose reference log-probabilities come from partitioned
    weights: the same per-step losses, weights and held-out rewards as one process (32 eval pairs in per-process
    batches of 8: no pair repeated to fill a batch). TRL under FSDP: ORPO, below."""
    overrides = [a for s in DPO_SETS for a in ("--set", s)]
    rc, output, _ = run_bounded([sys.executable, "-m", "hftoolkit", "train", PREFERENCE, "--output",
                                 tmp_path / "two", *spread, *overrides])
    assert rc == 0, output[-4000:]
    assert_complete_run(tmp_path / "two", spread[0])
    assert_same_training(dpo_on_one_process, tmp_path / "two")
    eval_one, eval_two = (json.loads((run / "metrics.json").read_text())["eval"]
                          for run in (dpo_on_one_process, tmp_path / "two"))
    for key in ("loss", "reward_accuracy", "reward_margin", "logps_chosen", "logps_rejected"):
        assert eval_two[key] == pytest.approx(eval_one[key], rel=LOSS_RTOL, abs=1e-6), key


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several processes each: one such test at a time on a 2-core machine
@pytest.mark.parametrize(("method", "spread"), [
    ("orpo", ["--accelerate-config", str(RECIPES / "accelerate" / "fsdp.yaml")]),
    ("kto", ["--accelerate-config", str(RECIPES / "accelerate" / "deepspeed-zero3.yaml")])],
    ids=["orpo-fsdp", "kto-zero3"])
def test_orpo_and_kto_on_two_processes_train_as_on_one(tmp_path, method, spread):
    """ORPO's NLL is a mean over the chosen tokens of all processes' batches, and KTO's KL answers are drawn from
    the batch of all processes: the same per-step losses and weights as one process, each under the sharding it
    shares least with DPO's cases above. (Their eval metrics are means of per-step means, and the steps group the
    eval set differently, so they are not compared.)"""
    sets = (*SAME_BATCHES, "data.max_eval_samples=16", "eval.max_predictions=0", f"preference.method={method}")
    train_recipe(PREFERENCE, tmp_path / "one", *sets)
    rc, output, _ = run_bounded([sys.executable, "-m", "hftoolkit", "train", PREFERENCE, "--output",
                                 tmp_path / "two", *spread, *[a for s in sets for a in ("--set", s)]])
    assert rc == 0, output[-4000:]
    assert_complete_run(tmp_path / "two", spread[0])
    assert_same_training(tmp_path / "one", tmp_path / "two")


# A process that fails (bad input on the main process, inside main_process_first, where the other one waits) ends
# the run instead of hanging: tests/e2e/test_kills.py, with the one-error check of what the processes find.


# ---------------------------------------------------------------- refused before anything starts


def test_batch_that_does_not_split_over_the_processes_is_refused():
    result = run_cli("train", ENCODER, "--num-processes", "3", "--set", "training.batch_size=16", expect=2)
    assert "training.batch_size: 16 examples per step do not split evenly over 3 processes" in result.output
    assert "multiple of 3" in result.output


def test_quantized_model_under_zero3_or_fsdp_is_refused(monkeypatch):
    import torch

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training.strategies import strategy_for
    from hftoolkit.training.strategies.launch import plan_from_config

    for config, name, bits in (("deepspeed-zero3.yaml", "DeepSpeed ZeRO-3", "4bit"), ("fsdp.yaml", "FSDP", "8bit")):
        path = RECIPES / "accelerate" / config
        result = run_cli("validate", ENCODER, "--set", f"model.quantization={bits}",
                         "--set", f"training.accelerate_config={path}", expect=2)
        assert f"model.quantization: {bits} (bitsandbytes) weights cannot be sharded" in result.output
        assert name in result.output and "use DDP" in result.output
    # QLoRA under FSDP (4-bit weights stored in the training dtype): accepted with GPUs, refused on CPU processes.
    recipe = load_recipe(ENCODER, ["model.quantization=4bit"])
    fsdp = strategy_for(plan_from_config(RECIPES / "accelerate" / "fsdp.yaml", None))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not [p for p in fsdp.problems(recipe) if "quantization" in p]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refusals = [p for p in fsdp.problems(recipe) if "quantization" in p]
    assert len(refusals) == 1 and "4bit under FSDP" in refusals[0] and "GPUs only" in refusals[0]
    # DDP keeps a whole quantized copy per process: accepted.
    run_cli("validate", ENCODER, "--set", "model.quantization=8bit",
            "--set", f"training.accelerate_config={RECIPES / 'accelerate' / 'ddp.yaml'}")


def test_bf16_under_deepspeed_on_cpu_processes_is_refused_in_one_line(monkeypatch):
    """transformers refuses bf16 where use_cpu is off, as DeepSpeed's CPU processes keep it: said before launching."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    zero3 = RECIPES / "accelerate" / "deepspeed-zero3.yaml"
    result = run_cli("validate", ENCODER, "--set", "training.precision=bf16", "--set",
                     f"training.accelerate_config={zero3}", expect=2)
    said = [line for line in result.output.splitlines() if line.strip()]
    assert len(said) == 1 and "training.precision: bf16 under DeepSpeed" in said[0] and "fp32" in said[0], said
    run_cli("validate", ENCODER, "--set", "training.precision=fp32", "--set", f"training.accelerate_config={zero3}")


def test_config_forcing_another_precision_is_refused(tmp_path):
    config = tmp_path / "fp16.yaml"
    config.write_text((RECIPES / "accelerate" / "ddp.yaml").read_text().replace("mixed_precision: 'no'",
                                                                                 "mixed_precision: fp16"))
    result = run_cli("train", ENCODER, "--accelerate-config", config, "--set", "training.precision=fp32", expect=2)
    assert "training.precision: fp32 disagrees with mixed_precision 'fp16'" in result.output


def test_missing_accelerate_config_is_named():
    result = run_cli("train", ENCODER, "--accelerate-config", "nowhere.yaml", expect=2)
    assert "accelerate config nowhere.yaml not found" in result.output


def test_relaunch_command_keeps_the_users_arguments_and_drops_the_launch_options(tmp_path):
    from hftoolkit.training.relaunch import launch_command
    from hftoolkit.training.strategies.launch import plan_from_config

    argv = ["train", "r.yaml", "--num-processes", "2", "--set", "a.b=1", "--accelerate-config=x.yaml", "--overwrite"]
    cmd, env = launch_command(plan_from_config(None, 2), argv, cuda=False)
    assert cmd[cmd.index("--num_processes") + 1] == "2" and "--multi_gpu" in cmd
    assert cmd[cmd.index("-m", 3):] == ["-m", "hftoolkit", "train", "r.yaml", "--set", "a.b=1", "--overwrite"]
    assert env["ACCELERATE_USE_CPU"] == "true"  # on a CPU-only machine: gloo, not a GPU search
    assert json.loads(env["HFTOOLKIT_COMMAND"]) == ["hftoolkit", *argv]
    # A MULTI_CPU config would start one process without mpirun: launched through torchrun instead.
    config = tmp_path / "multi-cpu.yaml"
    config.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: 'no'\n")
    cmd, _ = launch_command(plan_from_config(config, None), argv, cuda=False)
    assert cmd[cmd.index("--config_file") + 1] == str(config) and "--multi_gpu" in cmd


def test_recipe_names_its_accelerate_config():
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training.strategies import launch_strategy

    recipe = load_recipe(ENCODER, [f"training.accelerate_config={CPU_2PROC}"])
    plan = launch_strategy(recipe, None, None).launch
    assert plan.relaunch and plan.config == CPU_2PROC and plan.num_processes == 2
    assert launch_strategy(recipe, 4, None).launch.num_processes == 4  # --num-processes overrides the file's count


def test_a_launched_process_never_relaunches(monkeypatch):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training.strategies import launch_strategy

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    recipe = load_recipe(ENCODER)
    plan = launch_strategy(recipe, 2, None).launch
    assert not plan.relaunch and plan.num_processes == 2
    with pytest.raises(Exception, match="one of 2 that a launcher started already"):
        launch_strategy(recipe, 4, None)




@pytest.mark.parametrize("variable, asked", [("ACCELERATE_USE_FSDP", "FSDP"),
                                             ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED")])
def test_a_sharding_launch_that_accelerate_sets_up_as_ddp_stops_instead_of_training(monkeypatch, variable, asked):
    """A config asking for FSDP or ZeRO is never downgraded in silence: were accelerate to resolve the processes
    as plain DDP (a library change, a machine the patches in patches/ do not cover), the run stops."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from hftoolkit.base.errors import UserError
    from hftoolkit.training.strategies import strategy_for
    from hftoolkit.training.strategies.launch import plan_from_environment

    monkeypatch.setenv(variable, "true")
    strategy = strategy_for(plan_from_environment())
    state = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, num_processes=1, device="cpu")
    trainer = SimpleNamespace(accelerator=SimpleNamespace(state=state))
    with pytest.raises(UserError, match=f"the launch asked for {asked}, but accelerate set the processes up as "
                                        "MULTI_CPU"):
        strategy.record(trainer, "fp32")
    state.distributed_type = DistributedType[asked]
    assert strategy.record(trainer, "fp32")["type"] == asked


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several processes each: one such test at a time on a 2-core machine
def test_grpo_on_two_processes_samples_whole_groups_and_trains(tmp_path):
    """TRL's GRPO trainer over DDP trains, logs and scores as on one process. Each process samples answers for its
    share of the prompts from its own random stream, so the answers (and the weights) are not one process's and are
    not compared with a one-process run; TRL gathers every group's rewards over the processes."""
    reward = tmp_path / "vowels.py"
    reward.write_text("def vowels(completions, **_):\n"
                      "    return [sum(ch in 'aeiou' for ch in c) / max(len(c), 1) for c in completions]\n")
    sets = ("data.max_train_samples=32", "data.max_eval_samples=8", "training.max_steps=3", "training.logging_steps=1",
            "rl.max_completion_length=8", "eval.generation.max_new_tokens=8",
            f"rl.rewards=[{{function: {reward}:vowels}}]")
    rc, output, _ = run_bounded([sys.executable, "-m", "hftoolkit", "train", RECIPES / "decoder-grpo.yaml",
                                 "--output", tmp_path / "two", "--num-processes", "2",
                                 *[a for s in sets for a in ("--set", s)]])
    assert rc == 0, output[-4000:]
    assert_complete_run(tmp_path / "two", "--num-processes")
    steps = [r for r in read_json_lines(tmp_path / "two" / "log_history.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(0 <= r["rewards/vowels/mean"] <= 1 and r["num_tokens"] > 0 for r in steps)
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["distributed"]["processes"] == 2
    assert "reward" in json.loads((tmp_path / "two" / "metrics.json").read_text())["eval"]


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several processes each: one such test at a time on a 2-core machine
def test_a_reward_model_on_two_processes_or_accumulated_trains_and_scores_as_on_one(tmp_path, no_dropout):
    # The Bradley-Terry loss is the mean over a step's pairs: split over processes or micro-batches, the same.
    reward = RECIPES / "encoder-reward.yaml"
    sets = (f"model.checkpoint={no_dropout['bert']}", *SAME_BATCHES, "data.max_eval_samples=21", "eval.batch_size=8")
    train_recipe(reward, tmp_path / "one", *sets)
    train_recipe(reward, tmp_path / "accumulated", *sets, "training.batch_size=8", "training.gradient_accumulation=2")
    rc, output, _ = run_bounded([sys.executable, "-m", "hftoolkit", "train", reward, "--output", tmp_path / "two",
                                 "--num-processes", "2", *[a for s in sets for a in ("--set", s)]])
    assert rc == 0, output[-4000:]
    for other in ("accumulated", "two"):
        assert_same_training(tmp_path / "one", tmp_path / other, REWARD_NOISY_SHARE)
        one, two = (json.loads((tmp_path / run / "metrics.json").read_text())["eval"] for run in ("one", other))
        # (every held-out pair once. The loss sees only score differences, so the scores' common level gets a
        # gradient of rounding noise, which Adam turns into steps: the mean scores may shift together, not apart.)
        ranked = ("reward_accuracy", "reward_margin", "loss")
        assert {k: two[k] for k in ranked} == pytest.approx({k: one[k] for k in ranked}, rel=LOSS_RTOL, abs=1e-6)
        assert two["reward_chosen"] - two["reward_rejected"] == pytest.approx(two["reward_margin"], abs=1e-6)
