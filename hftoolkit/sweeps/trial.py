"""One search worker: it takes trials from the study until the study has its --trials, and trains each into a run
folder of the sweep folder as a grid variant is trained (variants.py: the folder judged, then trained, resumed or
restarted), its evals reported to the study's pruner (training/pruning.py).

Optuna's storage hands the trials out, so workers in other processes and on other machines share one study and
no trial runs twice. A trial whose worker is killed is found by its stopped heartbeat and enqueued again with the
same values (study.py); the worker that takes it resumes its run folder from the last checkpoint. A worker
stopped by a signal hands its trial back at once, in the same way.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.secrets import redact
from hftoolkit.sweeps.space import Space
from hftoolkit.sweeps.study import SURPLUS_ATTR, Objective, counted, quiet_optuna, run_name
from hftoolkit.sweeps.variants import Outcome, Variant, prepare

FINISHED = ("COMPLETE", "PRUNED", "FAIL")


@dataclass
class Search:
    """A search, resolved once by the command and handed to every worker as it is (a JSON-ready record)."""

    recipe_path: str
    sets: list[str]
    params: list[str]  # the --param items, parsed again by each worker (space.parse_param)
    objective: tuple[str, str]  # (metric, direction)
    trials: int
    sampler: str
    pruner: str
    startup_trials: int | None
    url: str
    study: str
    folder: str
    heartbeat: int
    num_processes: int | None = None
    seed: int | None = None
    command: list[str] = field(default_factory=list)

    @property
    def space(self) -> Space:
        from hftoolkit.sweeps.space import parse_param

        return Space(tuple(parse_param(item)[0] for item in self.params))

    @property
    def goal(self) -> Objective:
        return Objective(*self.objective)


@dataclass
class Reporter:
    """training/pruning.py's reporter for an Optuna trial in this process."""

    trial: object
    metric: str
    pruner: str

    def report(self, value: float, step: int) -> bool:
        self.trial.report(value, step)
        return self.trial.should_prune()


def open_for_work(search: Search, worker: int = 0):
    from hftoolkit.sweeps import study as ss

    space = search.space
    seed = None if search.seed is None else search.seed + worker
    return ss.open_study(search.url, search.study, space, search.goal,
                         ss.sampler(search.sampler, space, seed, search.startup_trials),
                         ss.pruner(search.pruner, search.startup_trials), search.heartbeat)


def work(search: Search, worker: int = 0, echo: Callable[[str], None] = print, verbosity=None) -> list[Outcome]:
    """Take and train trials until the study has search.trials of them finished; wait for the ones other workers
    run (a killed one comes back as a retry, which this worker then takes). Returns this worker's outcomes."""
    import optuna

    from hftoolkit.base.lifecycle import Stopped
    from hftoolkit.sweeps.variants import _import_training

    study = open_for_work(search, worker)
    _import_training(False)
    outcomes: list[Outcome] = []
    current: list = []  # the trial being trained, handed back should a stop signal arrive

    def objective(trial):
        current[:] = [trial]
        outcome = run_trial(search, study, trial, verbosity)
        if outcome is None:  # a surplus trial, not counted
            raise optuna.TrialPruned()
        outcomes.append(outcome)
        echo(trial_line(study, outcome, search.trials))
        if outcome.status == "pruned":
            raise optuna.TrialPruned(outcome.error)
        if outcome.status == "failed":
            raise TrialFailed(outcome.error)
        return outcome.value

    try:
        with quiet_optuna():
            while True:
                optuna.storages.fail_stale_trials(study)
                trials = study.get_trials(deepcopy=False)
                live = counted(trials)
                waiting = any(t.state.name == "WAITING" for t in trials)
                if not waiting and len(live) >= search.trials:
                    if not any(t.state.name == "RUNNING" for t in live):
                        break
                    time.sleep(min(search.heartbeat, 5))  # another worker's trial: finished, or found killed
                    continue
                current.clear()
                study.optimize(objective, n_trials=1, catch=(TrialFailed,), gc_after_trial=False)
    except Stopped:
        if current:
            hand_back(study, current[0])
        raise
    return outcomes


class TrialFailed(Exception):
    """A trial's training failed; the study records it failed, and the worker goes on."""


def hand_back(study, trial) -> None:
    """A trial this worker was stopped in: failed and enqueued again at once, as the heartbeat would in time, so
    that the next worker (or the rerun) resumes it."""
    import optuna

    storage = study._storage
    try:
        if storage.get_trial(trial._trial_id).state.name != "RUNNING":
            return
        storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    callback = storage.get_heartbeat_stale_trial_callback()
    if callback is not None:
        callback(study, storage.get_trial(trial._trial_id))


def run_trial(search: Search, study, trial, verbosity=None) -> Outcome | None:
    """Train one trial into its run folder; its Outcome (status complete, pruned or failed), or None for a trial
    beyond --trials (two workers asked for the last one at once), which is marked and not trained."""
    frozen = study._storage.get_trial(trial._trial_id)
    if "failed_trial" not in frozen.system_attrs:  # (a retry takes the place of a counted trial)
        before = [t for t in counted(study.get_trials(deepcopy=False)) if t.number < trial.number]
        if len(before) >= search.trials:
            trial.set_user_attr(SURPLUS_ATTR, True)
            return None
    space = search.space
    values = {}
    for param in space.params:
        if param.kind == "choice":
            values[param.key] = trial.suggest_categorical(param.key, list(param.choices))
        elif param.kind == "int":
            values[param.key] = trial.suggest_int(param.key, int(param.low), int(param.high), log=param.log)
        else:
            values[param.key] = trial.suggest_float(param.key, float(param.low), float(param.high), log=param.log)
    name = run_name(frozen)
    variant = Variant(name, Path(search.recipe_path), [*search.sets, *space.overrides(values)])
    trial.set_user_attr("run", name)
    trial.set_user_attr("host", socket.gethostname())
    started = time.perf_counter()
    try:
        prepare([variant], Path(search.folder), num_processes=search.num_processes)
    except UserError as err:
        outcome = Outcome(variant, "failed", error=_line(err))
        trial.set_user_attr("error", outcome.error)
        return outcome
    trial.set_user_attr("action", variant.action)
    outcome = train_trial(search, study, trial, variant, verbosity)
    outcome.seconds = time.perf_counter() - started
    trial.set_user_attr("seconds", round(outcome.seconds, 3))
    if outcome.error:
        trial.set_user_attr("error", outcome.error)
    return outcome


def train_trial(search: Search, study, trial, variant: Variant, verbosity=None) -> Outcome:
    from hftoolkit.runs.summary import load_run
    from hftoolkit.sweeps.study import to_json
    from hftoolkit.sweeps.variants import _record_failure, _train_variant
    from hftoolkit.training.pruning import PRUNED_PREFIX, TRIAL_VARIABLE, Pruned, reporting_to

    metric = search.goal.metric
    os.environ[TRIAL_VARIABLE] = to_json({"storage": search.url, "study": study.study_name,
                                          "trial_id": trial._trial_id, "metric": metric, "pruner": search.pruner})
    try:
        with reporting_to(Reporter(trial, metric, search.pruner)):
            _train_variant(variant, search.command, search.num_processes, verbosity)
    except Exception as err:  # one trial's failure, whatever it is, must not stop the search
        message = _line(err) if isinstance(err, UserError) else f"{type(err).__name__}: {_line(err)}"
        if isinstance(err, Pruned) or message.startswith(PRUNED_PREFIX):
            mark_pruned(variant.run_dir, message)
            return Outcome(variant, "pruned", error=message)
        _record_failure(variant, search.command, message)
        return Outcome(variant, "failed", error=message)
    finally:
        os.environ.pop(TRIAL_VARIABLE, None)
    run = load_run(variant.run_dir, read_history=False)
    value = run.eval.get(metric) if run.eval else None
    if not isinstance(value, (int, float)):
        return Outcome(variant, "failed", error=f"the run's eval has no {metric}, the objective: pass --objective "
                                                f"with one of {', '.join(sorted(run.eval or {})) or 'its metrics'}")
    outcome = Outcome(variant, "complete", metric=f"{metric}={value:.4g}")
    outcome.value = float(value)
    trial.set_user_attr("train_seconds", run.train_seconds)
    return outcome


def mark_pruned(run_dir: Path, message: str) -> None:
    """The run folder says "pruned" (kept, with what it trained), the step and how many steps it was planned for."""
    import re

    from hftoolkit.runs.rundir import RunDirectory

    run = RunDirectory(run_dir)
    found = re.search(r"step (\d+) of (\d+)", message)
    step, planned = (int(found[1]), int(found[2])) if found else (None, None)
    if run.path.is_dir():
        run.update_manifest(status="pruned", error=None, pruned=message, pruned_at_step=step, planned_steps=planned)


def trial_line(study, outcome: Outcome, total: int) -> str:
    """`k/N trial-003 lr=1e-4 r=8 accuracy=0.91 12.3 s`: k counts the study's finished trials."""
    from hftoolkit.runs.summary import format_seconds

    done = sum(t.state.name in FINISHED for t in counted(study.get_trials(deepcopy=False))) + 1
    head = f"{min(done, total)}/{total} {outcome.variant.name}"
    resumed = " (resumed)" if outcome.variant.action == "resume" else ""
    if outcome.status == "complete":
        return f"{head} {outcome.metric} {format_seconds(outcome.seconds)}{resumed}"
    return f"{head} {outcome.status}: {outcome.error} {format_seconds(outcome.seconds)}{resumed}"


def _line(err: BaseException) -> str:
    """The error's first line, its secrets masked: it is shown, kept in the study's database and in the report."""
    text = (getattr(err, "message", None) or str(err)).strip()
    return redact(text.splitlines()[0]) if text else type(err).__name__
