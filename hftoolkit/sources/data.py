"""Data sources and column mapping: local files, hub data sets and `builtin:` sets.

`load_data(recipe)` returns the "train" and "eval" splits with canonical column names, so families never see the
user's column names, and the label names found in the data (labels.py encodes them; the job keeps them).
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.config.recipe import Recipe, RecipeError
from hftoolkit.sources.labels import as_names, encode_labels, float_labels, mapped_labels
from hftoolkit.sources.locations import expand, is_path_like
from hftoolkit.sources.pairs import MARGIN, margins

FILE_BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet",
                 ".txt": "text", ".gz": "text"}


def load_data(recipe: Recipe, dropped: dict[str, int] | None = None):
    """(train and eval splits with canonical columns, checked, labels encoded; the label names, or None).

    The canonical columns:
      text       the input text (a list of words for tagging; the source for seq2seq)
      text_pair  the second text of a sentence pair (classification, regression; with data.text_pair_column)
      label      a class id (classification, image-classification), a list of tag ids (tagging) or a float
                 (regression)
      target     the output text (translation, summarization)
      messages   a conversation, a list of {role, content} turns (instruction, where data.messages_column is in
                 the data)
      image      a PIL image (image-classification)
      chosen, rejected   the preferred and the rejected answer of a pair, whose prompt is text (preference, reward;
                 as turns after the shared ones where the pair is two conversations)
      margin     how much the chosen answer's score should beat the rejected one's by (reward, where the data has a
                 `margin` column)

    `dropped`, when given, receives the number of rows dropped for an empty input or target, per
    source ("train": data.train, before an eval split is held out of it; "eval": data.eval or data.eval_split),
    and under "label_map" the rows data.label_map mapped to null, per split.
    """
    import datasets

    datasets.disable_progress_bars()
    d = recipe.data
    counts = {"train": 0, "eval": 0}
    train, evaluation = _read_splits(recipe, counts)
    identical = {}
    if recipe.task in tasks.paired():  # (before an eval split is held out, as the empty rows)
        train, evaluation, identical = _without_identical_pairs(recipe, train, evaluation)
    unlabelled = {}
    if d.label_map is not None:  # per source, before an eval split is held out, as the empty rows
        train, unlabelled["train"] = mapped_labels(recipe, as_names(train), "data.train", d.train)
        unlabelled["eval"] = 0
        if evaluation is not None:
            evaluation, unlabelled["eval"] = mapped_labels(recipe, as_names(evaluation), "data.eval", d.eval or d.train)
    train, evaluation = _with_eval_split(recipe, train, evaluation)
    names = None
    if tasks.spec(recipe.task).labels in ("class", "tags"):
        train, evaluation, names = encode_labels(recipe, train, evaluation)
    elif tasks.spec(recipe.task).labels == "value":
        train, evaluation = float_labels(recipe, train, "data.train"), float_labels(recipe, evaluation, "data.eval")
    limit = {"train": d.max_train_samples, "eval": d.max_eval_samples}
    out = {}
    for split, ds in (("train", train), ("eval", evaluation)):
        if limit[split] and len(ds) > limit[split]:
            ds = ds.shuffle(seed=recipe.training.seed).select(range(limit[split]))
        # (after the eval split is held out: a pair's two answers stay on one side)
        out[split] = unpaired(ds) if _unpaired(recipe) and "chosen" in ds.column_names else ds
    if dropped is not None:
        dropped.update(counts)
        if unlabelled:
            dropped["label_map"] = unlabelled
        if identical:
            dropped["identical_pairs"] = identical
    return datasets.DatasetDict(out), names


def _with_eval_split(recipe: Recipe, train, evaluation):
    """(train, eval): data.eval_fraction of data.train held out where no eval source was read; neither empty."""
    d = recipe.data
    if evaluation is None:
        _check_not_empty(train, "data.train", d.train)
        if len(train) < 2:
            raise UserError(f"data.train: {d.train} has a single row, too few to hold out an eval split; add data")
        parts = train.train_test_split(test_size=d.eval_fraction, seed=recipe.training.seed)
        train, evaluation = parts["train"], parts["test"]
    for ds, key, source in ((train, "data.train", d.train), (evaluation, "data.eval", d.eval or d.train)):
        _check_not_empty(ds, key, source)
    return train, evaluation


def _without_identical_pairs(recipe: Recipe, train, evaluation):
    """(train, eval, rows dropped from each source) without the pairs whose answers are the same."""
    from hftoolkit.sources.pairs import identical_rows

    counts, kept = {}, []
    for split, ds, key, source in (("train", train, "data.train", recipe.data.train),
                                   ("eval", evaluation, "data.eval", recipe.data.eval or recipe.data.train)):
        same = identical_rows(ds) if ds is not None and "chosen" in ds.column_names else []  # (kto: answers)
        if ds is not None and same and len(same) == len(ds):
            raise UserError(f"{key}: in every row of {source} the chosen and rejected answers are the same, so there "
                            "is no preference to learn: give each prompt a better and a worse answer")
        counts[split] = len(same)
        kept.append(ds.select(sorted(set(range(len(ds))) - set(same))) if same else ds)
    return kept[0], kept[1], counts


def _read_splits(recipe: Recipe, counts: dict[str, int]):
    """(data.train, the eval source read, or None when it is held out of data.train), empty rows dropped and
    counted; both sources' problems reported together."""
    d, problems = recipe.data, []
    train = evaluation = None
    try:
        train, counts["train"] = drop_empty(read_source(d.train, "data.train", recipe, target=d.train_target),
                                            "data.train", d.train)
    except UserError as err:  # the eval split's problems are reported with the train split's
        problems += getattr(err, "problems", None) or [err.message]
    try:
        if d.eval:
            evaluation, counts["eval"] = drop_empty(
                read_source(d.eval, "data.eval", recipe, split=d.eval_split or "validation", target=d.eval_target),
                "data.eval", d.eval)
        elif d.eval_split:
            evaluation, counts["eval"] = drop_empty(read_source(d.train, "data.eval_split", recipe, split=d.eval_split),
                                                    "data.eval_split", f"{d.train} (split {d.eval_split})")
    except UserError as err:
        problems += getattr(err, "problems", None) or [err.message]
    if problems:
        raise RecipeError(list(dict.fromkeys(problems)))
    return train, evaluation


def drop_empty(ds, key: str, source: str):
    """(the rows whose texts and target are filled in, how many were dropped); refuses when none is left.

    Empty means missing (an empty CSV cell), blank text, or an empty word list (tagging). Such rows are dropped
    as they are read: a model trained on an empty text learns nothing from it, and an empty target teaches it to
    stop.
    """
    columns = [c for c in ("text", "text_pair", "target", "messages", "chosen", "rejected") if c in ds.column_names]
    if not columns or len(ds) == 0:
        return ds, 0
    empty = {c: [i for i, value in enumerate(ds[c]) if not is_filled(value, answer=c != "text")] for c in columns}
    gone = sorted(set().union(*empty.values()))
    if not gone:
        return ds, 0
    if len(gone) == len(ds):
        what = " or ".join(c for c in columns if empty[c])
        raise UserError(f"{key}: every row of {source} has an empty {what}, so nothing is left to use: "
                        f"fill in the {what} column, or point {key} at other data")
    drop = set(gone)
    return ds.select([i for i in range(len(ds)) if i not in drop]), len(gone)


def is_filled(value, answer: bool = True) -> bool:
    """Whether a cell holds something to learn from; a conversation needs an answer, unless it is a prompt."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        from hftoolkit.sources.conversations import answered

        return answered(value) if answer else True
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, tuple)):
        return len(value) > 0
    return value is not None


def fingerprint(data) -> str:
    """A short hash of the data's content, for the manifest."""
    h = hashlib.sha256()
    for split in sorted(data):
        h.update(split.encode())
        h.update(str(getattr(data[split], "_fingerprint", None)).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- sources


def read_source(source: str, key: str, recipe: Recipe, split: str | None = None, target: str | None = None):
    import datasets

    if key == "data.eval_split" and not is_hub_source(source):
        raise UserError(f"data.eval_split: {split!r} names a split of a hub data set, but data.train ({source}) is "
                        "not one: point data.eval at the examples to score, or set data.eval_split to null to hold "
                        "out data.eval_fraction of data.train")
    if source.startswith("builtin:"):
        from hftoolkit.sources.builtin import BUILTIN

        name = source.removeprefix("builtin:")
        if name not in BUILTIN:
            raise UserError(f"{key}: unknown built-in set {source!r}; choose one of "
                            + ", ".join(f"builtin:{n}" for n in BUILTIN))
        ds = datasets.Dataset.from_list(BUILTIN[name](seed=recipe.training.seed))
        return map_columns(ds, recipe, key, source, canonical=True)
    path = expand(source, key)
    if path.is_dir():
        ds = _load_builder("imagefolder", {"data_dir": str(path)}, key, source)
        if "label" not in ds.column_names and "label" in tasks.spec(recipe.task).columns:
            ds = _single_class(ds, path, key, source)
        return map_columns(ds, recipe, key, source, canonical=True)
    if path.is_file() or path.suffix.lower() in FILE_BUILDERS or is_path_like(source):
        if not path.is_file():
            raise UserError(f"{key}: data file {source} not found (looked for {path.absolute()}; a relative path "
                            "is read from the current folder): check the path")
        if target is not None:
            return _aligned(path, expand(target, key.replace("data.train", "data.train_target")
                                                  .replace("data.eval", "data.eval_target")), key)
        builder = FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise UserError(f"{key}: {source} has an unsupported extension; use one of {', '.join(FILE_BUILDERS)}")
        if builder == "text":
            ds = datasets.Dataset.from_dict({"text": _lines(path, key)})
        else:
            kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
            ds = _load_builder(builder, {"data_files": str(path), **kwargs}, key, source)
        return map_columns(ds, recipe, key, source)
    return _read_hub(source, key, recipe, split or recipe.data.train_split)


def is_hub_source(source: str) -> bool:
    """Whether `source` is read as a hub data set id: what is neither builtin:, nor a folder, nor a file (by its
    existence, extension or leading . / ~), exactly as `_read` dispatches."""
    if source.startswith("builtin:") or is_path_like(source):
        return False
    path = Path(source)
    return not (path.is_dir() or path.is_file() or path.suffix.lower() in FILE_BUILDERS)


def _read_hub(source: str, key: str, recipe: Recipe, split: str):
    """One split of a hub data set, at data.config and data.revision (both apply to every hub set of the recipe).
    It loads as `datasets.load_dataset` does: online, from the cache with HF_HUB_OFFLINE=1, or through an
    HF_ENDPOINT mirror, as the library decides; hub.py turns its refusals into one line."""
    import datasets

    from hftoolkit.sources import hub

    d = recipe.data
    with hub.explained(key, source, "dataset", config=d.config, revision=d.revision), hub.download_progress(source):
        ds = datasets.load_dataset(source, d.config, split=split, revision=d.revision)
    ds = map_columns(ds, recipe, key, source)
    _check_labelled(ds, key, source, split)
    return ds


def _check_labelled(ds, key: str, source: str, split: str) -> None:
    """Benchmark test splits hide their labels (GLUE's test splits hold -1 in every row, ClassLabel's "no label"):
    scoring them would compare predictions with a placeholder."""
    from datasets import ClassLabel, Value

    feature = ds.features.get("label")
    hidden = (isinstance(feature, ClassLabel) and -1 in ds.unique("label")) or (
        isinstance(feature, Value) and feature.dtype.startswith("float") and set(ds.unique("label")) == {-1.0})
    if hidden:
        raise UserError(f"{key}: split {split!r} of {source} has no labels (-1 marks a hidden label, as in GLUE's test "
                        "splits): score a split with labels, such as validation")


def use_split(recipe: Recipe, split: str, key: str = "--split") -> Recipe:
    """The recipe with its eval pointed at `split` of its hub data set: data.eval's when that is a hub id, else
    data.train's."""
    from hftoolkit.config.recipe import replaced

    d = recipe.data
    if d.eval and is_hub_source(d.eval):
        return replaced(recipe, {"data.eval_split": split})
    elif is_hub_source(d.train):
        return replaced(recipe, {"data.eval": None, "data.eval_target": None, "data.eval_split": split})
    else:
        sources = " and ".join(f"{k} ({v})" for k, v in (("data.train", d.train), ("data.eval", d.eval)) if v)
        raise UserError(f"{key}: {split!r} names a split of a hub data set, but {sources} "
                        f"{'are' if d.eval else 'is'} not one: score another file by pointing data.eval at it")


def unlabelled_split(recipe: Recipe, split: str, key: str = "--split") -> tuple[list, list]:
    """(the inputs of `split` of the run's hub data set, their indexes): data.eval's set when that is a hub id,
    else data.train's, read whether its labels are there or hidden (GLUE's test splits), for predictions. Each
    input is a text, or a (text, text_pair) pair; the index is the set's own `idx` column where it has one."""
    import datasets

    from hftoolkit.sources import hub

    d = recipe.data
    on_eval = bool(d.eval and is_hub_source(d.eval))
    source = d.eval if on_eval else d.train
    if not is_hub_source(source):
        raise UserError(f"{key}: {split!r} names a split of a hub data set, but the run's data.train ({d.train}) is "
                        "not one: predict on a file of inputs with --input FILE")
    with hub.explained(key, source, "dataset", config=d.config, revision=d.revision):
        ds = datasets.load_dataset(source, d.config, split=split, revision=d.revision)
    text = (d.eval_text_column if on_eval else None) or d.text_column
    wanted = {"data.text_column": text, **({"data.text_pair_column": d.text_pair_column} if d.text_pair_column
                                           else {})}
    missing = {k: v for k, v in wanted.items() if v not in ds.column_names}
    if missing:
        raise UserError(f"{key}: split {split!r} of {source} has no column {' or '.join(map(repr, missing.values()))} "
                        f"({' and '.join(missing)} of the run); columns found: {', '.join(ds.column_names)}")
    texts = ds[text]
    inputs = list(zip(texts, ds[d.text_pair_column])) if d.text_pair_column else list(texts)
    if recipe.task == tasks.TAGGING:
        inputs = [x if isinstance(x, list) else str(x).split() for x in inputs]
    index = list(ds["idx"]) if "idx" in ds.column_names else list(range(len(ds)))
    return inputs, index


def _load_builder(builder: str, kwargs: dict, key: str, source: str):
    import datasets

    split = kwargs.pop("split", "train")
    try:
        return datasets.load_dataset(builder, split=split, **kwargs)
    except UnicodeDecodeError:
        raise UserError(f"{key}: {source} is not UTF-8 text: convert it to UTF-8") from None
    except Exception as err:  # datasets wraps parser errors in several types
        cause = err.__cause__ or err
        if isinstance(cause, UnicodeDecodeError):  # the csv reader's, wrapped by datasets
            raise UserError(f"{key}: {source} is not UTF-8 text: convert it to UTF-8") from None
        if "corresponds to no data" in str(cause):  # a header and no rows
            raise UserError(f"{key}: {source} has no rows: point it at a data set with examples") from None
        raise UserError(f"{key}: could not read {source} ({type(cause).__name__}: "
                        f"{str(cause).splitlines()[0][:200]}): check its format") from None


def _single_class(ds, path: Path, key: str, source: str):
    """An image folder without a label column: the imagefolder builder labels images by their subfolder only
    when there are two or more. An eval folder may hold one class (named by its subfolder); a train folder may not."""
    classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) == 1 and key != "data.train":
        return ds.add_column("label", [classes[0]] * len(ds))
    found = f"a single class subfolder ({classes[0]})" if len(classes) == 1 else "no class subfolders"
    raise UserError(f"{key}: image folder {source} has {found}, but image classification needs at least two "
                    "classes: put each class's images in a subfolder named after it")


def _lines(path: Path, key: str, keep_blank: bool = False) -> list[str]:
    """The file's lines; blank ones are skipped, or kept (aligned files: line i must stay line i) but for
    blank lines at the very end."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\r\n") for line in f if keep_blank or line.strip()]
            while keep_blank and lines and not lines[-1].strip():
                lines.pop()
            return lines
    except UnicodeDecodeError:
        raise UserError(f"{key}: {path} is not UTF-8 text: convert it to UTF-8") from None
    except (OSError, EOFError) as err:
        raise UserError(f"{key}: could not read {path} ({err}): check the file") from None


def _aligned(source: Path, target: Path, key: str):
    """Two files aligned line by line (translation): line i of target translates line i of source."""
    import datasets

    if not target.is_file():
        raise UserError(f"{key.replace('train', 'train_target').replace('eval', 'eval_target')}: "
                        f"target file {target} not found: check the path")
    src, tgt = _lines(source, key, keep_blank=True), _lines(target, key, keep_blank=True)
    if len(src) != len(tgt):
        raise UserError(f"{key}: aligned files differ in length ({source}: {len(src)} lines, {target}: {len(tgt)}): "
                        "they must match line for line")
    return datasets.Dataset.from_dict({"text": src, "target": tgt})


def map_columns(ds, recipe: Recipe, key: str, source: str, canonical: bool = False):
    """Rename the recipe's columns to canonical names and drop the rest; a dotted name reads a nested field.
    An instruction set with data.messages_column is a conversation set: that column is all it reads."""
    if recipe.task == tasks.INSTRUCTION and recipe.data.messages_column in ds.column_names:
        return _conversations(ds, recipe.data.messages_column, key, source)
    if recipe.task in tasks.paired() and _holds_conversations(ds, recipe.data.chosen_column):
        return _conversation_pairs(ds, recipe, key, source)
    mapping, missing = {}, {}
    labelled = labelled_answers(recipe, ds)
    for name in ("text", "target", "label") if labelled else _columns(recipe):
        field = tasks.COLUMN_KEYS[name]
        if name == "text" and key == "data.eval" and recipe.data.eval_text_column:
            field = "eval_text_column"
        column = name if canonical and name in ds.column_names else getattr(recipe.data, field)
        if column not in ds.column_names and "." in column and column.split(".")[0] in ds.column_names:
            ds = ds.flatten()  # translation: {de, en} -> columns translation.de, translation.en
        if column not in ds.column_names:
            missing[f"data.{field}"] = column
        mapping[column] = name
    if missing:  # every column the split lacks, in one line
        many = len(missing) > 1
        also = (f", or data.messages_column for a conversation set (no {recipe.data.messages_column!r} column "
                "either)") if recipe.task == tasks.INSTRUCTION else ""
        raise UserError(f"{', '.join(missing)}: column{'s' * many} {', '.join(map(repr, missing.values()))} not "
                        f"found in {source}; columns found: {', '.join(ds.column_names)}; set "
                        f"{' and '.join(missing)} to {'the names' if many else 'the name'} in the data{also}")
    if _reads_margin(recipe, ds):
        ds = ds.remove_columns([MARGIN]).add_column(MARGIN, margins(ds, key, source))
        mapping[MARGIN] = MARGIN
    if recipe.task == tasks.GRPO:  # (the data's other columns reach the reward functions)
        from hftoolkit.sources.rewards import reward_columns

        mapping.update({c: c for c in reward_columns(ds.column_names, taken={*mapping, *mapping.values()})})
    ds = ds.select_columns(list(mapping))
    ds = ds.rename_columns({k: v for k, v in mapping.items() if k != v})
    return good_or_bad(ds, key, source) if labelled else ds


def _reads_margin(recipe: Recipe, ds) -> bool:
    """Whether the pairs carry a margin for task reward's loss: a `margin` column (sources/pairs.py)."""
    return recipe.task == tasks.REWARD and MARGIN in ds.column_names


def labelled_answers(recipe: Recipe, ds) -> bool:
    """Whether `ds` holds kto's unpaired layout: a prompt, an answer (data.target_column) and its label, good or bad
    (data.label_column); kto reads pairs too, where the data has data.chosen_column."""
    return _unpaired(recipe) and recipe.data.chosen_column not in ds.column_names


def _unpaired(recipe: Recipe) -> bool:
    return recipe.task == tasks.PREFERENCE and recipe.preference.unpaired


def good_or_bad(ds, key: str, source: str):
    """`ds` with each label a bool (True: a good answer); labels are true or false, or 1 or 0."""
    bad = next(((row, value) for row, value in enumerate(ds["label"]) if value not in (True, False)), None)
    if bad is not None:
        raise UserError(f"{key}: row {bad[0]} of {source} labels its answer {bad[1]!r}; kto reads true (a good "
                        "answer) or false (a bad one), or 1 or 0: fix the label, or point data.label_column at them")
    import datasets

    return ds.cast_column("label", datasets.Value("bool"))


def unpaired(ds):
    """Pairs (text, chosen, rejected) as kto's labelled answers (text, target, label): each pair's chosen answer
    good and its rejected one bad, in that order."""
    import datasets

    rows = {"text": [], "target": [], "label": []}
    for prompt, good, poor in zip(ds["text"], ds["chosen"], ds["rejected"], strict=True):
        rows["text"] += [prompt, prompt]
        rows["target"] += [good, poor]
        rows["label"] += [True, False]
    return datasets.Dataset.from_dict(rows)


def _conversations(ds, column: str, key: str, source: str):
    """The messages column alone, as "messages", every row checked to be a list of {role, content} turns."""
    from hftoolkit.sources.conversations import problem

    ds = ds.select_columns([column])
    if column != "messages":
        ds = ds.rename_column(column, "messages")
    bad = [line for row, turns in enumerate(ds["messages"])
           if (line := problem(turns, row, source, "data.messages_column")) is not None]
    if bad:
        more = f" (and {len(bad) - 1} more rows like it)" if len(bad) > 1 else ""
        raise UserError(bad[0] + more)
    return ds


def _holds_conversations(ds, column: str) -> bool:
    from hftoolkit.sources.pairs import is_conversation

    return column in ds.column_names and len(ds) > 0 and is_conversation(ds[0][column])


def _conversation_pairs(ds, recipe: Recipe, key: str, source: str):
    from hftoolkit.sources.pairs import conversation_pairs

    d = recipe.data
    if d.rejected_column not in ds.column_names:
        raise UserError(f"data.rejected_column: column {d.rejected_column!r} not found in {source}; columns found: "
                        f"{', '.join(ds.column_names)}; set data.rejected_column to the name in the data")
    prompts = ds[d.text_column] if d.text_column in ds.column_names else None
    return conversation_pairs(ds, d.chosen_column, d.rejected_column, key, source, prompts,
                              margins(ds, key, source) if _reads_margin(recipe, ds) else None)


def _columns(recipe: Recipe) -> list[str]:
    """The canonical columns the recipe reads: the task's, plus text_pair when data.text_pair_column is set."""
    task = tasks.spec(recipe.task)
    if not recipe.data.text_pair_column:
        return list(task.columns)
    if not task.text_pairs:
        pairs = ", ".join(t.name for t in tasks.TASKS if t.text_pairs)
        raise UserError(f"data.text_pair_column: task {recipe.task!r} reads one text per example: remove "
                        f"data.text_pair_column (sentence pairs are for {pairs})")
    return [*task.columns, "text_pair"]


def _check_not_empty(ds, key: str, source: str) -> None:
    if len(ds) == 0:
        raise UserError(f"{key}: {source} has no rows: point it at a data set with examples")
