"""sweep --search: an Optuna study whose trials are run folders of the sweep folder, a hopeless trial pruned at an eval
(kept, and said pruned in `runs` and in the report), --workers K processes on one machine, two commands sharing
one study in PostgreSQL as two machines would, a worker SIGKILLed mid-trial and its trial resumed from its
checkpoint, Ctrl-C ending every worker in one line; and a grid sweep that never imports Optuna."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import psutil
import pytest

from tests.helpers import RECIPES, run_cli
from tests.helpers.processes import kill_tree, start_in_group

ENCODER = RECIPES / "encoder-classification.yaml"
SHORT = ("training.max_steps=4", "data.max_train_samples=64", "data.max_eval_samples=16", "eval.max_predictions=4",
         "training.logging_steps=2", "eval.every=2", "training.save_steps=2")
SPACE = ("training.learning_rate=float:1e-4:5e-2:log", "lora.r=int:2:8")
# Where the e2e tests find a PostgreSQL server (.ci/run starts one on loopback and sets it).
POSTGRES = os.environ.get("HFTOOLKIT_TEST_POSTGRES")


def search_args(out, *extra, params=SPACE, sets=SHORT):
    args = ["sweep", ENCODER, "--search", "--out", out]
    for item in params:
        args += ["--param", item]
    for item in sets:
        args += ["--set", item]
    return [str(a) for a in [*args, *extra]]


def study_trials(url: str, name: str = "encoder-classification") -> list:
    import optuna

    from hftoolkit.sweeps.study import driver_url

    return optuna.load_study(study_name=name, storage=driver_url(url)).get_trials()


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def start(args, log: Path, **env) -> subprocess.Popen:
    with log.open("wb") as out:
        return start_in_group([sys.executable, "-m", "hftoolkit", *args], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **env})


def wait_for(process: subprocess.Popen, log: Path, text: str, count: int = 1, timeout: float = 300) -> None:
    """Until `text` appears `count` times in the logs (log, or every worker log beside it)."""
    deadline = time.monotonic() + timeout
    while True:
        logs = [log, *log.parent.glob("**/workers/*.log")]
        if sum(p.read_text(errors="replace").count(text) for p in logs if p.is_file()) >= count:
            return
        if process.poll() is not None or time.monotonic() > deadline:
            kill_tree(process)
            pytest.fail(f"never saw {text!r} (exit {process.poll()}):\n" + log.read_text(errors="replace")[-3000:])
        time.sleep(0.3)


def tree(process: subprocess.Popen) -> list[psutil.Process]:
    try:
        top = psutil.Process(process.pid)
        return [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.slow
def test_a_hopeless_trial_is_pruned_at_its_first_eval_kept_and_said_pruned(tmp_path):
    """Two trials enqueued in order: a learning rate too small to move the loss, then one so large that the loss
    jumps; the median pruner (after one trial) stops the second at its first eval, on the eval loss."""
    from hftoolkit.sweeps import study as ss
    from hftoolkit.sweeps.space import parse_space

    folder = tmp_path / "encoder-classification"
    folder.mkdir()
    params = ("training.learning_rate=float:1e-9:1:log",)
    space = parse_space(list(params), ENCODER, list(SHORT))
    goal = ss.Objective("loss", "minimize")
    study = ss.open_study(ss.default_url(folder), "encoder-classification", space, goal,
                          ss.sampler("tpe", space, 0, None), ss.pruner("median", 1), 5)
    study.enqueue_trial({"training.learning_rate": 1e-9})
    study.enqueue_trial({"training.learning_rate": 0.5})
    result = run_cli(*search_args(tmp_path, "--trials", "2", "--objective", "loss", "--startup-trials", "1",
                                  params=params))
    assert "objective loss (minimize)" in result.output
    pruned = folder / "trial-001"
    said = manifest(pruned)
    assert (said["status"], said["pruned_at_step"], said["planned_steps"]) == ("pruned", 2, 4), said
    assert "2/2 trial-001 pruned: pruned at step 2 of 4 by the median pruner (loss=" in result.output
    assert (pruned / "recipe.yaml").is_file() and not (pruned / "metrics.json").exists()
    assert [t.state.name for t in study_trials(ss.default_url(folder))] == ["COMPLETE", "PRUNED"]

    listed = {Path(r["path"]).name: r["status"] for r in json.loads(run_cli("runs", folder, "--json").output)}
    assert listed == {"trial-000": "complete", "trial-001": "pruned"}
    report = (folder / "report.md").read_text()
    study_part = report.split("## Study\n")[1].split("\n## ")[0]
    assert "1 complete, 1 pruned" in study_part and "Best trial: trial-000" in study_part
    row = next(line for line in study_part.splitlines() if line.startswith("| trial-001"))
    assert "pruned" in row and "step 2 of 4" in row
    assert (folder / "study-history.png").read_bytes()[:4] == b"\x89PNG"
    import yaml

    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["name"] == "encoder-classification-best" and best["training"]["learning_rate"] == 1e-9


@pytest.mark.slow
def test_two_workers_finish_a_study_ctrl_c_ends_them_in_one_line_and_the_rerun_resumes(tmp_path):
    """--workers 2: both workers pause in their first trial (a test hook, after checkpoint 2); Ctrl-C then ends the
    command and every worker, said in one line; the rerun finishes the study, the two trials from their checkpoints,
    and leaves no process."""
    args = search_args(tmp_path, "--trials", "3", "--workers", "2", "--pruner", "none")
    log = tmp_path / "first.log"
    first = start(args, log, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="2")
    from hftoolkit.training.checkpoints import PAUSED

    wait_for(first, log, PAUSED, count=2)
    seen = tree(first)
    assert len(seen) >= 3  # the command and its two workers
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=60) == 130
    lines = [line for line in log.read_text().splitlines() if "stopped by" in line]
    said = lines[0].removeprefix("error: ") if len(lines) == 1 else ""
    assert said.startswith("stopped by SIGINT: 0 of 3 trials finished"), log.read_text()
    assert not [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    rerun = run_cli(*args)
    folder = tmp_path / "encoder-classification"
    trials = study_trials(f"sqlite:///{folder / 'study.db'}")
    counted = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(counted) == 3 and len({t.user_attrs["run"] for t in counted}) == 3
    resumed = sorted(t.user_attrs["run"] for t in counted if t.user_attrs.get("action") == "resume")
    assert resumed == ["trial-000", "trial-001"], rerun.output  # (a retry keeps its original's folder)
    for name in resumed:
        assert manifest(folder / name)["resumed_from"].endswith("checkpoint-2")
    assert "## Study" in (folder / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES, reason="no PostgreSQL server: .ci/run starts one and sets HFTOOLKIT_TEST_POSTGRES")
def test_two_machines_share_one_postgres_study_and_a_killed_worker_s_trial_resumes(tmp_path):
    """Two commands against one study, as two machines would (the sweep folder shared): one is SIGKILLed mid-trial;
    the other and the rerun finish the 6 trials, none run twice, the killed one resumed from its checkpoint."""
    name = f"shared-{uuid.uuid4().hex[:8]}"
    args = search_args(tmp_path, "--trials", "6", "--storage", POSTGRES, "--study", name, "--heartbeat", "1",
                       "--pruner", "none")
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = start(args, a_log, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="2")
    b = start(args, b_log)
    from hftoolkit.training.checkpoints import PAUSED

    wait_for(a, a_log, PAUSED)
    kill_tree(a)  # SIGKILL, mid-trial: its trial's heartbeat stops
    rerun = start(args, tmp_path / "rerun.log")
    for process, log in ((b, b_log), (rerun, tmp_path / "rerun.log")):
        try:
            assert process.wait(timeout=600) == 0, log.read_text()[-3000:]
        finally:
            kill_tree(process)

    trials = study_trials(POSTGRES, name)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    runs = [t.user_attrs["run"] for t in complete]
    assert len(complete) == 6 and len(set(runs)) == 6, [(t.number, t.state.name, t.user_attrs) for t in trials]
    killed = [t for t in trials if t.state.name == "FAIL"]
    assert len(killed) == 1, [(t.number, t.state.name) for t in trials]
    retry = next(t for t in complete if t.system_attrs.get("failed_trial") == killed[0].number)
    assert retry.user_attrs["run"] == f"trial-{killed[0].number:03d}" and retry.user_attrs["action"] == "resume"
    folder = tmp_path / "encoder-classification"
    assert manifest(folder / retry.user_attrs["run"])["resumed_from"].endswith("checkpoint-2")
    assert sorted(p.name for p in folder.glob("trial-*")) == sorted(runs)
    password = urllib.parse.urlsplit(POSTGRES).password.encode()  # (.ci/postgres sets one)
    holding = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and password in p.read_bytes()]
    assert holding == [], f"files that hold the study's password: {holding}"
    assert b"hftoolkit:***@" in (folder / retry.user_attrs["run"] / "manifest.json").read_bytes()


@pytest.mark.slow
def test_a_grid_sweep_never_imports_optuna(tmp_path):
    """The grid path works where hftoolkit[search] is not installed: Optuna made unimportable in the process."""
    code = ("import sys; sys.modules['optuna'] = None; sys.argv = ['hftoolkit', *sys.argv[1:]]; "
            "from hftoolkit.cli.app import main; main()")
    args = ["sweep", ENCODER, "--out", tmp_path, "--grid", "lora.r=2,4", "--set", "training.max_steps=2",
            "--set", "data.max_train_samples=32", "--set", "data.max_eval_samples=8", "--set", "eval.max_predictions=2"]
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "encoder-classification" / "report.md").is_file()
    searched = subprocess.run([sys.executable, "-c", code, "sweep", str(ENCODER), "--search", "--param",
                               "lora.r=int:2:4", "--out", str(tmp_path / "s")], capture_output=True, text=True,
                              timeout=300)
    assert searched.returncode == 2
    assert "sweep --search needs Optuna, which is not installed: pip install 'hftoolkit[search]'" in searched.stderr
