"""A search trial's evals during training (eval.every), reported to its study, and the trial stopped at once when
the study's pruner says so (`Pruned`, raised from the eval callback: no step, no save and no final eval after it).

The search (sweeps/trial.py) says which trial this process trains for: `reporting_to(reporter)` in its own
process, or, for a trial trained on several processes (--num-processes), TRIAL_VARIABLE in the launched processes'
environment, read here by the main process, which reports and decides for all of them.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Protocol

from hftoolkit.base.errors import UserError

# JSON {"storage": URL, "study": name, "trial_id": id, "metric": name, "pruner": name} for launched processes.
TRIAL_VARIABLE = "HFTOOLKIT_TRIAL"
PRUNED_PREFIX = "pruned at step"
# A trial is never pruned in this first share of its steps: its evals there are reported (the pruner compares later
# trials with them) but a model that has barely begun to learn scores near chance whatever its settings, so a
# pruner comparing such evals would stop good trials as readily as bad ones.
WARMUP_SHARE = 0.3


class Reporter(Protocol):
    metric: str  # the eval metric the study optimises, without the eval_ prefix
    pruner: str  # its name, for the line that says a trial was pruned

    def report(self, value: float, step: int) -> bool:
        """Report one eval's value; True when the trial should stop (be pruned) now."""


class Pruned(UserError):
    """The study's pruner stopped this trial at an eval: its run folder keeps what it trained so far."""

    def __init__(self, step: int, max_steps: int, metric: str, value: float, pruner: str):
        super().__init__(f"{PRUNED_PREFIX} {step} of {max_steps} by the {pruner} pruner ({metric}={value:.4g})")
        self.step, self.max_steps, self.metric, self.value = step, max_steps, metric, value


_reporters: list[Reporter] = []


@contextlib.contextmanager
def reporting_to(reporter: Reporter):
    """The trainings started in this block report their evals to `reporter`."""
    _reporters.append(reporter)
    try:
        yield reporter
    finally:
        _reporters.remove(reporter)


def current_reporter() -> Reporter | None:
    if _reporters:
        return _reporters[-1]
    text = os.environ.get(TRIAL_VARIABLE)
    return StudyReporter(**json.loads(text)) if text else None


@dataclass
class StudyReporter:
    """A trial of a study in a database, reported to from a process the search launched (TRIAL_VARIABLE)."""

    storage: str
    study: str
    trial_id: int
    metric: str
    pruner: str = "study's"

    def report(self, value: float, step: int) -> bool:
        import optuna

        study = optuna.load_study(study_name=self.study, storage=self.storage)
        trial = optuna.Trial(study, self.trial_id)
        trial.report(value, step)
        return trial.should_prune()


def pruning_callback():
    """The Trainer callback for the trial this process trains for, or None outside a search."""
    reporter = current_reporter()
    if reporter is None:
        return None
    from transformers import TrainerCallback

    class ReportToStudy(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            value = (metrics or {}).get(f"eval_{reporter.metric}")
            if value is None:
                return
            prune = reporter.report(float(value), state.global_step) if state.is_world_process_zero else False
            prune = _agreed(prune) and state.global_step >= WARMUP_SHARE * state.max_steps
            if prune:
                raise Pruned(state.global_step, state.max_steps, reporter.metric, float(value), reporter.pruner)

    return ReportToStudy()


def _agreed(decision: bool) -> bool:
    """The main process's decision, on every process of a run spread over several (each stops at the same eval)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return decision
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return decision
    box = [decision]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])
