"""Labels as users write them: values become class ids (sorted, or in data.label_names' order), data.label_map
maps raw values to names (rows mapped to null dropped and counted), regression labels become floats."""

from __future__ import annotations

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.config.recipe import Recipe

# The label the loss and the metrics skip: padding, prompts, later subwords, a packed example's first token. It is
# PyTorch's cross_entropy default (ignore_index), which transformers' models and collators use too; hftoolkit's
# one copy (hftoolkit/reference/objectives.py keeps its own: that package imports nothing of the toolkit).
IGNORE_INDEX = -100


def encode_labels(recipe: Recipe, train, evaluation):
    """Map label values to ids 0..n-1 in the order of `data.label_names` (found in the data if unset: a hub set's
    or an image folder's own class names in their order, data.label_map's names in the order it first gives them,
    else the values seen, sorted: 1 to 5 stars are five classes)."""
    from datasets import ClassLabel

    d = recipe.data
    feature = train.features["label"]
    inner = getattr(feature, "feature", feature)  # a Sequence (tagging) holds its item feature
    names = d.label_names
    if isinstance(inner, ClassLabel):  # imagefolder and hub sets: ids -> their names first
        names = names or (None if d.label_map else list(inner.names))
        train, evaluation = as_names(train), as_names(evaluation)
    if d.label_map:  # (the rows were mapped as they were read)
        names = names or list(dict.fromkeys(v for v in d.label_map.values() if v is not None))
    values = _flat(train["label"]) + _flat(evaluation["label"])
    kinds = {type(v).__name__ for v in values}
    if len(kinds) > 1 or not kinds <= {"int", "str"}:
        raise UserError(f"data.label_column: labels in {d.train} are of types {', '.join(sorted(kinds))}: "
                        "make every label a name or every label an integer id")
    if recipe.task != tasks.TAGGING and len(set(_flat(train["label"]))) < 2:
        raise UserError(f"data.train: only one class ({values[0]!r}) in {d.train}: "
                        "classification needs examples of at least two labels")
    names, to_id = _class_ids(values, names)
    encode = lambda batch: {"label": [[to_id(v) for v in label] if isinstance(label, list) else to_id(label)
                                      for label in batch["label"]]}
    # The id column's type is given: map keeps a column's old type when it returns the same name, and ids
    # stored as strings ("1", from a CSV's large_string column) would reach the collator as text.
    return (*(ds.map(encode, batched=True, features=_id_features(ds)) for ds in (train, evaluation)), names)


def _class_ids(values: list, names: list[str] | None):
    """(the class names, value -> id). A value names its class by its text (the integer 5 is the class '5').
    Integers that are none of the given names but all fit them are read as positions, the older convention
    (0 and 1 with label_names [negative, positive]), so runs written before it still load."""
    if names is None:
        names = [str(v) for v in sorted(set(values))]  # integers in numeric order, texts in text order
    index = {n: i for i, n in enumerate(names)}
    if values and all(isinstance(v, int) and 0 <= v < len(names) for v in values) \
            and not any(str(v) in index for v in values):
        return names, lambda v: v
    unknown = sorted({v for v in values if str(v) not in index}, key=lambda v: (str(type(v)), v))
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (" ..." if len(unknown) > 5 else "")
        many = len(unknown) > 1
        raise UserError(f"data.label_column: label{'s' * many} {shown} {'are' if many else 'is'} not one of "
                        f"data.label_names ({', '.join(names)}): fix the data, add {'them' if many else 'it'} to "
                        "data.label_names, or map the values to names with data.label_map")
    return names, lambda v: index[str(v)]


def mapped_labels(recipe: Recipe, ds, key: str, source: str):
    """(the rows whose label data.label_map names, relabelled with the names; how many it mapped to null).
    A value the map does not mention is refused: a class silently lost would be worse than a question."""
    label_map = recipe.data.label_map
    labels = ds["label"]
    unmapped = sorted({str(v) for v in labels if str(v) not in label_map})
    if unmapped:
        shown = ", ".join(unmapped[:5]) + (" ..." if len(unmapped) > 5 else "")
        raise UserError(f"data.label_map: {source} has label{'s' * (len(unmapped) > 1)} {shown} that data.label_map "
                        "does not mention: map each to a class name, or to null to drop its rows")
    names = [label_map[str(v)] for v in labels]
    keep = [i for i, name in enumerate(names) if name is not None]
    if not keep:
        raise UserError(f"data.label_map: every row of {source} maps to null, so nothing is left to use: map some "
                        f"of its labels to class names, or point {key} at other data")
    ds = ds.select(keep).remove_columns("label")
    return ds.add_column("label", [names[i] for i in keep]), len(labels) - len(keep)


def _id_features(ds):
    from datasets import List, Value

    features = ds.features.copy()
    features["label"] = List(Value("int64")) if hasattr(features["label"], "feature") else Value("int64")
    return features


def float_labels(recipe: Recipe, ds, key: str):
    """Regression targets as float32 (MSE needs float labels; a CSV of whole scores reads as integers)."""
    from datasets import ClassLabel, Value

    source = recipe.data.eval if key == "data.eval" and recipe.data.eval else recipe.data.train
    if isinstance(ds.features["label"], ClassLabel):
        raise UserError(f"data.label_column: {source} labels each example with a class "
                        f"({', '.join(ds.features['label'].names[:5])}): use task classification, or a column of "
                        "numbers for regression")
    try:
        return ds.cast_column("label", Value("float32"))
    except (ValueError, TypeError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"data.label_column: regression needs one number per example, but {source} holds labels "
                        f"that are not numbers ({str(err).splitlines()[0][:120]}): point data.label_column at "
                        "a numeric column") from None


def as_names(ds):
    """Class ids -> the split's own class names; map is told the new feature, else it keeps ClassLabel (ids again)."""
    from datasets import ClassLabel, List, Value

    feature = ds.features["label"]
    inner = getattr(feature, "feature", feature)
    if not isinstance(inner, ClassLabel):
        return ds
    features = ds.features.copy()
    features["label"] = List(Value("string")) if inner is not feature else Value("string")
    return ds.map(lambda r: {"label": _names(r["label"], inner.names)}, features=features)


def _names(label, names):
    return [names[i] for i in label] if isinstance(label, list) else names[label]


def _flat(column) -> list:
    return [v for item in column for v in (item if isinstance(item, list) else [item])]
