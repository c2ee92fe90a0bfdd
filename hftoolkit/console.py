"""What a user sees while hftoolkit works: the toolkit's own lines on the console, the libraries' in train.log.

- `phase`, `note`, `warn`, `error`: the toolkit's lines, with rich, on stderr (stdout carries what a script
  reads: the results table, `--json`, `predict`'s rows), from the main process only; also into train.log.
- `capture(log_path, verbosity)`: while a run lasts, what the libraries say (logging handlers, `warnings`,
  print and tqdm on sys.stdout/sys.stderr, native code on file descriptor 2) goes in full to the log file, to
  the console only when verbose; afterwards streams, handlers and warning hooks are as they were.
  transformers' LOAD REPORT table is said in one line of our own (`explain_load_report`).
- `work_progress(label, total)`: the progress of long data work (tokenization, packing) on the console.
- The training progress bar that replaces the Trainer's printers lives in progress.py.

Verbosity: quiet prints errors only, normal the toolkit's lines, verbose the libraries' output as well.
Light: no torch or transformers at module level.
"""

from __future__ import annotations

import contextlib
import enum
import io
import logging
import os
import re
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path

from hftoolkit.errors import UserError
from hftoolkit.processes import Stopped, is_main_process

# Lines said before a log file is attached are held in memory, the newest this many (a non-main process never
# attaches one).
HELD_LINES = 10_000
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Off a terminal, data work says how far it got only once it has lasted this long (short work: its result line).
PROGRESS_AFTER = 2.0


class Verbosity(enum.IntEnum):
    QUIET = 0
    NORMAL = 1
    VERBOSE = 2


_verbosity = Verbosity.NORMAL
_active: Capture | None = None


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


class LogSink:
    """train.log's lines: held in memory until a file is attached, then appended to it, one flush a line
    (a killed run keeps what was said). Colour codes are dropped; each line starts with the time."""

    def __init__(self):
        self.file = None
        self.path: Path | None = None
        self.held: deque[str] = deque(maxlen=HELD_LINES)

    def line(self, text: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} {ANSI.sub('', text)}\n"
        if self.file is None:
            self.held.append(stamped)
        else:
            self.file.write(stamped)
            self.file.flush()

    def attach(self, path: Path) -> None:
        """Append to `path` from now on (a resumed run adds to its log), starting with the held lines."""
        self.close()
        self.path = Path(path)
        self.file = self.path.open("a", encoding="utf-8")
        self.file.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} log opened\n")
        self.file.writelines(self.held)
        self.file.flush()
        self.held.clear()

    def close(self) -> None:
        if self.file is not None:
            self.file, file = None, self.file
            file.close()


class LineStream(io.TextIOBase):
    """Stands in for sys.stdout or sys.stderr during a capture: whole lines go to the capture.

    A line redrawn with carriage returns (a tqdm bar) counts as its last state, as a terminal shows it;
    a bar that erases itself leaves nothing. After the capture, writes go to the stream it replaced
    (a handler or a bar made meanwhile may still hold this object)."""

    encoding = "utf-8"

    def __init__(self, capture: Capture, replaced):
        super().__init__()
        self.capture, self.replaced, self.partial, self.done = capture, replaced, "", False

    def write(self, text: str) -> int:
        if self.done:
            return self.replaced.write(text)
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self.capture.library_line(_last_state(line))
        if "\r" in self.partial:  # keep only the bar's latest state: a long run redraws it thousands of times
            segments = self.partial.split("\r")
            keep = max((i for i, s in enumerate(segments) if s.strip()), default=len(segments) - 1)
            self.partial = "\r" + "\r".join(segments[keep:])
        return len(text)

    def finish(self) -> None:
        if self.partial.strip():
            self.capture.library_line(_last_state(self.partial))
        self.partial, self.done = "", True

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:  # libraries then write no colour codes and no cursor movements
        return False

    def fileno(self) -> int:  # what writes to the descriptor (faulthandler, a subprocess) is not captured
        return self.replaced.fileno()


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None


def _last_state(line: str) -> str:
    shown = [s for s in line.split("\r") if s.strip()]
    return shown[-1] if shown else ""


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
        if _fileno(self.console.file) == 2:
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

            self.console.print(Text.from_ansi(line), soft_wrap=True, highlight=False)


@contextlib.contextmanager
def capture(log_path: Path | None = None, verbosity: Verbosity | None = None, *,
            explain_loading: bool = True) -> Iterator[Capture]:
    """The libraries' output into a log file for the duration of the block (see the module docstring).

    log_path may be None, the file attached later (`attach`). explain_loading=False where a head missing from
    the checkpoint comes from elsewhere (loading a trained LoRA run: the adapter holds it).
    """
    global _active
    outer = _active
    run = Capture(get_verbosity() if verbosity is None else verbosity, outer, explain_loading)
    failed = [False]
    with contextlib.ExitStack() as undo:  # on the way out, in the reverse order of these lines
        undo.callback(_finish, run, outer, failed)
        out, err = LineStream(run, sys.stdout), LineStream(run, sys.stderr)
        _redirect_handlers(out, err, undo)
        undo.enter_context(contextlib.redirect_stdout(out))
        undo.enter_context(contextlib.redirect_stderr(err))
        _active = run
        if explain_loading:
            _watch_load_reports(undo)
        undo.callback(setattr, warnings, "showwarning", warnings.showwarning)
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        _record_library_deprecations(undo)
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


def _console_handlers() -> Iterator[logging.StreamHandler]:
    """Logging handlers that hold a console stream: StreamHandlers but files and in-memory buffers (caplog's).
    transformers' `_default_handler` is one: utils/logging.py binds it to the sys.stderr of the moment it is
    made. A handler that looks sys.stderr up at each record (logging.lastResort) follows the redirect."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
                    and not isinstance(getattr(type(handler), "stream", None), property)
                    and not isinstance(handler.stream, io.StringIO)):
                yield handler


def _redirect_handlers(out: LineStream, err: LineStream, undo: contextlib.ExitStack) -> None:
    """Point console handlers at the capture's streams; afterwards back where they were. A library that sets
    up its logging during the capture (transformers, datasets and huggingface_hub add a handler on the
    sys.stderr of that moment) gets its handler pointed at the stream the capture's stood in for."""
    saved = {}
    for handler in _console_handlers():
        if handler not in saved:
            saved[handler] = _set_stream(handler, out if handler.stream in (sys.stdout, sys.__stdout__) else err)

    def restore():
        for handler, stream in saved.items():
            _set_stream(handler, stream)
        for handler in _console_handlers():
            if handler.stream in (out, err):
                _set_stream(handler, handler.stream.replaced)

    undo.callback(restore)


def _set_stream(handler: logging.StreamHandler, stream):
    """handler.setStream, also for a handler whose stream was closed meanwhile (one made while a test runner
    had replaced sys.stderr): there is nothing to flush then."""
    try:
        return handler.setStream(stream)
    except ValueError:
        previous, handler.stream = handler.stream, stream
        return previous


def _record_library_deprecations(undo: contextlib.ExitStack) -> None:
    """DeprecationWarnings raised in library code are ignored by Python's default filters; while capturing
    they go to the log (once per place, as FutureWarning does) unless a filter already decides otherwise
    (pytest's "always", a `-W error`). Only this filter is taken back afterwards: those that libraries
    install as they are imported stay, as they would without a capture (so no warnings.catch_warnings)."""
    deciding = next((action for action, message, category, module, _ in warnings.filters
                     if issubclass(DeprecationWarning, category) and message is None and module is None), None)
    if deciding == "ignore":
        warnings.simplefilter("default", DeprecationWarning)
        added = warnings.filters[0]
        undo.callback(lambda: added in warnings.filters and warnings.filters.remove(added))


# ---------------------------------------------------------------- transformers' load report


def _watch_load_reports(undo: contextlib.ExitStack) -> None:
    """Hear from_pretrained's load report as data: `PreTrainedModel._finalize_model_loading` calls
    `log_state_dict_report(model=..., loading_info=LoadStateDictInfo, ...)` through modeling_utils' module
    namespace (utils/loading_report.py formats the table and logs it as one warning). The wrapper says
    our line, then lets the original log its table (into the log file). Imports transformers' modeling code
    (and torch): a run imports it anyway to load its model."""
    import importlib.util
    import inspect

    if importlib.util.find_spec("transformers") is None:
        return
    from transformers import modeling_utils

    original = modeling_utils.log_state_dict_report
    if getattr(original, "hftoolkit_hook", False):
        return  # an outer capture listens already
    signature = inspect.signature(original)

    def log_state_dict_report(*args, **kwargs):
        if _active and _active.explain_loading:
            given = signature.bind(*args, **kwargs).arguments
            for say, line in explain_load_report(given["model"], given["loading_info"]):
                say(line)
        return original(*args, **kwargs)

    log_state_dict_report.hftoolkit_hook = True
    modeling_utils.log_state_dict_report = log_state_dict_report
    undo.callback(setattr, modeling_utils, "log_state_dict_report", original)


def explain_load_report(model, info) -> list[tuple]:
    """(note or warn, line) per kind of problem in a `LoadStateDictInfo`.

    A missing key outside the base model (`model.base_model_prefix`) belongs to a task head that the
    checkpoint never had: initialised from scratch, which is what fine-tuning for a new task means.
    A missing key inside the base model means the checkpoint lacks part of the network it should hold.
    """
    prefix = getattr(model, "base_model_prefix", "") + "."
    head = sorted(k for k in info.missing_keys if not k.startswith(prefix))
    body = sorted(k[len(prefix):] for k in info.missing_keys if k.startswith(prefix))
    lines = []
    if head:
        lines.append((note, f"{_modules(head, 1)} head initialised from scratch ({_tensors(head)}): "
                            "expected when fine-tuning for a new task"))
    if body:
        lines.append((warn, f"{_tensors(body)} of the base model not in the checkpoint, initialised from scratch "
                            f"({_modules(body, 2)}): check that model.checkpoint matches the architecture"))
    if info.unexpected_keys:
        keys = sorted(info.unexpected_keys)
        lines.append((note, f"checkpoint weights unused by this task, left out ({_tensors(keys)}: "
                            f"{_modules(keys, 2)}): expected when the checkpoint was saved with another head"))
    if info.mismatched_keys:
        keys = sorted(k[0] for k in info.mismatched_keys)
        lines.append((warn, f"checkpoint weights of another shape, initialised from scratch ({_tensors(keys)}: "
                            f"{_modules(keys, 2)})"))
    return lines


def _modules(keys: list[str], depth: int) -> str:
    names = list(dict.fromkeys(".".join(k.split(".")[:-1][:depth]) or k for k in keys))
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _tensors(keys: list[str]) -> str:
    return f"{len(keys)} tensor{'s' if len(keys) != 1 else ''}"
