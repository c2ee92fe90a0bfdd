"""The run directory: the one place a run's results live (docs/architecture.md, "The run directory").

One writer at a time holds `run.lock`, and every file is written atomically, so a killed run never leaves a file
half-written and a folder whose lock nobody holds has no live writer. Light: no torch import.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hftoolkit import __version__
from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import ADAPTER, CONFIG, LOCK, MANIFEST, METRICS, MODEL, RECIPE
from hftoolkit.base.secrets import redact

if TYPE_CHECKING:
    from hftoolkit.config.recipe import Recipe

# The status of a run whose weights were saved and whose eval pass (or what follows it) then failed.
TRAINED_EVAL_FAILED = "trained, eval failed"
# A status check holds the lock shared for an instant; a writer retries that long before calling the folder in use.
LOCK_PATIENCE_SECONDS = 2.0
# The libraries whose versions say what a run ran on: manifest.json's `versions` records each, `doctor` shows each
# beside the CLI's own (cli/doctor.py), `--version` the engines among them (cli/app.py).
LIBRARIES = ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "evaluate", "bitsandbytes")


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # ------------------------------------------------------------ lifecycle

    def refusal(self, overwrite: bool = False, resume: bool = False) -> str | None:
        """Why the run may not write here, or None: a live run writes here, or an existing non-empty folder needs
        --overwrite or --resume. Asked before the recipe is resolved, so that it is reported with the recipe's
        and the data's problems."""
        if self.path.exists() and not self.path.is_dir():
            return f"--output: {self.path} is a file, not a folder: choose another output path"
        held = self.in_use("train" + (" --resume" if resume else " --overwrite" if overwrite else ""))
        if held:
            return held
        if self.contents() and not resume and not overwrite:
            return (f"--output: run directory {self.path} is not empty: pass --overwrite to replace it, "
                    "--resume to continue it, or choose another name")
        return _not_writable(self.path)

    def claim(self, overwrite: bool = False, resume: bool = False, command: str | None = None) -> dict | None:
        """Make sure the run may write here (an existing non-empty folder needs --overwrite or --resume) and hold
        its lock; returns the record of a previous writer that ended without releasing it (an interrupted run)."""
        refusal = self.refusal(overwrite, resume)
        if refusal:
            raise UserError(refusal)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            interrupted = self.hold("train", command)
            if not resume:
                self._remove(self.contents())
        except PermissionError:  # os.access can say yes where the file system then says no (root-squashed NFS)
            raise UserError(_not_writable(self.path, checked=False)) from None
        return interrupted

    def start(self, recipe_yaml: str, command: list[str], seed: int) -> None:
        self.write_text(RECIPE, recipe_yaml)
        previous = self.manifest()
        previous.pop("stopped_at_step", None)  # (a resumed run goes on past it)
        self.write_json(MANIFEST, {
            **previous, "status": "running", "hftoolkit_version": __version__,
            "started": previous.get("started", _now()), "finished": None, "error": None,
            "command": " ".join(command), "seed": seed, "git_sha": _git_sha(), "versions": _versions(),
            "hardware": _hardware(),
        })

    def update_manifest(self, **fields) -> None:
        self.write_json(MANIFEST, {**self.manifest(), **fields})

    def finish(self, status: str, error: str | None = None) -> None:
        self.update_manifest(status=status, error=error, finished=_now())

    # ------------------------------------------------------------ the writer's lock

    def hold(self, doing: str, command: str | None = None) -> dict | None:
        """Take the run's lock for this process until `release` (or its end); `doing` names the operation in a
        refusal, `command` (the command line, else `doing`) is recorded for others to read. Returns the record a
        writer that ended without a word left, or None. Raises UserError naming the live writer when one holds it."""
        lock = self.path / LOCK
        deadline = time.monotonic() + LOCK_PATIENCE_SECONDS
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError:
                raise UserError(_not_writable(self.path, checked=False)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise UserError(self.in_use(doing) or f"{doing}: {self.path} is in use: try again") from None
            if os.fstat(fd).st_ino == _inode(lock):  # (not a file its previous holder removed while releasing)
                break
            os.close(fd)
        previous = _lock_record(os.read(fd, 1 << 16))
        # (the command line is shown to whoever finds the folder in use: its secrets masked, as in every file)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now(),
                  "command": redact(command or doing)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        _held[self.path.resolve()] = fd
        return previous

    @contextlib.contextmanager
    def held(self, doing: str, command: str | None = None):
        """The lock held while the block writes the run (`hold`, then `release`)."""
        self.hold(doing, command)
        try:
            yield self
        finally:
            self.release()

    def release(self) -> None:
        """Give the lock up: its file goes (a folder without one has no writer), then the lock."""
        fd = _held.pop(self.path.resolve(), None)
        if fd is not None:
            (self.path / LOCK).unlink(missing_ok=True)
            os.close(fd)

    def discard(self) -> None:
        """Remove the run folder: what it holds only while this process holds its lock (a folder it does not hold
        is another run's), then the folder itself if that left it empty."""
        if self.path.resolve() in _held:
            self._remove(self.contents())
            self.release()
        with contextlib.suppress(OSError):
            self.path.rmdir()

    @staticmethod
    def _remove(paths: list[Path]) -> None:
        for path in paths:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def holder(self) -> dict | None:
        """The live writer's record (pid, host, started, command), or None when no process holds the lock."""
        try:
            fd = os.open(self.path / LOCK, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # (released at close)
        except BlockingIOError:
            return _lock_record(os.read(fd, 1 << 16)) or {}
        finally:
            os.close(fd)

    def in_use(self, command: str) -> str | None:
        """The one-line refusal of `command` while another process writes this run, or None."""
        if self.path.resolve() in _held:
            return None
        holder = self.holder()
        if holder is None:
            return None
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since {holder.get('started', '?')}"
        what = f" (`{holder['command']}`)" if holder.get("command") else ""
        return (f"{command}: run directory {self.path} is being written by a live run{what}, {who}: wait for it to "
                f"end, or stop it (kill {holder.get('pid', 'PID')} on {holder.get('host', 'its host')}) and try again")

    # ------------------------------------------------------------ reading

    def contents(self) -> list[Path]:
        """What the folder holds besides its lock (none when it does not exist)."""
        return [p for p in self.path.iterdir() if p.name != LOCK] if self.path.is_dir() else []

    def manifest(self) -> dict:
        path = self.path / MANIFEST
        return json.loads(path.read_text()) if path.is_file() else {}

    def metrics(self) -> dict:
        path = self.path / METRICS
        return json.loads(path.read_text()) if path.is_file() else {}

    def weights_dir(self) -> Path:
        for name in (ADAPTER, MODEL):
            if (self.path / name).is_dir():
                return self.path / name
        raise UserError(f"{self.path}: no adapter/ or model/ folder, so the run did not finish; "
                        "train it again or resume it with --resume")

    # ------------------------------------------------------------ atomic writes

    def write_text(self, name: str, text: str) -> Path:
        return write_text_atomic(self.path / name, text)

    def write_json(self, name: str, data) -> Path:
        return self.write_text(name, json.dumps(data, indent=2, default=_jsonable) + "\n")

    def write_jsonl(self, name: str, rows) -> Path:
        return self.write_text(name, "".join(json.dumps(r, default=_jsonable) + "\n" for r in rows))


# The run locks this process holds (folder -> descriptor); a forked child closes its copies, so that the lock is
# released when its holder ends, not when the last of its data loader workers does.
_held: dict[Path, int] = {}


@dataclass(frozen=True)
class FinishedRun:
    """A run directory opened for reading its model: its recipe, read once, and where its weights are."""

    directory: RunDirectory
    recipe: Recipe
    weights: Path  # adapter/ (on the recipe's base), model/ (the whole model), or the folder itself (merged)

    @property
    def path(self) -> Path:
        return self.directory.path

    @property
    def merged(self) -> bool:
        """A folder `hftoolkit merge` wrote: the model itself, with the run's recipe beside it."""
        return self.weights == self.path

    @property
    def adapter(self) -> bool:
        return self.weights.name == ADAPTER and not self.merged


def open_run(path: str | Path, merged: bool = False) -> FinishedRun:
    """The one open of a finished run, for every command that reads one (eval, predict, merge, serve, push, bench):
    it is a run directory, its recipe is read, and its weights are found. `merged`: a folder `hftoolkit merge`
    wrote is accepted too. Refused in one line otherwise."""
    from hftoolkit.config.recipe import load_recipe

    problem = run_folder_problem(path, merged=merged)
    if problem:
        raise UserError(problem)
    run = RunDirectory(path)
    weights = run.path if merged and (run / CONFIG).is_file() else run.weights_dir()
    return FinishedRun(run, load_recipe(run / RECIPE), weights)


def run_folder_problem(path: str | Path, needs: tuple[str, ...] = (RECIPE,), merged: bool = False) -> str | None:
    """The one line every command that takes a run folder says when `path` is not one (it holds none of `needs`),
    or None: the folder, what is missing, the run beside it with the nearest name (difflib), and `hftoolkit runs`,
    which lists them. `merged`: a folder `hftoolkit merge` wrote is accepted too."""
    path = Path(path)
    if path.is_dir() and any((path / name).is_file() for name in needs):
        return None
    if not path.exists():
        what = "no such run folder"
    elif not path.is_dir():
        what = "a file, not a run folder"
    else:
        files = f"{', '.join(needs[:-1])} or {needs[-1]}" if len(needs) > 1 else needs[0]
        what = f"not a run folder (no {files})"
    inside = runs_in(path) if path.is_dir() else []
    if inside:  # (the folder of the runs, or a sweep's, given for one of them)
        return f"{path}: {what}: it holds runs: pass one of them, such as {inside[0]} ({_lister(path)} lists them)"
    close = close_run(path)
    advice = f"did you mean {close}?" if close else \
        f"pass a folder written by hftoolkit train{' or hftoolkit merge' if merged else ''}"
    return f"{path}: {what}: {advice} ({_lister(path.parent)} lists them)"


def meant_run_folder(target: str | Path) -> str | None:
    """For an argument that names a recipe or a run folder (eval, train --resume): the run-folder refusal where
    `target` is neither, looks like a folder (no .yaml suffix) and has runs beside it; None where the recipe's own
    refusal fits better (a recipe file, or a shipped recipe's name, misspelt)."""
    from hftoolkit.config.shipped import close_match, find_recipe

    target = Path(target)
    if target.exists() or target.suffix.lower() in (".yaml", ".yml") or find_recipe(target).exists():
        return None
    if not runs_in(target.parent) or (close_run(target) is None and close_match(target) is not None):
        return None
    return run_folder_problem(target)


def runs_in(folder: Path) -> list[Path]:
    """The run folders directly inside `folder` (those holding manifest.json or recipe.yaml), sorted by name."""
    try:
        children = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    except OSError:  # (no such folder, or one that can't be read)
        return []
    return [p for p in children if (p / MANIFEST).is_file() or (p / RECIPE).is_file()]


def close_run(path: str | Path) -> Path | None:
    """The run beside `path` whose name is nearest its name (a typo), or None."""
    path = Path(path)
    names = [p.name for p in runs_in(path.parent) if p.name != path.name]
    found = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return path.parent / found[0] if found else None


def _lister(folder: Path) -> str:
    """The command that lists the runs in `folder`: plain `hftoolkit runs` where its default folder holds them, or
    where `folder` does not exist either."""
    default = Path("runs").resolve()
    plain = not folder.is_dir() or folder.resolve().is_relative_to(default)
    return "hftoolkit runs" if plain else f"hftoolkit runs {folder}"


def _close_held_in_child() -> None:
    for fd in _held.values():
        os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _lock_record(data: bytes) -> dict | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def write_atomic(path: Path, data: bytes) -> Path:
    """Write bytes so that `path` holds either the old content or the new, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes the file private; a run's files follow the user's umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Text written as `write_atomic` writes bytes, its secrets masked first (base/secrets.py): every text file a
    user reads or hands on (a run's files, reports, a search's files, an export's Modelfile) is written here, so
    that no writer can forget it; a YAML file's masked values are quoted, so that it still loads."""
    path = Path(path)
    return write_atomic(path, redact(text, yaml=path.suffix in (".yaml", ".yml")).encode("utf-8"))


@contextlib.contextmanager
def staged_folder(out: Path):
    """A new folder that appears at `out` whole or not at all: the block writes into a hidden folder beside it,
    moved into place when the block ends; on any error, or a kill, only that hidden folder can be left, and an
    error removes it. `out` may exist if it is empty; the folders made above it are removed again on error."""
    out = Path(out)
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield staging
        follow_umask(staging)
        staging.chmod(0o777 & ~_umask())
        if out.is_dir():
            out.rmdir()  # (empty: the caller checked; a folder filled meanwhile makes this fail, and nothing moves)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def follow_umask(folder: Path) -> None:
    """Give the files under `folder` the mode the user's umask asks for: libraries that write weights
    (safetensors) create them private, and a run's files are meant to be handed on."""
    mode = 0o666 & ~_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file():
            path.chmod(mode)


def _not_writable(path: Path, checked: bool = True) -> str | None:
    """Why this process may not write the run directory `path` (or its nearest existing parent), or None.
    A bind-mounted folder that `docker run -v` created is root's, and the container's user is not root."""
    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if checked and os.access(folder, os.W_OK | os.X_OK):
        return None
    uid, gid = os.getuid(), os.getgid()
    return (f"run directory {path}: uid {uid} may not write in {folder} (owned by uid {folder.stat().st_uid}): "
            f"give it write access, e.g. `sudo chown -R {uid}:{gid} {folder}` on the host for a bind-mounted "
            "folder, or choose another --output")


def _umask() -> int:
    mask = os.umask(0)  # (read by setting: the only way the standard library offers)
    os.umask(mask)
    return mask


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def installed_version(name: str) -> str | None:
    """The installed version of the distribution `name`, read from its metadata (no import of it); None where it is
    not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _versions() -> dict:
    return {"python": platform.python_version(), **{name: installed_version(name) for name in LIBRARIES}}


def _hardware() -> dict:
    info = {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count()}
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
