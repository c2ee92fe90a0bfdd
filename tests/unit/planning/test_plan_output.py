"""What `hftoolkit plan` shows a user: counts and durations with their digits, what its times cover, and a pick that
says what it minimises. Plans made by hand, so no model is built and nothing is timed."""

from __future__ import annotations

import json

import pytest

from hftoolkit.cli.plan import duration, show
from hftoolkit.job.devices import GPUS, Device, device_with_memory
from hftoolkit.planning.model import MemoryPlan
from hftoolkit.planning.plan import Plan, StrategyPlan
from hftoolkit.planning.timing import TimePlan

GiB = 2**30
CPU = Device("CPU (2 cores)", "cpu", 8 * GiB)


def row(name: str, label: str, processes: int, step: float | None, steps: int | None = 120, fits: bool = True,
        start: float = 0.0, devices: int | None = None, launch: float = 0.0) -> StrategyPlan:
    time = TimePlan(step, None if step is None or steps is None else start + steps * step, None, 1e9,
                    None if step is None else 1e12, {"products": step} if step is not None else {},
                    start_seconds=start)
    memory = MemoryPlan({"weights": GiB // 4}, GiB // 4, fits, 16 * GiB)
    return StrategyPlan(name, label, processes, "fp16", memory, time, devices=devices or processes,
                        launch_seconds=launch)


def a_plan(device: Device, *rows: StrategyPlan, parameters: int = 4_386_306, trainable: int = 4_226) -> Plan:
    return Plan("encoder-classification", "init:bert", device, "fp16",
                {"parameters": parameters, "trainable": trainable}, rows[0].name, rows, lengths_from="data")


def shown(planned: Plan, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    show(planned)
    return capsys.readouterr().out


def test_parameter_counts_keep_digits_enough_to_be_nonzero(capsys, monkeypatch):
    said = shown(a_plan(GPUS["t4"], row("single", "one process", 1, 4e-4)), capsys, monkeypatch)
    first = said.splitlines()[0]
    assert "4.39M parameters (4.23K trained)" in first and "0.00M" not in said, first
    tiny = shown(a_plan(GPUS["t4"], row("single", "one process", 1, 4e-4), parameters=950, trainable=12),
                 capsys, monkeypatch)
    assert "950 parameters (12 trained)" in tiny.splitlines()[0]


@pytest.mark.parametrize("seconds, said", [
    (4.2e-4, "0.42 ms"), (1.5e-3, "1.5 ms"), (0.0123, "12 ms"), (0.5, "500 ms"), (3.7e-5, "37 µs"),
    (5e-8, "<1 µs"), (5.12, "5.1 s"), (125, "2m 05s"), (None, "-"), (0.0, "0"),
])
def test_a_duration_keeps_two_digits_however_short(seconds, said):
    assert duration(seconds) == said


def test_no_gpu_row_shows_0_ms(capsys, monkeypatch):
    """A tiny model's step on a GPU is well under a millisecond of products: each row states it in digits."""
    planned = a_plan(GPUS["t4"], row("single", "one process", 1, 3.2e-4),
                     row("ddp", "DDP", 2, 1.7e-4), row("zero3", "ZeRO-3", 2, 9e-6))
    said = shown(planned, capsys, monkeypatch)
    assert " 0 ms" not in said and "0.32 ms" in said and "0.17 ms" in said and "9 µs" in said, said
    assert "38 ms" in said, "the training: 120 steps of 0.32 ms"


def test_the_pick_is_the_lowest_cost_per_run_and_says_so_in_text_and_json(capsys, monkeypatch):
    """On GPUs a run costs its GPUs times its time: ZeRO-2 on 2 GPUs for 4 s is cheaper than DDP on 2 for 5 s, though
    DDP comes first in the table, and one GPU for 7 s cheaper than both."""
    planned = a_plan(GPUS["a100-80gb"], row("single", "one process", 1, 10 / 120, fits=False),
                     row("ddp", "DDP", 2, 5 / 120), row("zero2", "ZeRO-2", 2, 4 / 120))
    said = shown(planned, capsys, monkeypatch)
    assert "lowest cost per run that fits: ZeRO-2 on 2 processes (2 GPUs for 4.0 s of training)" in said, said
    as_json = json.loads(json.dumps(planned.as_dict()))
    assert as_json["lowest_cost_fit"] == "zero2" and "cheapest" not in json.dumps(as_json) + said
    assert [r["device_seconds"] for r in as_json["strategies"]] == pytest.approx([10, 10, 8])
    cheaper = a_plan(GPUS["a100-80gb"], row("single", "one process", 1, 7 / 120), *planned.strategies[1:])
    assert cheaper.lowest_cost_fit.name == "single"
    assert "lowest cost per run that fits: one process (1 GPU for 7.0 s of training)" in shown(cheaper, capsys,
                                                                                              monkeypatch)


def test_strategies_of_equal_cost_pick_the_least_machinery():
    """Two GPUs for half the time cost what one does, and a few percent less is no difference the plan can tell:
    the table's order (one process first) breaks the tie."""
    planned = a_plan(GPUS["a100-80gb"], row("single", "one process", 1, 0.3), row("ddp", "DDP", 2, 0.3 / 2),
                     row("zero2", "ZeRO-2", 2, 0.1 / 2 * 3))
    assert planned.lowest_cost_fit.name == "single"
    nearly = a_plan(GPUS["a100-80gb"], row("single", "one process", 1, 0.3), row("ddp", "DDP", 2, 0.95 * 0.3 / 2))
    assert nearly.lowest_cost_fit.name == "single"


def test_without_a_speed_the_pick_is_the_fewest_gpus_and_says_why(capsys, monkeypatch):
    planned = a_plan(device_with_memory(24), row("single", "one process", 1, None, fits=False),
                     row("ddp", "DDP", 2, None), row("zero2", "ZeRO-2", 2, None))
    said = shown(planned, capsys, monkeypatch)
    assert planned.lowest_cost_fit.name == "ddp"
    assert "lowest cost per run that fits: DDP on 2 processes (the fewest GPUs: this GPU's speed is unknown" in said


def test_the_plan_says_what_its_times_cover(capsys, monkeypatch):
    planned = a_plan(CPU, row("single", "one process", 1, 0.04, start=0.7), row("ddp", "DDP", 2, 0.05, devices=1))
    said = shown(planned, capsys, monkeypatch)
    assert "a step at the padded length of the data's batches" in said
    assert "training: the Trainer's start and its steps, as metrics.json's train_seconds counts them" in said
    assert "5.5 s" in said, "0.7 s of start and 120 steps of 0.04 s"
    assert "lowest cost per run that fits: one process (1 machine for 5.5 s of training)" in said


def test_a_small_job_is_not_worth_starting_processes_for_and_a_long_one_is(capsys, monkeypatch):
    """Two CPU processes that train the quickstart in 2 s instead of 3 s first start a launcher and import the
    libraries again in each: one process is the pick. At a thousand times the steps the start is nothing, and the
    pick says what it counted."""
    from hftoolkit.planning.plan import LAUNCH_SECONDS

    small = a_plan(CPU, row("single", "one process", 1, 3 / 120),
                   row("ddp", "DDP", 2, 2 / 120, devices=1, launch=LAUNCH_SECONDS))
    assert small.lowest_cost_fit.name == "single"
    long = a_plan(CPU, row("single", "one process", 1, 3 / 120, steps=120_000),
                  row("ddp", "DDP", 2, 2 / 120, steps=120_000, devices=1, launch=LAUNCH_SECONDS))
    assert long.lowest_cost_fit.name == "ddp"
    assert (f"lowest cost per run that fits: DDP on 2 processes (1 machine for 33m 20s of training and "
            f"{duration(LAUNCH_SECONDS)} to start its processes)") in shown(long, capsys, monkeypatch)
    assert json.loads(json.dumps(long.as_dict()))["strategies"][1]["launch_seconds"] == LAUNCH_SECONDS
