"""`data.streaming: true`: data.train read as a stream, row by row, as training takes the rows.

A corpus larger than memory can then train: nothing is read before the first step but the eval rows, and memory
holds one batch of rows at a time. Hub ids, local files and `builtin:` sets all stream (a builtin set is turned
into a stream), so tests exercise the same path.
"""

from __future__ import annotations

import hashlib
import os

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.config.recipe import Recipe
from hftoolkit.sources.locations import expand

# The file builders that read a file as a stream (aligned target files and image folders do not stream).
STREAMED_FILES = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet",
                  ".txt": "text"}


def load_stream(recipe: Recipe):
    """({"train": a datasets.IterableDataset, "eval": a datasets.Dataset}, the label names or None).

    The stream is read in its own order, never shuffled: a shuffle buffer is not part of the stream's saved state,
    and an exact resume (training/streaming.py) needs the rows to come back in the same order. The eval split is
    held in memory (eval needs its size, and predictions line up with it): the first data.max_eval_samples rows
    of the stream, which training then skips; or data.eval (or data.eval_split of a hub set) read as a stream
    too, capped at data.max_eval_samples when set."""
    import datasets

    datasets.disable_progress_bars()
    d = recipe.data
    train = _open(recipe, d.train, "data.train", d.train_split)
    if d.eval or d.eval_split:
        key, source = ("data.eval", d.eval) if d.eval else ("data.eval_split", d.train)
        held = _open(recipe, source, key, d.eval_split or "validation")
        held = held.take(d.max_eval_samples) if d.max_eval_samples else held
    else:
        held, train = train.take(d.max_eval_samples), train.skip(d.max_eval_samples)
    if d.max_train_samples:
        train = train.take(d.max_train_samples)
    train, held, names = _labels(recipe, train, held)
    rows = list(held)
    if not rows:
        raise UserError(f"data.eval: no eval rows could be read from {d.eval or d.train}: "
                        "point data.eval at a data set with examples")
    evaluation = datasets.Dataset.from_list(rows, features=held.features)
    train._fingerprint = source_fingerprint(recipe)  # (the manifest's data fingerprint: the source, not its rows)
    return {"train": train, "eval": evaluation}, names


def is_stream(ds) -> bool:
    import datasets

    return isinstance(ds, datasets.IterableDataset)


def source_fingerprint(recipe: Recipe) -> str:
    """The stream's source named: a file by its path, size and modification time; a hub set by id, config,
    split and revision (reading the rows to hash them would read the whole stream)."""
    d = recipe.data
    h = hashlib.sha256()
    for part in (d.train, d.config, d.train_split, d.revision, d.max_train_samples, d.max_eval_samples):
        h.update(repr(part).encode())
    path = expand(d.train, "data.train")
    if path.is_file():
        stat = os.stat(path)
        h.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _open(recipe: Recipe, source: str, key: str, split: str):
    """One source as a stream, its columns renamed to the canonical ones, rows with an empty input dropped.
    A hub id streams as `datasets.load_dataset(..., streaming=True)` does (online, or through a mirror); local
    files stream through the same builders (STREAMED_FILES)."""
    import datasets

    from hftoolkit.sources import data as sources

    if source.startswith("builtin:"):
        ds = sources.read_source(source, key, recipe).to_iterable_dataset()
        return _filled(ds)
    path = expand(source, key)
    if sources.is_hub_source(source):
        from hftoolkit.sources import hub

        d = recipe.data
        with hub.explained(key, source, "dataset", config=d.config, revision=d.revision):
            ds = datasets.load_dataset(source, d.config, split=split, revision=d.revision, streaming=True)
    elif not path.is_file():
        raise UserError(f"{key}: data file {path.absolute()} not found: check the path")
    elif path.suffix.lower() not in STREAMED_FILES:
        raise UserError(f"{key}: {source} can't be streamed; data.streaming reads "
                        f"{', '.join(STREAMED_FILES)} files, hub ids and builtin: sets: convert it, or set "
                        "data.streaming to false")
    else:
        builder = STREAMED_FILES[path.suffix.lower()]
        kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **kwargs)
    if ds.features is None:  # (a builder that learns its columns from the first rows)
        ds = ds._resolve_features()
    return _filled(sources.map_columns(ds, recipe, key, source))


def _filled(ds):
    """Rows whose texts and target are filled in (sources.data drops the others as it reads a whole split)."""
    from hftoolkit.sources.data import is_filled as filled

    columns = [c for c in ("text", "text_pair", "target") if c in (ds.column_names or ())]
    return ds.filter(lambda row: all(filled(row[c]) for c in columns)) if columns else ds


def _labels(recipe: Recipe, train, held):
    """Labels as ids (classes, tags) or floats (regression), encoded as the rows are read. A stream's labels
    can't be counted before training reads them, so class names come from the data set's own features (a hub
    set's ClassLabel) or from data.label_names."""
    import datasets

    spec = tasks.spec(recipe.task)
    if spec.labels == "value":
        cast = lambda ds: ds.cast_column("label", datasets.Value("float32"))  # noqa: E731
        return cast(train), cast(held), None
    if spec.labels not in ("class", "tags"):
        return train, held, None
    feature = train.features["label"]
    inner = getattr(feature, "feature", feature)
    if isinstance(inner, datasets.ClassLabel):
        names = recipe.data.label_names or list(inner.names)
        if list(names) != list(inner.names):
            raise UserError(f"data.label_names: {recipe.data.train} names its classes {', '.join(inner.names)}: "
                            "list them in that order, or leave data.label_names unset")
        return train, held, names
    names = recipe.data.label_names
    if not names:
        raise UserError(f"data.label_names: the labels of a stream ({recipe.data.train}) can't be listed before "
                        "training reads it: set data.label_names to the class names, in order")
    index = {n: i for i, n in enumerate(names)}

    def to_id(value):
        if str(value) not in index:
            raise UserError(f"data.label_column: label {value!r} in {recipe.data.train} is not one of "
                            f"data.label_names ({', '.join(names)}): fix the data or add the label")
        return index[str(value)]

    def encode(row):
        label = row["label"]
        return {"label": [to_id(v) for v in label] if isinstance(label, list) else to_id(label)}

    features = train.features.copy()
    features["label"] = datasets.List(datasets.Value("int64")) if inner is not feature else datasets.Value("int64")
    return (*(ds.map(encode, features=features) for ds in (train, held)), list(names))
