"""Hub ids as transformers and datasets treat them: the libraries decide, this module only explains.

Whether a hub id loads online, from the cache, through a mirror or at a `revision` is up to the libraries;
hftoolkit opens no connection of its own. `explain` turns the errors they raise into one line (where: what: what
to do), `offline` and `cache_report` read the same settings the libraries read.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from hftoolkit.base.errors import UserError

NOT_CACHED = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout",
              "TimeoutException", "ConnectionError"}  # builtin ConnectionError covers requests' and datasets' own


def offline(kind: str = "model") -> bool:
    """Offline mode as the library that loads `kind` reads it, no network probe: huggingface_hub's HF_HUB_OFFLINE
    (or TRANSFORMERS_OFFLINE) for models; for data sets, datasets' own copy (HF_DATASETS_OFFLINE overrides it)."""
    config = sys.modules.get("datasets.config") if kind == "dataset" else None
    if config is not None:
        return bool(config.HF_HUB_OFFLINE)
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def endpoint() -> str:
    """The Hub the libraries talk to: HF_ENDPOINT (a mirror) or https://huggingface.co."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloaded repositories (HF_HUB_CACHE, by default $HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def datasets_cache() -> Path:
    """Where datasets keeps prepared Arrow tables (HF_DATASETS_CACHE, by default $HF_HOME/datasets): the copy
    `load_dataset` reads offline. Read from datasets.config when datasets is loaded, else as it would compute it."""
    config = sys.modules.get("datasets.config")
    if config is not None:
        return Path(config.HF_DATASETS_CACHE)
    from huggingface_hub import constants

    return Path(os.path.expanduser(os.getenv("HF_DATASETS_CACHE") or os.path.join(constants.HF_HOME, "datasets")))


@contextmanager
def explained(key: str, repo_id: str, kind: str, *, revision: str | None = None, config: str | None = None):
    """Run a hub load; an error `explain` recognises leaves as its UserError (one line), any other unchanged."""
    try:
        yield
    except Exception as err:
        problem = explain(err, key, repo_id, kind, revision=revision, config=config)
        if problem is None:
            raise
        raise problem from None


def explain(err: BaseException, key: str, repo_id: str, kind: str, *, revision: str | None = None,
            config: str | None = None) -> UserError | None:
    """One line for an error that loading hub id `repo_id` raised, or None when it is not a hub problem.

    Args:
        err: what AutoConfig / AutoTokenizer / from_pretrained (kind "model") or load_dataset (kind "dataset")
            raised; transformers wraps the hub error in an OSError, so the whole cause chain is read.
        key: the recipe key that named the id (`model.checkpoint`, `data.train`), which the message starts with.
    """
    chain = _chain(err)
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    text = "\n".join(str(e) for e in chain)
    what = f"hub {'data set' if kind == 'dataset' else 'model'} {repo_id}"
    what += f" (config {config})" if config else ""
    what += f" at revision {revision}" if revision else ""
    local = "a local file" if kind == "dataset" else "a local folder saved with save_pretrained"
    page = f"{endpoint()}/{'datasets/' if kind == 'dataset' else ''}{repo_id}"

    if "GatedRepoError" in names or ("DatasetNotFoundError" in names and "gated" in text):
        return UserError(f"{key}: {what} is gated: accept its conditions at {page} and set HF_TOKEN (or run "
                         "`hf auth login`) for an account that has access")
    if "RevisionNotFoundError" in names or ("DatasetNotFoundError" in names and "Revision '" in text):
        return UserError(f"{key}: {what}: the revision does not exist: use a branch, tag or commit sha listed at "
                         f"{page}")
    if names & {"RepositoryNotFoundError", "DatasetNotFoundError"}:
        return UserError(f"{key}: {what} was not found at {endpoint()}: check the id (owner/name); for a private "
                         "repository set HF_TOKEN for an account that can read it")
    if listing := _dataset_listing(text, key, what):
        return listing
    if names & NOT_CACHED or "is not cached" in text or "couldn't connect" in text.lower():
        cache = datasets_cache() if kind == "dataset" else hub_cache()
        if offline(kind):
            return UserError(f"{key}: {what} is not in the cache ({cache}) and HF_HUB_OFFLINE is set: run once "
                             f"online with the same HF_HOME to fill the cache, or point {key} at {local}")
        return UserError(f"{key}: {what} could not be fetched from {endpoint()} (no connection) and is not in the "
                         f"cache ({cache}): check the network or HF_ENDPOINT, or point {key} at {local}")
    if missing := re.search(r"does not appear to have (?:a file named|files named) (.+?)\. Checkout", text):
        return UserError(f"{key}: {what} has no {missing.group(1)}, so it is not a transformers checkpoint: "
                         "check the id, or name a repository with a config.json and weights")
    if "Dataset scripts are no longer supported" in text:
        return UserError(f"{key}: {what} is loaded by a Python script, which datasets no longer runs: use an id "
                         "of the same data in parquet form (many such sets moved under an organisation, e.g. "
                         "nyu-mll/glue), or a local file")
    if names & {"DataFilesNotFoundError", "EmptyDatasetError"}:
        return UserError(f"{key}: {what} holds no data files that datasets can read: check the id and config")
    if "HFValidationError" in names:
        return UserError(f"{key}: {repo_id!r} is neither an existing local path nor a valid hub id "
                         "(owner/name of letters, digits, '-', '_', '.'): check the spelling")
    if "HfHubHTTPError" in names:
        status = next((getattr(getattr(e, "response", None), "status_code", None) for e in chain
                       if getattr(e, "response", None) is not None), None)
        return UserError(f"{key}: {endpoint()} answered {status or 'an error'} for {what}: "
                         f"{str(err).splitlines()[0]}: retry later, or check HF_ENDPOINT and HF_TOKEN")
    return None


_LISTINGS = (  # datasets' messages for an unknown config or split: (pattern, what went wrong, what to do)
    (r"Couldn't find cache for .+? for config '(?P<name>[^']+)'\nAvailable configs in the cache: \[(?P<all>.*)\]",
     "has no config {name!r} in the cache; cached configs: {all}", "name one of them, or run once online to "
                                                                   "cache that config"),
    (r"BuilderConfig '(?P<name>[^']+)' not found\. Available: \[(?P<all>.*)\]",
     "has no config {name!r}; its configs: {all}", "name one of them"),
    (r"Config name is missing\.\nPlease pick one among the available configs: \[(?P<all>.*)\]",
     "has several configs ({all})", "name one of them"),
    (r"There are multiple '.+?' configurations in the cache: (?P<all>.*)\n",
     "has several configs in the cache ({all})", "name one of them"),
    (r"Unknown split \"(?P<name>[^\"]+)\"\. Should be one of \[(?P<all>.*)\]",
     "has no split {name!r}; its splits: {all}", "use one of them"),
    (r"Bad split: (?P<name>\S+?)\. Available splits: \[(?P<all>.*)\]",
     "has no split {name!r}; its splits: {all}", "use one of them"),
)


def _dataset_listing(text: str, key: str, what: str) -> UserError | None:
    for pattern, wrong, todo in _LISTINGS:
        if match := re.search(pattern, text):
            fields = match.groupdict()
            if "all" in fields:
                fields["all"] = ", ".join(n.strip(" '\"") for n in fields["all"].split(","))
            return UserError(f"{key}: {what} {wrong.format(**fields)}: {todo}")
    return None


def _chain(err: BaseException) -> list[BaseException]:
    """err and its causes and contexts, each once (a cycle ends the walk). Errors are recognised by class name
    along this chain, so this module imports neither transformers nor datasets (nor httpx), and stays cheap."""
    out: list[BaseException] = []
    todo = [err]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        todo += [e.__cause__, e.__context__]
    return out


# ---------------------------------------------------------------- doctor


def cache_report() -> list[tuple[str, str]]:
    """Rows for `doctor`: the caches and their size on disk, the endpoint, offline mode, and whether a token is
    set (where from, never its value)."""
    hub = hub_cache()
    rows = [("hub cache", f"{hub} ({_size(_disk_usage(hub))})" if hub.is_dir() else f"{hub} (empty)"),
            ("datasets cache", str(datasets_cache())),
            ("hub endpoint", endpoint() + (" (HF_ENDPOINT)" if os.getenv("HF_ENDPOINT") else "")),
            ("hub offline", "yes (HF_HUB_OFFLINE: cached ids only)" if offline() else "no"),
            ("hub token", _token_source())]
    return rows


def _token_source() -> str:
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.getenv(name, "").strip():
            return f"set ({name})"
    try:
        if Path(constants.HF_TOKEN_PATH).read_text().strip():
            return "set (token file)"
    except OSError:
        pass
    return "not set"


# A hub data set's read is said on the console once it has lasted this long, and again every so often.
PROGRESS_AFTER, PROGRESS_EVERY = 2.0, 5.0


@contextmanager
def download_progress(repo_id: str):
    """While a hub data set is read (downloaded, then prepared as Arrow tables): the bytes its cache folders hold,
    said on the console when they grew, once the read has lasted PROGRESS_AFTER seconds. datasets' own bars go
    to train.log with the rest of the libraries' output; a read from the cache says nothing."""
    import threading

    from hftoolkit.base import console

    folders = [hub_cache() / f"datasets--{repo_id.replace('/', '--')}", datasets_cache() / repo_id.replace("/", "___")]
    stop = threading.Event()

    def watch():
        said, wait = sum(_disk_usage(f) for f in folders), PROGRESS_AFTER
        while not stop.wait(wait):
            wait, now = PROGRESS_EVERY, sum(_disk_usage(f) for f in folders)
            if now > said:
                console.note(f"reading {repo_id} from the hub: {_size(now)} in the cache so far")
                said = now

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _disk_usage(root: Path) -> int:
    """Bytes of the regular files under root; symlinks (the snapshots' pointers into blobs/) are not followed,
    so each blob counts once."""
    total, todo = 0, [str(root)]
    while todo:
        try:
            entries = os.scandir(todo.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _size(n: int) -> str:
    from hftoolkit.base.console import GIB, gib

    return gib(n) if n >= GIB else f"{n / 2**20:.1f} MiB"
