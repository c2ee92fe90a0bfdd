"""The pruning callback: a trial's evals reach its study, and the pruner's word stops it, except in the first
share of its steps, where every setting still scores near chance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hftoolkit.training.pruning import WARMUP_SHARE, Pruned, pruning_callback, reporting_to


class AlwaysPrune:
    metric, pruner = "accuracy", "median"

    def __init__(self):
        self.reported = []

    def report(self, value: float, step: int) -> bool:
        self.reported.append((step, value))
        return True


def evaluate(callback, step: int, max_steps: int = 10, value: float = 0.5):
    state = SimpleNamespace(global_step=step, max_steps=max_steps, is_world_process_zero=True)
    callback.on_evaluate(None, state, None, metrics={"eval_accuracy": value})


def test_no_trial_is_pruned_in_its_warmup_and_every_eval_is_reported():
    reporter = AlwaysPrune()
    with reporting_to(reporter):
        callback = pruning_callback()
        early = int(WARMUP_SHARE * 10) - 1
        evaluate(callback, early)  # the pruner says stop; the trial goes on
        with pytest.raises(Pruned, match=r"pruned at step 3 of 10 by the median pruner \(accuracy=0\.6\)"):
            evaluate(callback, 3, value=0.6)
    assert reporter.reported == [(early, 0.5), (3, 0.6)]


def test_outside_a_search_there_is_no_callback():
    assert pruning_callback() is None
