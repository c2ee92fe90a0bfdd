"""The training progress a user watches: one bar with loss, learning rate, elapsed time and ETA.

`use_progress(trainer)` takes the Trainer's own printers away (its tqdm bars for training and eval, the log
dicts PrinterCallback prints, the HTML bar in a notebook) and adds `progress_callback()`, which draws
`StepProgress` on the console (console.py's stderr console, main process only, hidden when quiet) and writes
each of the Trainer's log dicts as a line of train.log. Light: transformers is imported inside the functions.
"""

from __future__ import annotations

import math
import time

from hftoolkit.base import console
from hftoolkit.base.console import Verbosity

# Without a terminal (CI, a pipe) the progress bar is a plain line each time this share of the steps is done.
LINE_EVERY = 0.1


def progress_callback():
    """A TrainerCallback: one progress bar, and each of the Trainer's log dicts as a line of train.log."""
    from transformers import TrainerCallback

    class TrainingProgress(TrainerCallback):
        def __init__(self):
            self.bar: StepProgress | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero and console.get_verbosity() > Verbosity.QUIET:
                self.bar = StepProgress(console.stderr_console(), state.max_steps, state.global_step,
                                        args.logging_steps)
                console.on_capture_end(self.bar.close)

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar:
                scheduler = kwargs.get("lr_scheduler")  # the rate now, as the Trainer's next log will say it
                lrs = scheduler.get_last_lr() if scheduler is not None and hasattr(scheduler, "get_last_lr") else []
                self.bar.advance_to(state.global_step, lrs[0] if lrs else None)

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if state.is_world_process_zero:
                shown = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in logs.items() if k != "total_flos"}
                console.log_line(f"[trainer] step {state.global_step}/{state.max_steps}: {shown}")
            if self.bar and "loss" in logs:
                self.bar.show(logs["loss"], logs.get("learning_rate"), state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar:
                self.bar.close()
                self.bar = None

    return TrainingProgress()


def use_progress(trainer) -> None:
    """Replace the Trainer's progress printers (tqdm bars and printed log dicts; in a notebook its HTML
    bar) with `progress_callback()`."""
    from transformers.trainer import DEFAULT_PROGRESS_CALLBACK
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for printer in {DEFAULT_PROGRESS_CALLBACK, ProgressCallback, PrinterCallback}:
        trainer.remove_callback(printer)
    trainer.add_callback(progress_callback())


class StepProgress:
    """Optimizer steps done, the loss and the current learning rate, elapsed time and ETA: on a terminal a rich bar,
    redrawn in place, with the last logged loss; elsewhere (CI, a pipe, a notebook) a plain line per tenth of the
    steps, with the mean loss of the steps logged since the previous line, or `-` and the logging interval when
    none was (a figure repeated under a new step count reads as a stalled run).

    The ETA is timed from the end of the first step on: the first step carries the run's start-up (data loader
    workers, lazy kernels), which would otherwise count as the pace of every remaining step.
    """

    def __init__(self, screen, total: int, done: int = 0, logging_steps: int | None = None):
        self.screen, self.total, self.first, self.done = screen, max(total, 1), done, done
        self.logging_steps, self.logged_at = logging_steps, done
        self.lr = self.live = self.paced = None
        self.losses: list[tuple[float, int]] = []  # (logged loss, steps it averages) since the last line
        self.due, self.started, self.next_line = False, time.monotonic(), self._mark_after(done)
        self.at = self.started
        if screen.is_terminal and not screen.is_dumb_terminal:
            from rich import progress as rp

            # redirect_*=False: rich would otherwise route sys.stdout/sys.stderr around the bar, out of the capture
            self.live = rp.Progress(rp.TextColumn("train"), rp.BarColumn(), rp.MofNCompleteColumn(),
                                    rp.TextColumn("loss {task.fields[loss]}"), rp.TextColumn("lr {task.fields[lr]}"),
                                    rp.TimeElapsedColumn(), rp.TextColumn("eta"), rp.TimeRemainingColumn(),
                                    console=screen, redirect_stdout=False, redirect_stderr=False)
            self.task = self.live.add_task("train", total=self.total, completed=done, loss="-", lr="-")
            self.live.start()

    def advance_to(self, step: int, lr: float | None = None) -> None:
        self._print_due()  # the previous step's line, which no log dict came to complete
        self.at = time.monotonic()  # (a line is printed once the step's log dict came, or at the next step)
        if self.paced is None and step > self.first:
            self.paced = (step, self.at)  # the pace is timed from here
        self.done = step
        if lr is not None:
            self.lr = lr
        if self.live:
            self.live.update(self.task, completed=step, **({"lr": _number(lr, ".2e")} if lr is not None else {}))
        elif step >= self.next_line:
            self.next_line, self.due = self._mark_after(step), True

    def show(self, loss: float, lr: float | None, step: int | None = None) -> None:
        """The loss and learning rate the Trainer logged (after the step's on_step_end): the mean loss of the steps
        since its previous log."""
        step = step if step is not None else self.done
        self.lr = lr if lr is not None else self.lr
        if self.live:
            self.live.update(self.task, loss=_number(loss, ".4f"), lr=_number(self.lr, ".2e"))
        else:
            self.losses.append((loss, max(step - self.logged_at, 1)))
            self._print_due()
        self.logged_at = step

    def _print_due(self) -> None:
        if self.due:
            self.screen.print(self.line(), soft_wrap=True, highlight=False, markup=False)
            self.due, self.losses = False, []

    def line(self) -> str:
        now = self.at  # when the step the line is about ended
        elapsed = now - self.started
        paced_steps = self.done - self.paced[0] if self.paced else 0
        rate = paced_steps / (now - self.paced[1]) if paced_steps and now > self.paced[1] else 0
        eta = _clock((self.total - self.done) / rate) if rate else "-"
        if self.losses:
            loss = format(sum(value * steps for value, steps in self.losses) / sum(s for _, s in self.losses), ".4f")
        else:
            loss = "-" + (f" (logged every {self.logging_steps} steps)" if self.logging_steps else "")
        return (f"train {self.done}/{self.total} ({100 * self.done // self.total}%) loss {loss} "
                f"lr {_number(self.lr, '.2e')} elapsed {_clock(elapsed)} eta {eta}")

    def close(self) -> None:
        self._print_due()
        if self.live:
            self.live.stop()
            self.live = None

    def _mark_after(self, step: int) -> int:
        """The first step past `step` that completes another tenth of the run (the last step always does)."""
        every = max(1, math.ceil(self.total * LINE_EVERY))
        return min((step // every + 1) * every, self.total) if step < self.total else self.total + 1


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
