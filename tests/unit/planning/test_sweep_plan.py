"""plan of a search: its costliest trial (ranges at HIGH, every combination of the choices), and how many such
trials this machine runs at once, bounded by its GPUs, its CPU cores or its RAM."""

from __future__ import annotations

from hftoolkit.job.devices import Device
from hftoolkit.planning.sweep import costliest_overrides, trials_at_once
from hftoolkit.sweeps.space import parse_space
from tests.helpers import RECIPES, plain, run_cli

ENCODER = RECIPES / "encoder-classification.yaml"
GiB = 2**30


def test_the_costliest_trials_take_each_range_at_its_high_end_with_every_choice():
    space = parse_space(["lora.r=int:4:32", "training.learning_rate=float:1e-5:1e-3:log",
                         "lora.targets=choice:[query,value],[query,key,value]"], ENCODER, [])
    assert costliest_overrides(space) == [
        ["lora.r=32", "training.learning_rate=0.001", "lora.targets=[query,value]"],
        ["lora.r=32", "training.learning_rate=0.001", "lora.targets=[query,key,value]"]]


def test_trials_at_once_are_bounded_by_gpus_cores_or_memory():
    gpu = Device("gpu", "cuda", 80 * GiB)
    assert trials_at_once(10 * GiB, 2, gpu, gpus=8) == (4, "8 GPU(s), 2 per trial")
    assert trials_at_once(90 * GiB, 1, gpu, gpus=8)[0] == 0
    cpu = Device("cpu", "cpu", 16 * GiB)
    assert trials_at_once(1 * GiB, 1, cpu, gpus=0, cores=4) == (4, "4 CPU core(s), at least one per process")
    assert trials_at_once(6 * GiB, 1, cpu, gpus=0, cores=4)[0] == 2  # (RAM bounds it before the cores)


def test_plan_of_a_search_says_how_many_trials_fit_at_once():
    result = run_cli("plan", ENCODER, "--param", "lora.r=int:4:32")
    line = plain(result.output)
    assert "a trial at the costliest corner of the space (lora.r=32) peaks at " in line
    assert "such trial(s) at once" in line and "sweep --search --workers " in line
