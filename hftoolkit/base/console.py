"""What a user sees while hftoolkit works: the toolkit's own lines (`phase`, `note`, `warn`, `error`) on stderr,
from the main process only (stdout carries what a script reads); while `capture` lasts, what the libraries say
goes to train.log (library_output.py holds that plumbing), and to the console only when verbose.
Verbosity: quiet prints errors only, normal the toolkit's lines, verbose the libraries' output as well.
The training progress bar lives in training/progress.py. Light: no torch or transformers at module level.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.library_output import LineStream, LogSink, fileno_of, record_library_deprecations, redirect_handlers
from hftoolkit.base.lifecycle import Stopped
from hftoolkit.base.ranks import is_main_process
from hftoolkit.base.secrets import redact

# Off a terminal, data work says how far it got only once it has lasted this long (short work: its result line).
PROGRESS_AFTER = 2.0
GIB = 2**30


class Verbosity(enum.IntEnum):
    QUIET = 0
    NORMAL = 1
    VERBOSE = 2


_verbosity = Verbosity.NORMAL
_active: Capture | None = None
# What a capture that explains loading calls as it begins, with its undo stack (`watch_loading_with`).
_loading_watch: Callable[[contextlib.ExitStack], None] | None = None


def set_verbosity(verbosity: Verbosity) -> None:
    global _verbosity
    _verbosity = Verbosity(verbosity)


def get_verbosity() -> Verbosity:
    return _active.verbosity if _active else _verbosity


def verbosity_from_flags(verbose: bool, quiet: bool) -> Verbosity:
    """The CLI's -v/--verbose and -q/--quiet as one setting."""
    if verbose and quiet:
        raise UserError("-v/--verbose and -q/--quiet contradict each other: pass one of them")
    return Verbosity.VERBOSE if verbose else Verbosity.QUIET if quiet else Verbosity.NORMAL


# ---------------------------------------------------------------- the toolkit's own lines


def phase(message: str) -> None:
    """A step of the work: data loaded, model loaded, eval. Hidden when quiet."""
    _say(message, "", Verbosity.NORMAL)


def note(message: str) -> None:
    """Something worth knowing that needs no action. Hidden when quiet."""
    _say(message, "note", Verbosity.NORMAL, "cyan")


def warn(message: str) -> None:
    """Something that may need the user's attention. Hidden when quiet."""
    _say(message, "warning", Verbosity.NORMAL, "yellow")


def error(message: str) -> None:
    """Shown at every verbosity."""
    _say(message, "error", Verbosity.QUIET, "bold red")


def data_line(rows: Mapping[str, int | None]) -> str:
    """'data loaded: 240 train, 60 eval rows' from rows per split; None: a stream, whose rows are not counted."""
    counted = ", ".join(f"{n:,} {split}" for split, n in rows.items() if n is not None) + " rows"
    streamed = [split for split, n in rows.items() if n is None]
    if not streamed:
        return "data loaded: " + counted
    return f"data opened: {' and '.join(streamed)} streamed" + (f", {counted}" if len(streamed) < len(rows) else "")


def gib(count: float, places: int = 1, unit: bool = True) -> str:
    """`count` bytes in GiB, as every line and table shows them: `1.5 GiB`; `unit=False` for a table's column
    headed GiB, the number alone with its thousands grouped (`1,234.56`)."""
    return f"{count / GIB:.{places}f} GiB" if unit else f"{count / GIB:,.{places}f}"


@contextlib.contextmanager
def work_progress(label: str, total: int, unit: str = "rows"):
    """Yields `advance(n)`: on a terminal a bar, elsewhere (CI, a pipe) a plain line at each quarter of `total`
    reached after PROGRESS_AFTER seconds; nothing on a non-main process or when quiet. The bar goes once the
    work is done (a line then says so)."""
    if get_verbosity() <= Verbosity.QUIET or not is_main_process() or total <= 0:
        yield lambda n: None
        return
    screen = stderr_console()
    if screen.is_terminal and not screen.is_dumb_terminal:
        from rich import progress as rp

        bar = rp.Progress(rp.TextColumn(label), rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn(unit),
                          rp.TimeElapsedColumn(), rp.TimeRemainingColumn(), console=screen, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        task = bar.add_task(label, total=total)
        with bar:
            yield lambda n: bar.advance(task, n)
        return
    done, marks, started = [0], [total * q // 4 for q in (1, 2, 3, 4)], time.monotonic()

    def advance(n: int) -> None:
        before, done[0] = done[0], done[0] + n
        if any(before < mark <= done[0] for mark in marks) and time.monotonic() - started >= PROGRESS_AFTER:
            screen.print(f"{label}: {done[0]:,}/{total:,} {unit}", soft_wrap=True, highlight=False, markup=False)

    yield advance


def model_line(checkpoint: str, trainable: int | None, total: int, quantization: str = "none",
               lora_rank: int | None = None) -> str:
    """'model loaded: init:bert, 136,964 parameters, 4,226 trainable (3.09%), LoRA r=8, not quantized'
    (trainable None: a model that is not trained here, said without that part)."""
    parts = [checkpoint, f"{total:,} parameters"]
    if trainable is not None:
        parts.append(f"{trainable:,} trainable ({100 * trainable / max(total, 1):.3g}%)")
    if lora_rank:
        parts.append(f"LoRA r={lora_rank}")
    quantized = quantization not in (None, "none")
    parts.append(f"{quantization.replace('bit', '-bit')} weights" if quantized else "not quantized")
    return "model loaded: " + ", ".join(parts)


def _say(message: str, label: str, least: Verbosity, style: str = "") -> None:
    from rich.text import Text

    message = redact(message)  # (shown, and written to train.log and a search worker's log: no secret in either)
    if _active:
        _active.sink.line(f"[hftoolkit] {label + ': ' if label else ''}{message}")
    if get_verbosity() >= least and is_main_process():
        text = Text(f"{label}: ", style=style) if label else Text()
        stderr_console().print(text.append(message), soft_wrap=True, highlight=False)


def stderr_console():
    """The rich console on the real stderr (the one a capture found, not its own stand-in)."""
    from rich.console import Console

    return _active.console if _active else Console(file=sys.stderr, highlight=False)


def on_capture_end(callback) -> None:
    """Call `callback` when the capture in progress ends, even if the run fails (a live progress bar must stop
    before the streams are put back). No capture: nothing to do."""
    if _active:
        _active.cleanups.append(callback)


# ---------------------------------------------------------------- capturing the libraries


class Capture:
    """One capture's state (see `capture`)."""

    def __init__(self, verbosity: Verbosity, outer: Capture | None, explain_loading: bool):
        from rich.console import Console

        self.verbosity, self.explain_loading = Verbosity(verbosity), explain_loading
        self.sink = LogSink()
        # Nested in another capture, the console is still the real one.
        self.console = outer.console if outer else Console(file=sys.stderr, highlight=False)
        self.main = is_main_process()
        self.cleanups: list = []  # what must end with the run even if it fails (a live progress bar)
        self.saved_fd, self.console_file = None, None

    def attach(self, path: Path, writer: bool = False) -> None:
        """Write the log to `path` from now on, with everything said since the capture began. Only the main
        process does, or a `writer` of its own copy of the run directory (training.save_on_each_node)."""
        if self.main or writer:
            self.sink.attach(path)
            self.divert_descriptor(self.sink.file.fileno())

    def divert_descriptor(self, target: int) -> None:
        """C and C++ code (torch's c10 warnings, such as DDP's reducer's; NCCL) writes to file descriptor 2
        itself, past sys.stderr. Unless verbose, until the capture ends descriptor 2 is `target` (the log file;
        /dev/null on a non-main process, which has none) and the console writes to a copy of the old one.
        A hard crash's last words (a segfault's, faulthandler's) are then in the log file."""
        if self.verbosity >= Verbosity.VERBOSE or self.saved_fd is not None:
            return
        try:
            self.saved_fd = os.dup(2)
        except OSError:  # no descriptor 2 (a daemon)
            return
        self.console.file.flush()
        if fileno_of(self.console.file) == 2:
            encoding = getattr(self.console.file, "encoding", None) or "utf-8"
            self.console_file = self.console.file
            self.console.file = open(self.saved_fd, "w", encoding=encoding, errors="replace", closefd=False)
        os.dup2(target, 2)

    def restore_descriptor(self) -> None:
        if self.saved_fd is not None:
            if self.console_file is not None:
                self.console.file.close()
                self.console.file, self.console_file = self.console_file, None
            os.dup2(self.saved_fd, 2)
            os.close(self.saved_fd)
            self.saved_fd = None

    def library_line(self, line: str) -> None:
        self.sink.line(line)
        if self.verbosity >= Verbosity.VERBOSE and self.main and line.strip():
            from rich.text import Text

            self.console.print(Text.from_ansi(redact(line)), soft_wrap=True, highlight=False)


@contextlib.contextmanager
def capture(log_path: Path | None = None, verbosity: Verbosity | None = None, *,
            explain_loading: bool = True) -> Iterator[Capture]:
    """The libraries' output into a log file for the duration of the block: logging handlers, `warnings`, print
    and tqdm on sys.stdout/sys.stderr, native code on file descriptor 2; the toolkit's lines go there too.
    Afterwards streams, handlers and warning hooks are as they were.

    log_path may be None, the file attached later (`attach`). explain_loading: transformers' load report is said
    in lines of our own (the watch models/load_report.py sets, `watch_loading_with`); False where a head missing
    from the checkpoint comes from elsewhere (loading a trained LoRA run: the adapter holds it).
    """
    global _active
    outer = _active
    run = Capture(get_verbosity() if verbosity is None else verbosity, outer, explain_loading)
    failed = [False]
    with contextlib.ExitStack() as undo:  # on the way out, in the reverse order of these lines
        undo.callback(_finish, run, outer, failed)
        out, err = LineStream(run, sys.stdout), LineStream(run, sys.stderr)
        redirect_handlers(out, err, undo)
        undo.enter_context(contextlib.redirect_stdout(out))
        undo.enter_context(contextlib.redirect_stderr(err))
        _active = run
        if explain_loading and _loading_watch is not None:
            _loading_watch(undo)
        undo.callback(setattr, warnings, "showwarning", warnings.showwarning)
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        record_library_deprecations(undo)
        undo.callback(out.finish)
        undo.callback(err.finish)
        undo.callback(lambda: [end() for end in reversed(run.cleanups)])
        if log_path is not None:
            run.attach(log_path)
        if not run.main:
            with open(os.devnull, "w") as nowhere:
                run.divert_descriptor(nowhere.fileno())
        try:
            yield run
        except Stopped:  # (asked for: the stop's own line says what to do next)
            raise
        except BaseException:
            failed[0] = True
            raise


def _finish(run: Capture, outer: Capture | None, failed: list[bool]) -> None:
    """The capture ends; after a failure, say where the libraries' full account is (if still there)."""
    global _active
    _active = outer
    run.restore_descriptor()
    run.sink.close()
    if failed[0] and run.sink.path is not None and run.sink.path.is_file():
        note(f"the libraries' full log: {run.sink.path}")


def attach(path: Path) -> None:
    """Attach the log file to the capture in progress (no capture: nothing to do)."""
    if _active:
        _active.attach(path)


def log_line(line: str) -> None:
    """A line for the current capture's log file only (no capture: nowhere)."""
    if _active:
        _active.sink.line(line)


def watch_loading_with(watch: Callable[[contextlib.ExitStack], None]) -> None:
    """Have every capture that explains loading call `watch(undo)` as it begins; what `watch` hooks, it undoes
    through `undo` when that capture ends (models/load_report.py hooks transformers' load report)."""
    global _loading_watch
    _loading_watch = watch


def explains_loading() -> bool:
    """Whether the capture in progress says transformers' load report in lines of our own (its explain_loading)."""
    return bool(_active and _active.explain_loading)
