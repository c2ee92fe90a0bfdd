"""Where a capture (console.capture) sends what the libraries say: train.log's sink, the stand-ins for sys.stdout
and sys.stderr, the logging handlers pointed at them, and library deprecations let through to the log."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from hftoolkit.base.secrets import redact


class LineSink(Protocol):
    """Where whole library lines go: the console's Capture (named by its shape, so this module needs no import
    of the console, which imports it)."""

    def library_line(self, line: str) -> None: ...


# Lines said before a log file is attached are held in memory, the newest this many (a non-main process never
# attaches one).
HELD_LINES = 10_000
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class LogSink:
    """train.log's lines: held in memory until a file is attached, then appended to it, one flush a line
    (a killed run keeps what was said). Colour codes are dropped; each line starts with the time. Secrets are
    masked (base/secrets.py): a library may print a URL with its password, and a log is attached to bug reports."""

    def __init__(self):
        self.file = None
        self.path: Path | None = None
        self.held: deque[str] = deque(maxlen=HELD_LINES)

    def line(self, text: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} {redact(ANSI.sub('', text))}\n"
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

    def __init__(self, capture: LineSink, replaced):
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


def fileno_of(stream) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None


def _last_state(line: str) -> str:
    shown = [s for s in line.split("\r") if s.strip()]
    return shown[-1] if shown else ""



def console_handlers() -> Iterator[logging.StreamHandler]:
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


def redirect_handlers(out: LineStream, err: LineStream, undo: contextlib.ExitStack) -> None:
    """Point console handlers at the capture's streams; afterwards back where they were. A library that sets
    up its logging during the capture (transformers, datasets and huggingface_hub add a handler on the
    sys.stderr of that moment) gets its handler pointed at the stream the capture's stood in for."""
    saved = {}
    for handler in console_handlers():
        if handler not in saved:
            saved[handler] = _set_stream(handler, out if handler.stream in (sys.stdout, sys.__stdout__) else err)

    def restore():
        for handler, stream in saved.items():
            _set_stream(handler, stream)
        for handler in console_handlers():
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


def record_library_deprecations(undo: contextlib.ExitStack) -> None:
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
