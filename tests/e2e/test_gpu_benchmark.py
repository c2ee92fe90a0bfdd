"""benchmarks/gpu.py's parts that need no GPU: its recipes validate, the peak table, the weights it picks without
a cache, the skip lines, the QLoRA step (on CPU), the table it prints, and the wheels an air-gapped server needs
(the benchmark run where only the server's packages and those wheels import)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.hub_cache import plant_model, use_hf_home

# What the air-gapped server has: these, with what their own metadata requires.
SERVER_HAS = ("torch", "transformers", "peft", "accelerate", "typer")
WHEEL_LIST = ROOT / "benchmarks" / "airgapped-wheels.txt"


@pytest.fixture(scope="session")
def gpu():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_variant_is_a_valid_recipe(gpu, tmp_path, capsys):
    from hftoolkit.config.recipe import validate_recipe

    for variant in gpu.VARIANTS:
        recipe = validate_recipe(gpu.recipe_for(variant, "google-bert/bert-base-uncased", tmp_path / "t.csv",
                                                tmp_path / "d.csv", 32), variant)
        assert recipe.training.precision == "bf16" and recipe.lora.enabled == ("LoRA" in variant)
    gpu.main(["--dry-run", "--variants", "LoRA + 4-bit"])
    out = capsys.readouterr().out
    assert out.startswith("LoRA + 4-bit:") and '"double_quant": true' in out


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0),
                                        ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                        ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0), ("Some Future GPU", None)])
def test_peak_table_matches_device_names(gpu, name, peak):
    assert gpu.peak_tflops(name, None) == peak
    assert gpu.peak_tflops(name, 500.0) == 500.0


def test_the_table_shows_mfu_against_the_peak(gpu):
    row = {"train_seconds": 60.0, "samples_per_second": 333.3, "tokens_per_second": 9000.0,
           "flops_per_second": 98.9e12, "peak_memory_mb": 2048.0, "eval": {"accuracy": 0.9151}}
    table = gpu.format_table({"full fine-tuning bf16": row, "full fine-tuning bf16, DDP x2": {**row, "processes": 2},
                              "LoRA + 8-bit": {"error": "out of memory"}}, peak=989.0, notes=("weights: random",))
    lines = table.splitlines()
    assert lines[0] == "weights: random" and "MFU" in lines[1]
    assert "10.0%" in lines[3] and "5.0%" in lines[4] and "0.9151" in lines[3]
    assert lines[5].endswith("failed: out of memory")


def test_each_run_adds_its_plan_beside_what_it_measured(gpu):
    plan = {"planned_peak_mb": 1600.0, "planned_items_mb": {"runtime": 600.0}, "measured_peak_mb": [1250.0],
            "measured_reserved_mb": [1400.0], "planned_step_seconds": 0.1, "measured_step_seconds": 0.125}
    table = gpu.format_plan_table({"LoRA + 4-bit": {"plan": plan}, "LoRA + 8-bit": {"error": "out of memory"}})
    row = table.splitlines()[2].split()
    # On a GPU the plan less its CUDA context (which the allocator never sees) against max_memory_allocated.
    assert row[-6:] == ["1000", "1250", "1400", "-20%", "0.100", "0.125"] and len(table.splitlines()) == 3


def test_rows_a_machine_cannot_run_skip_with_one_line(gpu):
    ddp, qlora = "full fine-tuning bf16, DDP x2", gpu.QLORA_FSDP
    assert gpu.skip_reason(ddp, 1) == "needs 2 GPUs, this machine has 1"
    assert gpu.skip_reason(ddp, 0) == "needs 2 GPUs, this machine has none"
    assert gpu.skip_reason(ddp, 2) is None
    assert "CUDA" in gpu.skip_reason(qlora, 0) and gpu.skip_reason(qlora, 1) is None
    assert all(gpu.skip_reason(v, 0) is None for v in gpu.VARIANTS if v != ddp)  # they rehearse on CPU (--tiny)
    table = gpu.format_table({ddp: {"skipped": gpu.skip_reason(ddp, 1)}, qlora: {"skipped": gpu.skip_reason(qlora, 0)}},
                             peak=None)
    assert [line.split(maxsplit=1)[0] for line in table.splitlines()[2:]] == ["full", "QLoRA"]
    assert table.splitlines()[2].endswith("skipped: needs 2 GPUs, this machine has 1")


@pytest.mark.slow
def test_grpo_samples_with_generate_anywhere_and_with_vllm_only_where_a_gpu_has_it(gpu, monkeypatch):
    import importlib.util

    assert gpu.skip_reason("GRPO, generate", 0) is None  # (it rehearses on CPU with --tiny)
    assert gpu.skip_reason("GRPO, vLLM colocated", 0) == "needs a CUDA GPU with the vllm package installed"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    assert gpu.skip_reason("GRPO, vLLM colocated", 8) == "needs a CUDA GPU with the vllm package installed"


@pytest.mark.slow
def test_without_a_cached_checkpoint_the_weights_are_random_bert_base(gpu, tmp_path, monkeypatch):
    import transformers

    hub = use_hf_home(monkeypatch, tmp_path / "hf")
    assert gpu.cached_checkpoint() is None
    checkpoint, said = gpu.choose_weights(None, False, False, tmp_path)
    assert said.startswith("random weights of BERT-base's dimensions, 109.5M parameters")
    assert "not in the cache" in said
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
            config.vocab_size) == (768, 12, 12, 3072, 30522)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    assert len(tokenizer) == 30522 and tokenizer.unk_token_id not in tokenizer("the movie was superb")["input_ids"]
    # Once the cache holds BERT-base it is used, pretrained; --random-weights still asks for random ones.
    plant_model(hub, "google-bert/bert-base-uncased", Path(checkpoint))
    assert gpu.choose_weights(None, False, False, tmp_path / "again")[0] == "google-bert/bert-base-uncased"
    assert gpu.choose_weights("/my/bert", False, False, tmp_path) == ("/my/bert", "/my/bert (given)")


def test_the_qlora_step_stores_4bit_weights_as_bf16_and_trains(gpu, tmp_path):
    checkpoint, _ = gpu.random_bert(tmp_path / "bert", gpu.TINY_BERT)
    row = gpu.qlora_step(str(checkpoint), batch_size=8, device="cpu")
    # bf16 storage puts every frozen weight in one dtype, 4-bit ones included (uint8 without it): FSDP's rule.
    assert row["frozen_dtypes"] == ["bfloat16"]
    assert row["moved"] == row["trainable"] > 0 and math.isfinite(row["loss"])
    line = gpu.format_table({gpu.QLORA_FSDP: row}, peak=None).splitlines()[2]
    assert line.startswith(gpu.QLORA_FSDP) and "frozen weights stored as bfloat16" in line


def test_the_wheel_list_pins_versions_that_every_tested_package_accepts():
    """Each pinned wheel is installed here, at the pin's major version, and its pinned version satisfies what
    every installed package (the server's, hftoolkit's and the list's own) requires of it: the set the server gets
    installs together. (Not equality with this machine's versions: a patch release upstream would fail the test
    on a day nothing here changed.)"""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {canonicalize_name(name): version for name, version in (
        line.split("==") for line in WHEEL_LIST.read_text().splitlines() if line and not line.startswith("#"))}
    installed = {name: importlib.metadata.version(name) for name in pins}
    assert {name: v.split(".")[0] for name, v in installed.items()} == {n: v.split(".")[0] for n, v in pins.items()}
    refused = []
    for dist in importlib.metadata.distributions():
        for line in dist.requires or []:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if name in pins and (requirement.marker is None or requirement.marker.evaluate({"extra": ""})) \
                    and not requirement.specifier.contains(pins[name], prereleases=True):
                refused.append(f"{dist.metadata['Name']} requires {line}, the list pins {pins[name]}")
    assert refused == []


@pytest.mark.slow
def test_the_benchmark_runs_where_only_the_server_packages_and_the_wheels_import(tmp_path):
    """A Python whose site-packages hold only the server's packages, the wheel list's on PYTHONPATH as
    `pip install --target` leaves them, and hftoolkit from the checkout (as its wheel would be): the
    benchmark's 4-bit variant, which imports the most, trains there, and the rows it can't run say why."""
    names = [line.split("==")[0] for line in WHEEL_LIST.read_text().splitlines() if line and line[0] != "#"]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "server")], check=True)
    site = next((tmp_path / "server" / "lib").glob("python*/site-packages"))
    for name in requirement_closure(SERVER_HAS):
        link_distribution(name, site)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in names:
        link_distribution(name, shipped)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shipped), str(ROOT)])}
    rows = ["LoRA + 4-bit", "full fine-tuning bf16, DDP x2", "QLoRA 4-bit, bf16 storage"]
    out = subprocess.run([str(tmp_path / "server" / "bin" / "python"), str(ROOT / "benchmarks" / "gpu.py"), "--tiny",
                          "--train-size", "64", "--variants", *rows], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = out.stdout[out.stdout.index("variant "):].splitlines()
    assert table[2].startswith("LoRA + 4-bit") and "failed" not in table[2], table[2]
    assert "skipped: needs 2 GPUs, this machine has none" in table[3] and "skipped: needs a CUDA GPU" in table[4]
    assert "weights: random weights of a tiny BERT's dimensions" in out.stdout


def requirement_closure(names) -> set[str]:
    """The installed distributions `names` need, themselves included (requirements without extras whose markers
    hold here)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = set(), list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional platform package this machine doesn't have
        seen.add(name)
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def link_distribution(name: str, folder: Path) -> None:
    """Make the installed distribution `name` importable from `folder`, metadata included, by linking its
    top-level files and folders there (what its RECORD lists)."""
    dist = importlib.metadata.distribution(name)
    base = Path(dist.locate_file(""))
    tops = {Path(file).parts[0] for file in dist.files or [] if not str(file).startswith("..")}
    for top in tops - {"__pycache__"}:
        if (base / top).exists() and not (folder / top).exists():
            (folder / top).symlink_to(base / top)
