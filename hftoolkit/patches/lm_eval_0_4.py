"""lm-evaluation-harness 0.4 indexes its own task files (some fourteen thousand YAML files) each time a TaskManager is
made with its defaults: seconds, for the same answer while the installed lm-eval is the same. `cached_default_index`
keeps that index in hftoolkit's cache, one file per lm-eval version and install folder, and hands it to
`TaskIndex.build` while the block runs; every other folder is indexed as lm-eval does."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

LIBRARY = "lm-eval"
VERSIONS = ">=0.4.13,<0.4.14"


def default_tasks() -> Path:
    """The folder of lm-eval's own task files."""
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).resolve().parent


@contextmanager
def cached_default_index(folder: Path, defaults: Path | None = None):
    """Within the block, `TaskIndex.build` reads the index of `defaults` (lm-eval's own tasks) from `folder`, building
    and keeping it there the first time."""
    from importlib.metadata import version

    from lm_eval.tasks._index import TaskIndex

    defaults = (defaults or default_tasks()).resolve()
    key = hashlib.sha256(f"{version(LIBRARY)}\0{defaults}".encode()).hexdigest()[:16]
    kept = Path(folder) / f"tasks-{version(LIBRARY)}-{key}.json"
    original = TaskIndex.__dict__["build"]
    build = original.__func__

    def cached(paths, **kwargs):
        index = {}
        for root in paths:  # (lm-eval merges the folders in order, a later one's task over an earlier one's)
            if Path(root).resolve() == defaults and not kwargs:
                index.update(_kept(kept, lambda root=root: build([root])))
            else:
                index.update(build([root], **kwargs))
        return index

    TaskIndex.build = staticmethod(cached)
    try:
        yield
    finally:
        TaskIndex.build = original


def _kept(path: Path, make):
    """The index `make()` builds, kept in `path` as JSON (its entries' task configs are YAML's plain values), written
    whole or not at all."""
    from lm_eval.tasks._index import Entry, Kind

    if path.is_file():
        try:
            return {row["name"]: Entry(row["name"], Kind[row["kind"]], row["yaml_path"] and Path(row["yaml_path"]),
                                       row["cfg"], set(row["tags"])) for row in json.loads(path.read_text())}
        except (ValueError, KeyError, TypeError):  # a file cut short, or of another layout: index again
            pass
    index = make()
    rows = [{"name": e.name, "kind": e.kind.name, "yaml_path": e.yaml_path and str(e.yaml_path), "cfg": e.cfg,
             "tags": sorted(e.tags)} for e in index.values()]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return index


def still_needed() -> list[str]:
    """Whether TaskManager still builds its index through the static `TaskIndex.build(paths)` replaced above."""
    import inspect

    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import TaskIndex

    problems = []
    if not isinstance(TaskIndex.__dict__.get("build"), staticmethod):
        problems.append("lm_eval.tasks._index.TaskIndex.build is no longer a static method")
    if ".build(all_paths)" not in inspect.getsource(TaskManager.__init__):
        problems.append("TaskManager.__init__ no longer indexes its folders with TaskIndex.build(all_paths)")
    return problems
