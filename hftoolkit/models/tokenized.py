"""Tokenization done once, in parallel: every formulation's `preprocess` maps its split through `encode`.

A split held in memory is mapped with data.num_proc processes into the toolkit's tokenized cache, named by what
decides the result (`cache_key`); a stream (data.streaming) is mapped lazily and never cached. `tokenizing` says
in one console line what a run tokenized or reused, and how long it took.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from hftoolkit.base import console
from hftoolkit.job.spec import Job
from hftoolkit.sources.locations import cache_root

# How many rows a stream maps at a time: enough to amortize the tokenizer's call, few enough to stay small.
STREAM_BATCH = 1000


@dataclass
class Tally:
    """What the preprocessing of one run did."""

    rows: int = 0
    reused: int = 0
    streamed: int = 0
    processes: int = 1
    seconds: float = 0.0
    splits: list[str] = field(default_factory=list)


_tally: Tally | None = None
_in_memory = False  # set by in_memory(): a split is mapped without the cache, the tally or progress


@contextlib.contextmanager
def in_memory():
    """Inside it, `encode` maps a split in memory and writes nothing: for a sample tokenized to be looked at (the
    plan's lengths), which must neither fill the cache nor count as the run's tokenization."""
    global _in_memory
    _in_memory = True
    try:
        yield
    finally:
        _in_memory = False


def encode(job: Job, tokenizer, dataset, fn, *, batch_size: int | None = 1000, key_extra=(), **kwargs):
    """`dataset.map(fn, batched=True, remove_columns=every column)`, cached and in parallel.

    A split held in memory is mapped with data.num_proc processes into an Arrow file in `cache_root()/tokenized`
    named by `cache_key`. datasets' own cache does the work (`map(cache_file_name=..., new_fingerprint=...)`): a
    run with the same key maps nothing and reads the file. A stream is mapped lazily, batch by batch as training
    reads it, and never cached.

    batch_size None maps a split as one batch (clm packing); a stream then packs STREAM_BATCH rows at a time.
    key_extra: anything else the result depends on (a seed the function reads).
    """
    from hftoolkit.sources.streaming import is_stream

    columns = dataset.column_names
    if _in_memory:
        return dataset.map(fn, batched=True, batch_size=batch_size, remove_columns=columns, keep_in_memory=True,
                           **kwargs)
    if is_stream(dataset):
        if _tally is not None:
            _tally.streamed += 1
        return dataset.map(fn, batched=True, batch_size=batch_size or STREAM_BATCH, remove_columns=columns, **kwargs)
    key = cache_key(job, tokenizer, dataset, fn, (batch_size, *key_extra))
    folder = cache_root() / "tokenized"
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.glob(f"{key}*.arrow"))
    processes = min(job.recipe.data.num_proc or 1, max(len(dataset), 1))
    started = time.perf_counter()
    with console.work_progress("tokenizing", len(dataset)) as advance:
        if processes == 1:  # (with several, fn runs in other processes: each shard's end is all that is seen)
            fn = _counted(fn, advance)
        with _environ_kept():
            out = dataset.map(fn, batched=True, batch_size=batch_size, remove_columns=columns,
                              num_proc=processes if processes > 1 else None, new_fingerprint=key,
                              cache_file_name=str(folder / f"{key}.arrow"), load_from_cache_file=True, **kwargs)
    files = {Path(f["filename"]) for f in out.cache_files}
    if _tally is not None:
        _tally.rows += len(dataset)
        _tally.reused += len(dataset) if files and files <= before else 0
        _tally.processes = max(_tally.processes, processes)
        _tally.seconds += time.perf_counter() - started
    return out


@contextlib.contextmanager
def _environ_kept():
    """datasets' map with num_proc (5.x) sets `os.environ` to a copy of itself. Whatever kept the process's
    mapping (rich's consoles read the width from it) then reads a stale one, and a later setenv goes past it. So
    the process's own mapping comes back afterwards, holding what the copy held."""
    original = os.environ
    try:
        yield
    finally:
        replaced, os.environ = os.environ, original
        if replaced is not original:
            for name in set(original) - set(replaced):
                del original[name]
            original.update(replaced)


def _counted(fn, advance):
    """`fn`, telling `advance` how many rows each batch held (the key is computed from `fn` itself)."""
    def counted(batch, *args, **kwargs):
        advance(len(next(iter(batch.values()))) if batch else 0)
        return fn(batch, *args, **kwargs)

    return counted


def cache_key(job: Job, tokenizer, dataset, fn, extra=()) -> str:
    """The tokenized split's name in the cache: a hash of everything its content depends on.

    That is the split's own fingerprint (the datasets library's, derived from the files read and every step
    applied to them), the tokenizer's vocabulary, rules and special tokens, the job's lengths and data settings,
    and the code of the modules that encode: a new tokenizer or max_length is a new key. The library's implicit
    fingerprints are not used: they hash the encode function with everything it closes over, the whole job
    included, so a changed learning rate would tokenize again; and its cache files lie beside each source."""
    from hftoolkit import __version__

    d = job.recipe.data
    h = hashlib.sha256()
    for part in (dataset._fingerprint, job.recipe.task, job.family, job.max_length, job.max_target_length,
                 d.source_prefix, d.packing, d.messages_column, fn.__qualname__, _code(fn), _encoding_code(),
                 __version__, tokenizer_identity(tokenizer), *extra):
        h.update(repr(part).encode() + b"\0")
    return "tok-" + h.hexdigest()[:24]


def tokenizer_identity(tokenizer) -> str:
    """A hash of what decides a tokenizer's output: its model, normalizer and pre-tokenizer (tokenizer.json),
    or its vocabulary for a slow tokenizer; its special tokens, sides and chat template. The truncation and
    padding a call last set are left out: every call sets its own."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
        text = json.dumps(state, sort_keys=True)
    else:
        text = json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = {name: getattr(tokenizer, name, None) for name in (
        "padding_side", "truncation_side", "add_prefix_space", "chat_template", "model_max_length")}
    extra.update(cls=type(tokenizer).__name__, special=getattr(tokenizer, "special_tokens_map", None),
                 pad=getattr(tokenizer, "pad_token_id", None), eos=getattr(tokenizer, "eos_token_id", None))
    return hashlib.sha256((text + json.dumps(extra, sort_keys=True, default=str)).encode()).hexdigest()


def _code(fn) -> str:
    """The source of the module that defines `fn`: a change to it, or to the helpers beside it, is a new key."""
    try:
        return hashlib.sha256(Path(inspect.getfile(fn)).read_bytes()).hexdigest()
    except (OSError, TypeError):
        return fn.__code__.co_code.hex()


def _encoding_code() -> str:
    """The source of every module a preprocess function calls into (the families, the conversation rendering)."""
    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "models" / "families").glob("*.py")) + [root / "sources" / "conversations.py"]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


@contextlib.contextmanager
def tokenizing(job: Job):
    """Tally the preprocessing inside; then say in one line what it did. Yields the Tally (its seconds count in
    metrics.json's data_seconds)."""
    global _tally
    outer, _tally = _tally, Tally()
    tally, started = _tally, time.perf_counter()
    try:
        yield tally
    finally:
        _tally = outer
        tally.seconds = time.perf_counter() - started
    line = summary(tally)
    if line:
        console.phase(line)


def summary(tally: Tally) -> str | None:
    """'tokenized 240 rows in 0.4 s (2 processes)', 'tokenized data reused from the cache: 240 rows', ..."""
    parts = []
    if tally.rows and tally.reused == tally.rows:
        parts.append(f"tokenized data reused from the cache ({cache_root() / 'tokenized'}): {tally.rows:,} rows, "
                     "nothing tokenized")
    elif tally.rows:
        with_processes = f" with {tally.processes} processes" if tally.processes > 1 else ""
        parts.append(f"tokenized {tally.rows:,} rows in {tally.seconds:.1f} s{with_processes}"
                     + (f" ({tally.reused:,} reused from the cache)" if tally.reused else ""))
    if tally.streamed:
        parts.append("the stream is tokenized as training reads it")
    return "; ".join(parts) or None
