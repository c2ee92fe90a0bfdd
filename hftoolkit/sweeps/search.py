"""`hftoolkit sweep RECIPE --search`: an Optuna study over recipe values, its trials trained in parallel, on one
machine or on several that share a database, then compared in the sweep report with a study section.

    hftoolkit sweep RECIPE --search --param training.learning_rate=float:1e-5:1e-3:log --param lora.r=int:4:32
        [--trials N] [--sampler tpe|random|grid] [--pruner median|halving|none] [--workers K] [--storage URL]

Everything is checked before anything is written: the space (space.py), the storage and a stored study's
space (study.py), what the machine gives the workers. The study then lives in DIR/NAME/study.db (or the
--storage database); each trial is a run folder DIR/NAME/trial-NNN/, trained by a worker (trial.py). With
--workers K, K worker processes each get their share of the machine: GPUs by CUDA_VISIBLE_DEVICES, else CPU cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from hftoolkit.config.recipe import RecipeError, load_recipe
from hftoolkit.sweeps import study as ss
from hftoolkit.sweeps.trial import FINISHED, Search
from hftoolkit.sweeps.variants import SweepResult

WORKER_LOGS = "workers"
CPUS_VARIABLE = "HFTOOLKIT_WORKER_CPUS"  # the CPU cores a worker keeps to (worker.py)
DEFAULT_TRIALS = 20
DEFAULT_HEARTBEAT_S = 20
COPY_GRACE_S = 5  # how long a worker's last lines may take to reach its log once it has ended


def search(recipe_path: Path, params: list[str], sets: list[str], out: Path, *, space_file: Path | None = None,
           trials: int | None = None, sampler: str | None = None, pruner: str | None = None,
           objective: str | None = None, workers: int = 1, storage: str | None = None, study: str | None = None,
           heartbeat: int = DEFAULT_HEARTBEAT_S, startup_trials: int | None = None, num_processes: int | None = None,
           command: list[str] | None = None, echo: Callable[[str], None] = print, verbosity=None) -> SweepResult:
    """Check everything, then run (or join) the study and write the sweep report; every problem at once, and
    nothing written on a refusal."""
    search_ = resolve(recipe_path, params, sets, out, space_file=space_file, trials=trials, sampler=sampler,
                      pruner=pruner, objective=objective, workers=workers, storage=storage, study=study,
                      heartbeat=heartbeat, startup_trials=startup_trials, num_processes=num_processes,
                      command=command or sys.argv)
    folder = Path(search_.folder)
    folder.mkdir(parents=True, exist_ok=True)
    ss.open_study(search_.url, search_.study, search_.space, search_.goal,
                  ss.sampler(search_.sampler, search_.space, search_.seed, search_.startup_trials),
                  ss.pruner(search_.pruner, search_.startup_trials), search_.heartbeat)
    who = f"{workers} workers (logs in {folder / WORKER_LOGS})" if workers > 1 else "1 worker"
    echo(f"search {folder}: study {search_.study} in {ss.shown(search_.url)}, {search_.trials} trials "
         f"({search_.sampler} sampler, {search_.pruner} pruner), objective {search_.goal.metric} "
         f"({search_.goal.direction}), {who}")
    if workers == 1:
        from hftoolkit.sweeps.trial import work

        outcomes = work(search_, 0, echo, verbosity)
    else:
        outcomes = []
        run_workers(search_, worker_shares(workers, num_processes or 1)[0], echo)
    from hftoolkit.sweeps.report import write_search_report

    report = write_search_report(search_)
    return SweepResult(folder, report, outcomes)


def resolve(recipe_path: Path, params: list[str], sets: list[str], out: Path, *, space_file, trials, sampler, pruner,
            objective, workers, storage, study, heartbeat, startup_trials, num_processes, command) -> Search:
    """The search as every worker runs it, or RecipeError with every problem of the input, one line each."""
    from hftoolkit.config import tasks
    from hftoolkit.job.hardware import library_problems
    from hftoolkit.sweeps.space import file_items, parse_space

    settings, file_params = file_items(space_file) if space_file else ({}, [])
    problems: list[str] = []
    items = [*(p for p in file_params if p.partition("=")[0].strip() not in {q.partition("=")[0].strip()
                                                                               for q in params}), *params]
    space = None
    try:
        space = parse_space(items, recipe_path, sets)
    except RecipeError as err:
        problems += err.problems
    try:
        recipe = load_recipe(recipe_path, sets)
    except RecipeError:
        raise RecipeError(problems) from None  # (the recipe's own problems are among them)
    problems += library_problems(recipe)  # (an optional library every trial needs, not installed)
    sampler = sampler or settings.get("sampler") or "tpe"
    if sampler not in ss.SAMPLERS:
        problems.append(f"--sampler {sampler}: expected one of {', '.join(ss.SAMPLERS)}")
    every = recipe.eval.every != "none"
    pruner = pruner or settings.get("pruner") or ("median" if every else "none")
    if pruner not in ss.PRUNERS:
        problems.append(f"--pruner {pruner}: expected one of {', '.join(ss.PRUNERS)}")
    elif pruner != "none" and not every:
        problems.append(f"--pruner {pruner}: a pruner reads the evals made during training, and eval.every is none: "
                        "pass --set eval.every=N (steps) or epoch, or --pruner none")
    grid = space.grid() if space is not None else None
    if sampler == "grid" and space is not None and grid is None:
        floats = [p.key for p in space.params if p.grid_values() is None]
        problems.append(f"--sampler grid: {', '.join(floats)} has no finite set of values: give it as "
                        f"choice:V1,V2,..., or use --sampler tpe or random")
    trials = trials or settings.get("trials")
    if sampler == "grid" and grid is not None:
        size = 1
        for values in grid.values():
            size *= len(values)
        trials = min(trials or size, size)
    trials = trials or DEFAULT_TRIALS
    if not isinstance(trials, int) or trials < 1:
        problems.append(f"trials: expected a whole number above 0 (got {trials})")
    spec = tasks.spec(recipe.task)
    goal, problem = parse_objective(objective or settings.get("objective"), spec)
    if problem:
        problems.append(problem)
    _, problem = worker_shares(workers, num_processes or 1)
    if problem:
        problems.append(problem)
    folder = Path(out) / recipe.name
    if folder.exists() and not folder.is_dir():
        problems.append(f"--output: {folder} is a file, not a folder: choose another --output")
    name = study or recipe.name
    url = storage or ss.default_url(folder)
    problem = ss.check_storage(url) if storage else None
    if problem:
        problems.append(problem)
    elif space is not None and goal is not None:
        stored = ss.stored_study(url, name)
        if stored is not None:
            problems += ss.mismatch(stored, space.specs(), goal)
    if problems:
        raise RecipeError(list(dict.fromkeys(problems)))
    seed = recipe.training.seed if storage is None else None  # (machines sharing a study must not sample alike)
    return Search(str(recipe_path), list(sets), [f"{p.key}={p.spec}" for p in space.params],
                  (goal.metric, goal.direction), trials, sampler, pruner, startup_trials, url, name, str(folder),
                  heartbeat, num_processes, seed, list(command))


def parse_objective(text: str | None, spec) -> tuple[ss.Objective | None, str | None]:
    """`METRIC[:maximize|minimize]` (the direction defaults to the task's for its main metric, minimize for loss
    and perplexity, else maximize); no text: the task's main metric and direction."""
    if not text:
        return ss.Objective(spec.main_metric, "maximize" if spec.greater_is_better else "minimize"), None
    metric, _, direction = str(text).partition(":")
    metric = metric.strip().removeprefix("eval_")
    direction = direction.strip() or ("maximize" if (spec.greater_is_better if metric == spec.main_metric
                                                     else metric not in ("loss", "perplexity")) else "minimize")
    direction = {"max": "maximize", "min": "minimize"}.get(direction, direction)
    if not metric or direction not in ("maximize", "minimize"):
        return None, f"--objective {text}: expected METRIC or METRIC:maximize or METRIC:minimize, for example " \
                     f"--objective {spec.main_metric}:{'maximize' if spec.greater_is_better else 'minimize'}"
    return ss.Objective(metric, direction), None


def worker_shares(workers: int, per_trial: int) -> tuple[list[dict[str, str]], str | None]:
    """Each worker's share of this machine, as environment variables (CUDA_VISIBLE_DEVICES where there are GPUs,
    else CPU cores and thread counts), or the problem when the machine can't give `workers` of `per_trial` each."""
    if workers < 1:
        return [], f"--workers {workers}: expected 1 or more"
    need = workers * per_trial
    each = f" of {per_trial} each (--num-processes)" if per_trial > 1 else ""
    gpus = _visible_gpus()
    if gpus:
        if need > len(gpus):
            return [], (f"--workers {workers}: this machine gives {len(gpus)} GPU(s), and {workers} workers{each} "
                        f"need {need}: lower --workers, or run the same command on another machine with --storage")
        return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * per_trial:(i + 1) * per_trial])}
                for i in range(workers)], None
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if need > len(cores):
        return [], (f"--workers {workers}: this machine gives {len(cores)} CPU core(s) and no GPU, and {workers} "
                    f"workers{each} need {need}, one core per process: lower --workers, or run the same command on "
                    "another machine with --storage")
    share = len(cores) // workers
    return [{CPUS_VARIABLE: ",".join(map(str, cores[i * share:(i + 1) * share])),
             "OMP_NUM_THREADS": str(max(1, share // per_trial))} for i in range(workers)], None


def _visible_gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [d.strip() for d in visible.split(",") if d.strip()][:torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


# ---------------------------------------------------------------- K workers on this machine


def run_workers(search_: Search, shares: list[dict[str, str]], echo: Callable[[str], None]) -> None:
    """One worker process per share, each in a session of its own and ending with this process; their trials'
    lines printed here as the study records them. A stop signal is handed to every worker, and said in one line."""
    from hftoolkit.base.lifecycle import GRACE_SECONDS, PARENT_VARIABLE, Stopped

    logs = Path(search_.folder) / WORKER_LOGS
    logs.mkdir(exist_ok=True)
    record = json.dumps(asdict(search_))  # (the worker gets the real storage URL: it connects)
    processes, copies = [], []
    study = _study(search_)
    seen = {t.number for t in study.get_trials(deepcopy=False) if t.state.name in FINISHED}
    try:
        for index, share in enumerate(shares):
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "hftoolkit.sweeps.worker", record, str(index)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **share, PARENT_VARIABLE: str(os.getpid())}))
            copies.append(threading.Thread(target=copy_redacted, args=(processes[-1].stdout,
                                                                        logs / f"worker-{index}.log"), daemon=True))
            copies[-1].start()
        while any(p.poll() is None for p in processes):
            _say_finished(search_, study, seen, echo)
            time.sleep(1)
        _say_finished(search_, study, seen, echo)
    except Stopped as stop:
        for process in processes:
            if process.poll() is None:
                process.send_signal(stop.signum)
        _wait_or_kill(processes, GRACE_SECONDS + 10)
        trials = ss.counted(study.get_trials(deepcopy=False))
        done = sum(t.state.name in FINISHED for t in trials)
        echo_error(f"stopped by {stop.name}: {done} of {search_.trials} trials finished; the study is kept in "
                   f"{ss.shown(search_.url)}, and the same command resumes it (interrupted trials from their last "
                   "checkpoints)")
        stop.said = True
        raise
    finally:
        _wait_or_kill(processes, 0)
        for copy in copies:  # (the last lines, written before a worker's end is said)
            copy.join(timeout=COPY_GRACE_S)
    failed = [(i, p.returncode) for i, p in enumerate(processes) if p.returncode not in (0, None)]
    for index, status in failed:
        echo(f"worker {index} ended with exit status {status}: see {logs / f'worker-{index}.log'}")


def copy_redacted(stream, log: Path) -> None:
    """A worker's output (a pipe) appended to its log line by line, its secrets masked (base/secrets.py): whatever
    the worker or a library in it prints, a log is handed on like any file. Bytes that are not UTF-8 pass as they
    are."""
    from hftoolkit.base.secrets import redact

    with stream, open(log, "ab") as out:
        for line in stream:
            out.write(redact(line.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))
            out.flush()


def echo_error(line: str) -> None:
    from hftoolkit.base import console

    console.error(line)


def _wait_or_kill(processes: list[subprocess.Popen], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()


def _study(search_: Search):
    import optuna

    with ss.quiet_optuna():
        return optuna.load_study(study_name=search_.study, storage=ss.driver_url(search_.url))


def _say_finished(search_: Search, study, seen: set[int], echo: Callable[[str], None]) -> None:
    from hftoolkit.runs.summary import format_seconds

    trials = ss.counted(study.get_trials(deepcopy=False))
    done = sum(t.state.name in FINISHED for t in trials)
    for trial in trials:
        if trial.state.name not in FINISHED or trial.number in seen:
            continue
        seen.add(trial.number)
        attrs = trial.user_attrs
        head = f"{min(done, search_.trials)}/{search_.trials} {attrs.get('run', ss.run_name(trial))}"
        resumed = " (resumed)" if attrs.get("action") == "resume" else ""
        seconds = format_seconds(attrs.get("seconds"))
        if trial.state.name == "COMPLETE":
            echo(f"{head} {search_.goal.metric}={trial.value:.4g} {seconds}{resumed}")
        else:
            status = "pruned" if trial.state.name == "PRUNED" else "failed"
            echo(f"{head} {status}: {attrs.get('error') or 'see its worker log'} {seconds}{resumed}")

