"""Training options that reach the Trainer, peft and bitsandbytes: precision, optimizers, schedules, attention,
gradient checkpointing, LoRA variants, 4-bit settings, data loader workers, trackers, and the CLI's
--version and -h. Each is checked on what it does here (the optimizer built, the weights trained, the memory
used), and the GPU-only ones are refused on this CPU with one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import RECIPES, plain, run_cli, train_recipe
from tests.helpers.resume import kill_when_paused, killed_on_error, losses, start_training

ENCODER = RECIPES / "encoder-classification.yaml"
TINY = ("data.max_train_samples=24", "data.max_eval_samples=8", "training.batch_size=8", "training.epochs=3",
        "training.logging_steps=1", "eval.max_predictions=4")


def build(tmp_path, *sets: str, recipe_path=ENCODER):
    """(recipe, trainer) as train.py builds them, without training."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.runs.rundir import RunDirectory
    from hftoolkit.training.throughput import TokenCounter
    from hftoolkit.training.trainer import build_trainer

    job = resolve_job(load_recipe(recipe_path, [*TINY, *sets]))
    form = formulation(job)
    model, processor = form.load_model(job)
    encoded = {split: form.preprocess(job, processor, ds) for split, ds in job.data.items()}
    counter = TokenCounter(form.collator(job, processor))
    trainer = build_trainer(job, RunDirectory(tmp_path / "run"), model, processor, encoded, counter,
                            form.metrics(job, processor), data=job.data)
    return job.recipe, trainer


def recipe_with(*sets: str, path=ENCODER):
    from hftoolkit.config.recipe import load_recipe

    return load_recipe(path, list(sets))


# ---------------------------------------------------------------- recipe keys and the CLI


def test_trainer_names_are_answered_with_the_recipe_key(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: t\ntask: classification\nnum_train_epochs: 3\nmodel: {checkpoint: init:bert}\n"
                      "data: {train: builtin:sentiment, dataloader_num_workers: 2}\n"
                      "training: {per_device_train_batch_size: 8, gradient_accumulation_steps: 2, optim: sgd}\n"
                      "lora: {lora_r: 4, use_dora: true}\n")
    text = plain(run_cli("validate", recipe, expect=2).output)
    for where, ours in [("num_train_epochs", "training.epochs"), ("data.dataloader_num_workers", "data.num_workers"),
                        ("training.per_device_train_batch_size", "training.batch_size"),
                        ("training.gradient_accumulation_steps", "training.gradient_accumulation"),
                        ("training.optim", "training.optimizer"), ("lora.lora_r", "lora.r"),
                        ("lora.use_dora", "lora.variant")]:
        name = where.rsplit(".", 1)[-1]
        assert f"{where}: unknown key: the recipe's name for '{name}' is '{ours}'" in text


def test_version_and_short_help():
    from hftoolkit import __version__

    assert run_cli("--version").output.startswith(f"hftoolkit {__version__} (torch ")
    assert "Commands:" in run_cli("-h").output
    assert "--resume" in run_cli("train", "-h").output
    # --version is a light command: it reads the other versions from the installed metadata.
    code = "from hftoolkit.cli.app import main\nmain()\n"
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code, "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "transformers 5." in out.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "typer" in imported and not {"torch", "transformers", "peft"} & imported


FP16_ON_A_CPU = ("training.precision: fp16 mixed precision is for GPUs, and this machine has none (a CPU's half "
                 "precision is bf16: fp32's range, no loss scaling): set training.precision to fp32, or bf16 on a CPU "
                 "with bf16 matrix units (auto picks for this machine)")


def test_gpu_only_keys_are_refused_on_this_cpu_before_anything_is_written(tmp_path):
    sets = ("model.attention=flash_attention_2", "training.tf32=true", "training.precision=fp16")
    gpu_only = [a for s in sets for a in ("--set", s)]
    run_cli("validate", ENCODER, *gpu_only)  # a recipe for a GPU server validates anywhere
    run = tmp_path / "run"
    result = train_recipe(ENCODER, run, *sets, expect=2)
    text = plain(result.output)
    assert "model.attention: flash_attention_2 runs on NVIDIA GPUs only" in text
    assert "training.tf32: TF32 matmuls need an NVIDIA Ampere or newer GPU" in text
    assert FP16_ON_A_CPU in text, text
    assert not run.exists()
    planned = plain(run_cli("plan", ENCODER, "--set", "training.precision=fp16", expect=2).output)
    assert planned == f"Error: {FP16_ON_A_CPU}", "plan refuses it in train's words, and only it"


def test_fp16_is_refused_on_a_cpu_only(monkeypatch):
    import torch

    from hftoolkit.job.hardware import hardware_problems

    for cuda, expected in ((False, [FP16_ON_A_CPU]), (True, [])):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert hardware_problems(recipe_with("training.precision=fp16")) == expected
        assert hardware_problems(recipe_with("training.precision=fp32")) == []


BF16_WITHOUT_UNITS = ("training.precision: bf16 on this CPU trains slower than fp32: it has no bf16 matrix units "
                      "(amx_bf16 or avx512_bf16), so torch emulates every bf16 product through fp32; set "
                      "training.precision to fp32, or auto (which picks fp32 here)")


def test_bf16_is_warned_about_on_a_cpu_without_bf16_matrix_units_only(monkeypatch):
    from hftoolkit.job import hardware

    for features, expected in ((["avx512_bf16"], None), ([], BF16_WITHOUT_UNITS)):
        monkeypatch.setattr(hardware, "cpu_bf16_features", lambda features=features: features)
        assert hardware.precision_warning("bf16", cuda=False) == expected
        assert hardware.precision_warning("bf16", cuda=True) is None  # a GPU's bf16 is its own
        assert hardware.precision_warning("fp32", cuda=False) is None


@pytest.mark.slow
@pytest.mark.parametrize("features", [["amx_bf16"], []], ids=["bf16-units", "no-bf16-units"])
def test_bf16_on_a_cpu_without_bf16_units_trains_with_a_warning_plan_says_too(monkeypatch, features):
    """train's warning (the job's, printed as the run starts) and plan's are one line, only where the CPU has no
    bf16 matrix units."""
    import torch

    from hftoolkit.job import hardware
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.training.strategies import LaunchPlan, strategy_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "cpu_bf16_features", lambda: features)
    expected = [] if features else [BF16_WITHOUT_UNITS]
    job = resolve_job(recipe_with("training.precision=bf16", "data.max_train_samples=8", "data.max_eval_samples=4"),
                      strategy=strategy_for(LaunchPlan()))
    assert job.precision == "bf16" and job.findings.warnings == expected
    assert not resolve_job(recipe_with("data.max_train_samples=8", "data.max_eval_samples=4"),
                           strategy=strategy_for(LaunchPlan())).findings.warnings  # auto: fp32 or the CPU's bf16
    said = run_cli("plan", ENCODER, "--set", "training.precision=bf16").stderr
    assert [line for line in said.splitlines() if line.startswith("warning:")] == [f"warning: {w}" for w in expected]


def test_flash_attention_without_its_package_is_refused_on_a_gpu(monkeypatch):
    import importlib.util

    import torch

    from hftoolkit.job.hardware import hardware_problems

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    problems = hardware_problems(recipe_with("model.attention=flash_attention_2"))
    assert problems == ["model.attention: flash_attention_2 needs the flash-attn package, which is not installed: "
                        "pip install flash-attn --no-build-isolation, or use sdpa"]


# ---------------------------------------------------------------- precision


@pytest.mark.parametrize("cuda, bf16, checkpoint, expected", [
    (False, False, "init:bert", "fp32"), (False, True, "init:bert", "bf16"), (False, True, "init:t5", "bf16"),
    (True, True, "init:bert", "bf16"), (True, False, "init:bert", "fp16"),
    (True, False, "init:t5", "fp32"), (True, True, "init:t5", "bf16")])
def test_precision_auto_follows_the_machine(monkeypatch, cuda, bf16, checkpoint, expected):
    """`bf16` is the GPU's bf16 support, or on a CPU its bf16 matrix features (AMX or AVX-512 BF16)."""
    import torch

    from hftoolkit.job import hardware
    from hftoolkit.job.precision import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(hardware, "cpu_bf16_features", lambda: ["avx512_bf16"] if bf16 and not cuda else [])
    assert recipe_with(f"model.checkpoint={checkpoint}").training.precision == "auto"  # the default
    assert resolve_precision("auto", checkpoint.removeprefix("init:")) == expected
    assert resolve_precision("fp32", checkpoint.removeprefix("init:")) == "fp32"


@pytest.mark.parametrize("capabilities, features", [
    ({"amx_bf16": True, "avx512_bf16": True, "avx2": True}, ["amx_bf16", "avx512_bf16"]),
    ({"avx512_bf16": True, "avx512_f": True}, ["avx512_bf16"]),
    ({"avx512_f": True, "avx2": True, "avx512_bf16": False}, []), ({"avx2": True}, []), ({}, [])])
def test_cpu_bf16_features_are_amx_or_avx512_bf16_as_torch_reports_them(monkeypatch, capabilities, features):
    import torch

    from hftoolkit.job import hardware
    from hftoolkit.job.precision import resolve_precision

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"cpu_name": "Some CPU", **capabilities})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.cpu_bf16_features() == features
    assert hardware.cpu_record() == {"name": "Some CPU", "bf16_matrix_features": features}
    assert resolve_precision("auto", "bert") == ("bf16" if features else "fp32")


@pytest.mark.slow
@pytest.mark.parametrize("features, precision", [(["avx512_bf16"], "bf16"), ([], "fp32")])
def test_a_run_records_the_precision_auto_picked_and_the_cpu_features_behind_it(monkeypatch, tmp_path, features,
                                                                               precision):
    from hftoolkit.job import hardware

    monkeypatch.setattr(hardware, "cpu_bf16_features", lambda: features)
    run = tmp_path / "run"
    train_recipe(ENCODER, run, "training.max_steps=2")
    metrics, manifest = (json.loads((run / f).read_text()) for f in ("metrics.json", "manifest.json"))
    assert metrics["precision"] == manifest["resolved"]["precision"] == precision
    assert metrics["cpu"]["bf16_matrix_features"] == manifest["resolved"]["cpu"]["bf16_matrix_features"] == features


def test_launcher_mixed_precision_is_compared_with_what_auto_resolves_to(monkeypatch):
    from hftoolkit.job import hardware
    from hftoolkit.training.strategies import LaunchPlan, strategy_for

    monkeypatch.setattr(hardware, "cpu_bf16_features", lambda: [])  # a CPU without bf16 matrix units

    def check(recipe, launch):
        return strategy_for(launch).problems(recipe)

    recipe = recipe_with()
    assert check(recipe, LaunchPlan(mixed_precision="no")) == []
    assert check(recipe_with("training.precision=bf16"), LaunchPlan(mixed_precision="bf16")) == []
    problems = check(recipe, LaunchPlan(mixed_precision="bf16", source="the launcher"))
    assert problems == ["training.precision: fp32 disagrees with mixed_precision 'bf16' of the launcher (auto picks "
                        "fp32 on this machine): set mixed_precision: 'no' in the config (the recipe's "
                        "training.precision decides)"]


def test_the_launchers_precision_is_checked_for_the_model_type_the_job_resolved(monkeypatch):
    """On GPUs without bf16, auto trains a T5 in fp32 (its activations overflow fp16) and a BERT in fp16: a launch
    config's fp16 disagrees with the first only. The model type is the one the caller hands down (the resolved
    job's), not what the checkpoint's files say: a hub id's files say nothing before it is downloaded."""
    import torch

    from hftoolkit.training.strategies import LaunchPlan, strategy_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    ddp = strategy_for(LaunchPlan(num_processes=2, mixed_precision="fp16", source="the launcher"))
    recipe = recipe_with()  # (its checkpoint, init:bert, would say bert)
    assert ddp.problems(recipe, cuda=True, model_type="t5") == [
        "training.precision: fp32 disagrees with mixed_precision 'fp16' of the launcher (auto picks fp32 on this "
        "machine): set mixed_precision: 'no' in the config (the recipe's training.precision decides)"]
    assert ddp.problems(recipe, cuda=True, model_type="bert") == []


@pytest.mark.parametrize("features", [["avx512_bf16"], []], ids=["bf16-units", "no-bf16-units"])
def test_auto_under_deepspeed_on_cpu_processes_picks_fp32_and_says_why(monkeypatch, features):
    """auto picks what the strategy can run on the device: DeepSpeed's CPU processes train in fp32 only, so auto
    steps down from the CPU's bf16 there (and says why), and validate accepts the recipe on either kind of CPU."""
    import torch

    from hftoolkit.job import hardware
    from hftoolkit.job.precision import precision_and_reason
    from hftoolkit.training.strategies import strategy_for
    from hftoolkit.training.strategies.launch import plan_from_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "cpu_bf16_features", lambda: features)
    zero3 = strategy_for(plan_from_config(RECIPES / "accelerate" / "deepspeed-zero3.yaml", 2, "--accelerate-config"))
    precision, why = precision_and_reason("auto", "bert", zero3)
    assert precision == "fp32"
    if features:
        assert why.startswith("auto picks fp32, not bf16: bf16 under DeepSpeed") and "CPU processes" in why
    else:
        assert why is None  # the CPU's own pick: nothing stepped down
    assert precision_and_reason("auto", "bert", strategy_for(plan_from_config(None, 2)))[0] == (
        "bf16" if features else "fp32")  # DDP runs the CPU's pick
    assert zero3.problems(recipe_with()) == []
    assert zero3.problems(recipe_with("training.precision=bf16"))  # named, not auto: refused in one line


@pytest.mark.slow
def test_plan_rows_carry_each_strategys_precision(monkeypatch, tmp_path):
    """plan shows every strategy at once: each row is planned in the precision auto picks for it."""
    import torch

    from hftoolkit.job import hardware
    from hftoolkit.job.devices import this_machine
    from hftoolkit.planning.plan import plan_recipe
    from hftoolkit.training.strategies.launch import plan_from_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "cpu_bf16_features", lambda: ["amx_bf16"])
    planned = plan_recipe(recipe_with(), plan_from_config(None, 2), this_machine())
    precisions = {row.name: row.precision for row in planned.strategies if not row.not_possible}
    assert planned.precision == precisions["ddp"] == precisions["single"] == "bf16"
    if "zero3" in precisions:  # (DeepSpeed installed)
        assert precisions["zero3"] == precisions["zero2"] == "fp32"


@pytest.mark.slow
@pytest.mark.parametrize("recipe_path", [ENCODER, RECIPES / "seq2seq-translation-t5.yaml"])
def test_bf16_on_a_cpu_casts_frozen_weights_once_and_trains_the_same_numbers(tmp_path, recipe_path):
    """A LoRA run's frozen linear weights are held in bf16 while it trains under bf16 autocast on a CPU (what autocast
    would cast them to at every step): losses, evals (T5's generated and scored outside autocast) and adapters are
    bit for bit those of the per-step casts, and training's end gives back the very fp32 weights it began with."""
    from collections import Counter

    import torch
    from transformers import TrainerCallback

    seen = {}

    class Dtypes(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            seen.setdefault(cast, Counter(str(p.dtype) for p in model.parameters() if not p.requires_grad))

    runs = {}
    for cast in (True, False):
        torch.manual_seed(0)  # (the adapters' initial weights: the same for both)
        _, trainer = build(tmp_path / str(cast), "training.precision=bf16", "training.max_steps=3", "eval.every=2",
                           "training.logging_steps=1", recipe_path=recipe_path)
        assert trainer.frozen_in_bf16
        trainer.frozen_in_bf16 = cast
        trainer.add_callback(Dtypes())
        before = dict(trainer.model.named_parameters())
        trainer.train()
        after = dict(trainer.model.named_parameters())
        assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
        assert {p.dtype for p in after.values()} == {torch.float32}
        runs[cast] = ([{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
                       for e in trainer.state.log_history],
                      {k: v.detach().clone() for k, v in after.items() if v.requires_grad})
    assert seen[True]["torch.bfloat16"] > 0 and "torch.bfloat16" not in seen[False], seen
    assert any("eval_loss" in e for e in runs[True][0]) and runs[True][0] == runs[False][0]
    assert all(torch.equal(runs[True][1][k], runs[False][1][k]) for k in runs[False][1])


# ---------------------------------------------------------------- optimizers and schedules


@pytest.mark.parametrize("name, expected", [("adamw", "torch.optim.adamw.AdamW"),
                                            ("adamw_fused", "torch.optim.adamw.AdamW"),
                                            ("adamw_8bit", "bitsandbytes.optim.adamw.AdamW"),
                                            ("paged_adamw_8bit", "bitsandbytes.optim.adamw.AdamW"),
                                            ("adafactor", "transformers.optimization.Adafactor"),
                                            ("sgd", "torch.optim.sgd.SGD")])
def test_each_optimizer_is_the_trainers_own(tmp_path, name, expected):
    _, trainer = build(tmp_path, f"training.optimizer={name}")
    optimizer = trainer.create_optimizer()
    assert f"{type(optimizer).__module__}.{type(optimizer).__name__}" == expected
    if expected.startswith("torch.optim.adamw"):
        assert bool(optimizer.defaults.get("fused")) == (name == "adamw_fused")
    if expected.startswith("bitsandbytes"):
        assert optimizer.args.optim_bits == 8 and optimizer.is_paged == name.startswith("paged")


def test_adamw_8bit_trains_on_this_cpu_with_8_bit_moments(tmp_path):
    import torch

    run = tmp_path / "run"
    train_recipe(ENCODER, run, *TINY, "lora.enabled=false", "training.optimizer=adamw_8bit", "training.max_steps=3",
                 "training.save_steps=3")
    assert all(abs(loss) < 10 for loss in losses(run).values())
    state = torch.load(run / "checkpoints" / "checkpoint-3" / "optimizer.pt", weights_only=True)["state"]
    moments = [s["__bnb_optimizer_quant_state__"] for s in state.values()]
    # bitsandbytes keeps the moments of tensors of 4096 elements or more in 8 bits: here the linear layers'
    # (6 a layer, 2 layers, and the pooler; the Trainer keeps the embeddings' in 32 bits).
    eight_bit = [m["state1"].shape for m in moments if m["state1"].dtype == torch.uint8]
    assert len(eight_bit) == 13 and all(shape.numel() >= 4096 for shape in eight_bit), eight_bit


def test_warmup_steps_and_the_other_schedules(tmp_path):
    from hftoolkit.config.sections import TrainingSection

    _, trainer = build(tmp_path, "training.warmup_ratio=0", "training.warmup_steps=4",
                       "training.scheduler=constant_with_warmup",
                       "training.learning_rate=0.01")
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    rates = []
    for _ in range(6):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert rates == pytest.approx([0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01])
    with pytest.raises(Exception, match="warmup_steps and training.warmup_ratio"):
        recipe_with("training.warmup_steps=4", "training.warmup_ratio=0.1")
    # Every schedule the recipe accepts is one the Trainer builds with no further settings.
    from transformers.trainer_utils import SchedulerType

    schedules = TrainingSection.model_fields["scheduler"].annotation.__args__
    assert {"cosine_with_restarts", "polynomial", "inverse_sqrt", "reduce_lr_on_plateau"} <= set(schedules)
    for schedule in schedules:
        trainer.args.lr_scheduler_type, trainer.lr_scheduler = SchedulerType(schedule), None
        assert trainer.create_scheduler(num_training_steps=10, optimizer=trainer.optimizer) is not None, schedule


# ---------------------------------------------------------------- model: attention, LoRA variants, 4-bit


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_attention_implementation_reaches_the_model(attention):
    model, _ = loaded_model(f"model.attention={attention}")
    assert model.config._attn_implementation == attention


def loaded_model(*sets: str):
    """(model, processor) of the encoder recipe with `sets`, as train.py loads them (the data is not read)."""
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation

    job = resolve_job(recipe_with(*sets, "data.label_names=[negative, positive]"), data=False)
    assert job.family == "encoder"
    return formulation(job).load_model(job)


def lora_model(*sets: str):
    from hftoolkit.models.loading import count_parameters

    model, _ = loaded_model(*sets)
    return model, count_parameters(model)[0]


def adapted_layers(model) -> list:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def test_dora_rslora_and_all_linear_change_what_is_trained():
    lora, lora_count = lora_model()
    layers = adapted_layers(lora)
    assert len(layers) == 4  # query and value of 2 layers
    dora, dora_count = lora_model("lora.variant=dora")
    # DoRA trains one magnitude per output feature of each adapted layer, on top of LoRA's A and B.
    assert dora_count - lora_count == sum(layer.out_features for layer in layers)
    rslora, rslora_count = lora_model("lora.variant=rslora", "lora.r=4", "lora.alpha=8")
    assert rslora_count < lora_count  # (r 4 instead of 8)
    assert adapted_layers(rslora)[0].scaling["default"] == pytest.approx(8 / 4**0.5)  # alpha / sqrt(r), not 2
    every, every_count = lora_model("lora.targets=all-linear")
    linear = adapted_layers(every)
    # Per layer: query, key, value, attention output, intermediate, output; and the pooler (the classifier, the
    # task head, is trained in full instead).
    assert len(linear) == 2 * 6 + 1
    assert every_count - lora_count == sum(8 * (m.in_features + m.out_features) for m in linear) - sum(
        8 * (m.in_features + m.out_features) for m in layers)


@pytest.mark.slow
def test_4bit_double_quant_and_compute_dtype_reach_bitsandbytes():
    import torch

    from hftoolkit.config.recipe import RecipeError

    model, _ = lora_model("model.quantization=4bit", "model.double_quant=true", "model.compute_dtype=bfloat16")
    base = adapted_layers(model)[0].base_layer
    assert type(base).__name__ == "Linear4bit"
    assert base.weight.quant_state.nested, "double quantization keeps its constants quantized too"
    assert base.compute_dtype == torch.bfloat16
    plain_model, _ = lora_model("model.quantization=4bit", "training.precision=fp32")
    plain_base = adapted_layers(plain_model)[0].base_layer
    # compute_dtype auto follows the precision the run trains in
    assert not plain_base.weight.quant_state.nested and plain_base.compute_dtype == torch.float32
    with pytest.raises(RecipeError, match="double_quant applies to 4-bit weights only"):
        recipe_with("model.quantization=8bit", "model.double_quant=true")


# ---------------------------------------------------------------- gradient checkpointing


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["none", "8bit", "4bit"])
def test_gradient_checkpointing_trains_lora_under_quantized_and_plain_weights(tmp_path, quantization):
    # LoRA's B starts at zero: it moves only if gradients flow back through the recomputed layers
    # (reentrant checkpointing under a frozen base would leave it at zero).
    recipe, trainer = build(tmp_path, "training.gradient_checkpointing=true", f"model.quantization={quantization}",
                            "training.max_steps=2")
    trainer.train()
    base = trainer.model.base_model.model
    assert base.is_activation_checkpointing and base.bert.encoder.layer[0].gradient_checkpointing
    moved = [float(m.lora_B["default"].weight.abs().max()) for m in adapted_layers(trainer.model)]
    assert min(moved) > 0, moved


MEMORY_SCRIPT = """
import sys
from pathlib import Path
from hftoolkit.config.recipe import load_recipe
from hftoolkit.base.memory import resident_peak_kb, reset_peak_memory
from hftoolkit.workflows.train import train

for checkpointing in ("true", "false"):  # each variant's own peak: the count starts again before each
    reset_peak_memory()
    recipe = load_recipe(sys.argv[1], [f"training.gradient_checkpointing={checkpointing}"])
    train(recipe, Path(sys.argv[2]) / checkpointing, command=["test"])
    print("PEAK", checkpointing, resident_peak_kb() / 1024, flush=True)
"""


@pytest.mark.slow
def test_gradient_checkpointing_lowers_peak_memory(tmp_path):
    # A mid-size BERT (hidden 256, 8 layers, sequences of 384 tokens): activations dominate its memory.
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from hftoolkit.sources.tiny import ensure_tiny

    folder = tmp_path / "bert-mid"
    tokenizer = ensure_tiny("bert")
    vocab = len(AutoTokenizer.from_pretrained(tokenizer))  # preflight refuses a tokenizer that does not fit
    config = BertConfig(vocab_size=vocab, hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=512)
    BertForSequenceClassification(config).save_pretrained(folder)
    for file in tokenizer.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "vocab")):
            (folder / file.name).write_bytes(file.read_bytes())
    words = "the quick brown fox jumps over a lazy dog while rain falls".split()
    rows = [{"text": " ".join(words[(i + j) % len(words)] for j in range(400)), "label": i % 2} for i in range(16)]
    data = tmp_path / "long.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    recipe = tmp_path / "mid.yaml"
    recipe.write_text(json.dumps({
        "name": "mid", "task": "classification", "model": {"checkpoint": str(folder)},
        "data": {"train": str(data), "eval": str(data), "max_length": 384, "max_eval_samples": 2},
        "training": {"max_steps": 1, "batch_size": 8}, "eval": {"max_predictions": 0}}))
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(recipe), str(tmp_path)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    peaks = {line.split()[1]: float(line.split()[2]) for line in out.stdout.splitlines() if line.startswith("PEAK")}
    print(f"peak RSS with checkpointing {peaks['true']:.0f} MB, without {peaks['false']:.0f} MB")
    assert peaks["false"] - peaks["true"] > 100, peaks


# ---------------------------------------------------------------- data loader workers


@pytest.mark.slow
def test_workers_keep_the_batches_and_an_exact_resume(tmp_path):
    # Reference: no workers, uninterrupted. The other run loads with 2 worker processes, is SIGKILLed after
    # checkpoint 4 (mid-epoch 2) and resumed: the same loss at every step, counted tokens on the main process.
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    sets = (*TINY, "training.save_steps=2")
    process = start_training(ENCODER, killed, (*sets, "data.num_workers=2"), HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="4")
    with killed_on_error(process):
        train_recipe(ENCODER, reference, *sets)
    kill_when_paused(process)
    run_cli("train", "--resume", killed)
    ref, res = losses(reference), losses(killed)
    assert sorted(res) == list(range(1, 10))
    assert max(abs(ref[s] - res[s]) for s in ref) <= 1e-6
    metrics = json.loads((killed / "metrics.json").read_text())
    assert metrics["tokens_per_second"] and 0 < metrics["padding_fraction"] < 1


def test_workers_and_pinned_memory_reach_the_data_loader(tmp_path):
    _, trainer = build(tmp_path, "data.num_workers=2")
    loader = trainer.get_train_dataloader()
    assert loader.base_dataloader.num_workers == 2 if hasattr(loader, "base_dataloader") else loader.num_workers == 2
    assert trainer.args.dataloader_pin_memory is False  # pinned only on CUDA


# ---------------------------------------------------------------- compile and trackers


def test_compile_run_name_and_project_reach_the_trainer(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    recipe, trainer = build(tmp_path, "training.compile=true", "training.project=course",
                            "training.report_to=[tensorboard]")
    assert trainer.args.torch_compile and trainer.args.run_name == recipe.name
    assert trainer.args.project == "course"  # trackio reads it there

    from hftoolkit.config.recipe import replaced
    from hftoolkit.training.arguments import _tracker_project

    recipe = replaced(recipe, {"training.report_to": ["wandb", "mlflow"]})
    _tracker_project(recipe.training)
    import os

    assert os.environ["WANDB_PROJECT"] == "course" and os.environ["MLFLOW_EXPERIMENT_NAME"] == "course"
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")


def test_tensorboard_writes_event_files_into_the_run_directory(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is an extra: pip install 'hftoolkit[tensorboard]'")
    run = tmp_path / "run"
    train_recipe(ENCODER, run, *TINY, "training.report_to=[tensorboard]", "training.max_steps=2")
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    assert not (run / "checkpoints" / "runs").exists()
