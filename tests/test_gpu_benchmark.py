"""benchmarks/gpu.py's parts that need no GPU: its recipes validate, the peak table, the table it prints."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
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
                              "LoRA + 8-bit": {"error": "out of memory"}}, peak=989.0)
    lines = table.splitlines()
    assert "MFU" in lines[0] and "10.0%" in lines[2] and "5.0%" in lines[3] and "0.9151" in lines[2]
    assert lines[4].endswith("failed: out of memory")
