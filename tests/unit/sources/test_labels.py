"""Labels as users write them: integer and string labels are classes by their values, data.label_names in the
data's own spelling (numbers included), data.label_map many to one with null dropping rows, and what preflight
says about a class no row holds. Data is read without a model (load_data) or with `validate --data`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import RECIPES, plain, run_cli

ENCODER = RECIPES / "encoder-classification.yaml"
STARS = [("a dreadful film", 1), ("rather poor", 2), ("it was fine", 3), ("a good watch", 4), ("a triumph", 5)]


def _reviews(path: Path, rows=STARS, repeat: int = 3) -> Path:
    """A user's CSV: the text under `review`, 1 to 5 stars under `stars`."""
    path.write_text("review,stars\n" + "".join(f"{text} {i},{stars}\n" for i in range(repeat) for text, stars in rows))
    return path


def _load(data: Path, *sets: str):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    recipe = load_recipe(ENCODER, [f"data.train={data}", f"data.eval={data}", "data.text_column=review",
                                   "data.label_column=stars", *sets])
    dropped = {}
    loaded, names = load_data(recipe, dropped)
    return loaded, names, dropped


def _stars_of(loaded, names) -> list[str]:
    """Each eval row's class name, through the ids the model trains on."""
    return [names[i] for i in loaded["eval"]["label"]]


def test_stars_one_to_five_are_five_classes_in_their_order(tmp_path):
    loaded, names, _ = _load(_reviews(tmp_path / "reviews.csv"))
    assert names == ["1", "2", "3", "4", "5"]  # not six classes from 0
    assert _stars_of(loaded, names)[:5] == ["1", "2", "3", "4", "5"]


def test_label_names_written_as_numbers_or_text_give_the_order(tmp_path):
    data = _reviews(tmp_path / "reviews.csv")
    for written in ("[5, 4, 3, 2, 1]", "['5', '4', '3', '2', '1']"):
        loaded, names, _ = _load(data, f"data.label_names={written}")
        assert names == ["5", "4", "3", "2", "1"]
        assert loaded["eval"]["label"][:5] == [4, 3, 2, 1, 0]  # the first listed is id 0


def test_integer_labels_beyond_names_that_fit_them_stay_positions(tmp_path):
    """0 and 1 named by label_names [negative, positive], as runs written before label values did."""
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"film {i},{i % 2}\n" for i in range(8)))
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    recipe = load_recipe(ENCODER, [f"data.train={data}", f"data.eval={data}",
                                   "data.label_names=[negative, positive]"])
    loaded, names = load_data(recipe)
    assert names == ["negative", "positive"] and loaded["eval"]["label"][:4] == [0, 1, 0, 1]


def test_a_label_outside_the_names_says_how_to_map_it(tmp_path):
    from hftoolkit.base.errors import UserError

    with pytest.raises(UserError) as err:
        _load(_reviews(tmp_path / "reviews.csv"), "data.label_names=[1, 2, 3, 4]")
    assert "label 5 is not one of data.label_names (1, 2, 3, 4)" in err.value.message
    assert "data.label_map" in err.value.message


def test_label_map_merges_classes_and_drops_null_rows_counted(tmp_path):
    loaded, names, dropped = _load(_reviews(tmp_path / "reviews.csv"),
                                   "data.label_map={1: negative, 2: negative, 3: null, 4: positive, 5: positive}")
    assert names == ["negative", "positive"]
    assert _stars_of(loaded, names)[:4] == ["negative", "negative", "positive", "positive"]
    assert len(loaded["eval"]) == 12  # the three 3-star rows are gone
    assert dropped["label_map"] == {"train": 3, "eval": 3}  # per file read


def test_label_map_names_a_value_it_leaves_out(tmp_path):
    from hftoolkit.base.errors import UserError

    with pytest.raises(UserError) as err:
        _load(_reviews(tmp_path / "reviews.csv"), "data.label_map={1: negative, 5: positive}")
    assert "has labels 2, 3, 4 that data.label_map does not mention" in err.value.message


@pytest.mark.parametrize("sets, expect", [
    (["data.label_map={1: null, 2: null}"], "data: label_map maps every value to null"),
    (["data.label_map={1: bad, 5: good}", "data.label_names=[bad]"], "data: label_names lacks 'good'"),
    (["task=regression", "data.label_map={1: bad}"], "task 'regression' has none: remove data.label_map"),
])
def test_label_map_that_cannot_work_is_refused_by_the_schema(sets, expect):
    from hftoolkit.config.recipe import RecipeError, load_recipe

    with pytest.raises(RecipeError) as err:
        load_recipe(ENCODER, sets)
    assert expect in str(err.value)


def test_validate_notes_the_dropped_rows_and_a_class_no_row_holds(tmp_path):
    data = _reviews(tmp_path / "reviews.csv")
    result = run_cli("validate", ENCODER, "--data", "--set", f"data.train={data}", "--set", "data.text_column=review",
                     "--set", "data.label_column=stars", "--set",
                     "data.label_map={1: negative, 2: negative, 3: null, 4: positive, 5: positive}",
                     "--set", "data.label_names=[negative, neutral, positive]")
    shown = plain(result.output)
    assert "note: data.train: dropped 3 rows whose label data.label_map maps to null" in shown
    assert ("note: data.label_names: 'neutral' occurs in no row, so the model gets an output for it that it never "
            "learns: remove it from data.label_names") in shown
