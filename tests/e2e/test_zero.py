"""DeepSpeed ZeRO-2 and ZeRO-3 executed on two CPU processes (DeepSpeed's CPU accelerator, gloo), through the CLI and
the shipped accelerate configs, equal training on one process.

The pairs of stage and LoRA or full fine-tuning whose partitions differ train once each on 2 processes, shared by the
tests below: ZeRO-2 full fine-tuning (gradients partitioned), ZeRO-3 with LoRA and ZeRO-3 full fine-tuning (the
weights partitioned and gathered to be saved); ZeRO-2 with LoRA partitions what ZeRO-2 full does, fewer of them.
The runs use a copy of the tiny BERT with every dropout at 0 and the same global batches as the 1-process run (see
tests/helpers/launches.py, whose tolerance derivation applies unchanged: ZeRO sums the same float32 gradients,
partitioned, as DDP does). What each process holds is asserted from inside the run, from manifest.json's
"distributed" record, which a user reads too.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import RECIPES, needs, run_cli
from tests.helpers.kills import assert_same_run, kill_chain
from tests.helpers.launches import LOSS_RTOL, STEPS, encoder_on_one_process, run_bounded, sharded_sets, step_losses

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes"), needs("deepspeed")]

ENCODER = RECIPES / "encoder-classification.yaml"
CONFIGS = {2: RECIPES / "accelerate" / "deepspeed-zero2.yaml", 3: RECIPES / "accelerate" / "deepspeed-zero3.yaml"}
CASES = [(2, False), (3, True), (3, False)]
IDS = [f"zero{stage}-{'lora' if lora else 'full'}" for stage, lora in CASES]
SAVE_EVERY = 2  # sharded_sets' training.save_steps: checkpoints at steps 2 and 4; ZeRO-2's resume starts from 2
AUTO_PRECISION = (3, False)  # the run that leaves training.precision at auto (DeepSpeed's CPU processes: fp32)


def sets_for(checkpoint: Path, lora: bool) -> list[str]:
    """What tests/e2e/test_fsdp.py trains too: a checkpoint every SAVE_EVERY steps."""
    return list(sharded_sets(checkpoint, lora))


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "hftoolkit", *map(str, args)]


@pytest.fixture(scope="session")
def one_process(no_dropout, tmp_path_factory):
    """lora -> the 1-process run of the same recipe (the one tests/e2e/test_fsdp.py holds its runs to)."""
    return {lora: encoder_on_one_process(tmp_path_factory, tuple(sets_for(no_dropout["bert"], lora)))
            for lora in (True, False)}


@pytest.fixture(scope="session")
def zero_runs(no_dropout, tmp_path_factory):
    """(stage, lora) -> the 2-process DeepSpeed run. AUTO_PRECISION's leaves training.precision at auto, which
    must resolve to the fp32 the others name (and the 1-process runs train in)."""
    root, runs = tmp_path_factory.mktemp("zero"), {}
    for (stage, lora), name in zip(CASES, IDS):
        sets = [s for s in sets_for(no_dropout["bert"], lora)
                if (stage, lora) != AUTO_PRECISION or not s.startswith("training.precision=")]
        overrides = [a for s in sets for a in ("--set", s)]
        rc, output, seconds = run_bounded(cli("train", ENCODER, "--output", root / name,
                                              "--accelerate-config", CONFIGS[stage], *overrides))
        assert rc == 0, output[-4000:]
        print(f"{name}: {seconds:.0f} s")
        (root / f"{name}.log").write_text(output)  # (what the command said, for the tests that read it)
        runs[stage, lora] = root / name
    return runs


def test_the_zero3_command_trains_with_auto_precision(zero_runs):
    """`hftoolkit train recipes/encoder-classification.yaml --accelerate-config recipes/accelerate/deepspeed-zero3.yaml`
    (2 processes, as the config says), precision left at auto: it trains, in fp32 (what DeepSpeed's CPU processes
    run), and where the CPU has bf16 matrix units (where auto alone would pick bf16) it says why it picked fp32."""
    from hftoolkit.job.hardware import cpu_bf16_features

    run = zero_runs[AUTO_PRECISION]
    output = (run.parent / f"{run.name}.log").read_text()
    manifest = json.loads((run / "manifest.json").read_text())
    assert "training.precision=" not in manifest["command"], "precision left at auto"
    assert manifest["resolved"]["precision"] == manifest["distributed"]["precision"] == "fp32"
    said = "auto picks fp32, not bf16: bf16 under DeepSpeed" in output
    assert said == bool(cpu_bf16_features()), output[-2000:]


def distributed(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())["distributed"]


@pytest.mark.parametrize("stage, lora", CASES, ids=IDS)
def test_runs_as_deepspeed_with_its_checkpoints(zero_runs, stage, lora):
    run = zero_runs[stage, lora]
    ran = distributed(run)
    assert (ran["type"], ran["sharding"], ran["processes"], ran["devices"]) == ("DEEPSPEED", f"ZeRO-{stage}", 2,
                                                                                ["cpu", "cpu"])
    # DeepSpeed's checkpoint: each process's partition in global_step folders, no single optimizer.pt.
    checkpoint = run / "checkpoints" / f"checkpoint-{STEPS}"
    assert (checkpoint / "latest").read_text().strip() == f"global_step{STEPS}"
    states = sorted(p.name for p in (checkpoint / f"global_step{STEPS}").iterdir())
    assert {f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)} <= set(states), states
    assert not (checkpoint / "optimizer.pt").exists()


@pytest.mark.parametrize("stage, lora", CASES, ids=IDS)
def test_each_process_holds_its_share(zero_runs, stage, lora):
    ran = distributed(zero_runs[stage, lora])
    # Adam keeps two moments per trainable parameter; partitioned, each process holds about half of them.
    trainable, held = ran["trainable_parameters"], ran["optimizer_state_per_process"]
    assert sum(held) >= 2 * trainable, f"moments missing: {held} for {trainable} trainable parameters"
    assert all(h <= trainable + 16 for h in held), f"not partitioned: {held} for {trainable} trainable parameters"
    if stage == 3:  # the model was built partitioned: every base weight is split as it loads
        at_load = ran["shards_at_load"]
        total, local = at_load["parameters"], at_load["parameters_per_process"]
        adapter = trainable if lora else 0  # LoRA's weights are made after the load, whole until DeepSpeed starts
        assert all(total / 2 <= n <= total / 2 + adapter + 16 for n in local), (local, total)
    else:
        assert "shards_at_load" not in ran


@pytest.mark.parametrize("stage, lora", CASES, ids=IDS)
def test_per_step_loss_equals_one_process(zero_runs, one_process, stage, lora):
    one, two = step_losses(one_process[lora]), step_losses(zero_runs[stage, lora])
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    rel = max(abs(two[s] - one[s]) / abs(one[s]) for s in one)
    assert rel < LOSS_RTOL, f"per-step losses differ: 1 process {one}, ZeRO-{stage} on 2 {two}"
    print(f"ZeRO-{stage} {'LoRA' if lora else 'full'}: max relative loss difference {rel:.2g}")


def saved_weights(run: Path, lora: bool) -> dict:
    """The run's adapter tensors, or its model's state dict as transformers loads it back (a ZeRO-3 save writes
    BERT's LayerNorm weights under their legacy names, gamma and beta, which loading maps back)."""
    if lora:
        from safetensors.torch import load_file

        return load_file(run / "adapter" / "adapter_model.safetensors")
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(run / "model").state_dict()


@pytest.mark.parametrize("stage, lora", CASES, ids=IDS)
def test_saved_weights_are_whole_and_score_as_the_run_did(zero_runs, one_process, stage, lora):
    """The adapter or model folder holds every tensor at its full shape (ZeRO gathers the partitions before it
    writes), and `hftoolkit eval` on it alone, in one process, scores as the run did."""
    import yaml

    run = zero_runs[stage, lora]
    saved, reference = saved_weights(run, lora), saved_weights(one_process[lora], lora)
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in reference.items()}
    # The weights agree as tests/helpers/launches.py bounds them (Adam's steps where a gradient is float noise).
    lr = yaml.safe_load((run / "recipe.yaml").read_text())["training"]["learning_rate"]
    assert max(float((saved[k] - reference[k]).abs().max()) for k in saved) <= 2 * lr * STEPS
    trained = json.loads((run / "metrics.json").read_text())["eval"]
    run_cli("eval", run)
    again = json.loads((run / "metrics.json").read_text())["eval"]
    assert again["loss"] == pytest.approx(trained["loss"], rel=LOSS_RTOL)
    assert again["accuracy"] == trained["accuracy"]


@pytest.mark.parametrize("stage, lora", [(2, False)], ids=["zero2-full"])
def test_killed_and_resumed_continues_exactly(zero_runs, tmp_path, stage, lora):
    """A copy of the run as a kill after checkpoint 2 leaves it (its later checkpoint and results gone, the manifest
    still "running"), then `train --resume`: the steps after it and the saved weights are those of the uninterrupted
    run (DeepSpeed reloads each process's partition of ZeRO-2's optimizer state). How a killed DeepSpeed run ends
    (every process gone, its checkpoints whole) is the ZeRO-3 chain's, the next test."""
    uninterrupted = zero_runs[stage, lora]
    killed = tmp_path / "killed"
    shutil.copytree(uninterrupted, killed)
    for later in (killed / "checkpoints").iterdir():
        if later.name != f"checkpoint-{SAVE_EVERY}":
            shutil.rmtree(later)
    manifest = json.loads((killed / "manifest.json").read_text())
    (killed / "manifest.json").write_text(json.dumps({**manifest, "status": "running", "finished": None}))

    rc, output, seconds = run_bounded(cli("train", "--resume", killed, "--accelerate-config", CONFIGS[stage]))
    assert rc == 0, output[-4000:]
    assert json.loads((killed / "manifest.json").read_text())["resumed_from"].endswith(f"checkpoint-{SAVE_EVERY}")
    assert step_losses(killed) == step_losses(uninterrupted)
    resumed, reference = saved_weights(killed, lora), saved_weights(uninterrupted, lora)
    assert max(float((resumed[k] - reference[k]).abs().max()) for k in reference) <= 1e-6
    print(f"ZeRO-{stage} {'LoRA' if lora else 'full'}: resumed in {seconds:.0f} s")


def test_zero3_killed_and_resumed_ends_as_the_uninterrupted_run(zero_runs, no_dropout, tmp_path):
    """tests/e2e/test_kills.py's chain under ZeRO-3 (LoRA): one training process SIGKILLed after checkpoint 1, then
    --resume from the partitioned checkpoint (every other interruption: test_kills.py, under DDP)."""
    overrides = [a for s in (*sets_for(no_dropout["bert"], True), "training.save_steps=1") for a in ("--set", s)]
    kill_chain(tmp_path, [str(ENCODER), *overrides], tmp_path / "killed", ["one-worker"],
               ("--accelerate-config", str(CONFIGS[3])))
    assert_same_run(tmp_path / "killed", zero_runs[3, True])
