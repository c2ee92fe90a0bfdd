"""Property: whatever YAML document (or text) a recipe file holds, the loader answers with a
RecipeError or a valid Recipe: never another exception, so never a traceback for the user."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hftoolkit.config.recipe import Recipe, RecipeError, load_recipe
from tests.helpers import RECIPES

SHIPPED = yaml.safe_load((RECIPES / "encoder-classification.yaml").read_text())
# Keys the schema knows, so that random documents get past "unknown key" and into the validators.
KEYS = sorted({"name", "task", "description", "model", "lora", "data", "training", "eval", "output", "checkpoint",
               "family", "quantization", "dtype", "revision", "trust_remote_code", "enabled", "r", "alpha", "dropout",
               "targets", "train", "eval_fraction", "label_names", "max_length", "epochs", "max_steps", "batch_size",
               "learning_rate", "precision", "save_steps", "keep_last", "on_nonfinite", "generation", "top_p", "dir",
               "metrics", "report_to"})
FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=20) | st.sampled_from(["init:bert", "init:t5", "builtin:sentiment", "~nobody-here/x",
                                                    "classification", "translation", "clm", "encoder", "fp16", "a\0b"]))
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=6),
                         max_leaves=25)


@pytest.fixture(scope="session")
def recipe_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "recipe.yaml"


def load(path, text: str | bytes) -> Recipe | None:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        return load_recipe(path)
    except RecipeError as err:  # each problem one line, starting with the file it is about
        assert err.problems and all(p.startswith(f"{path}: ") and "\n" not in p for p in err.problems), err.problems
        return None


@pytest.mark.slow
@FUZZ
@given(documents)
def test_any_yaml_document_gives_a_recipe_error_or_a_recipe(recipe_file, document):
    result = load(recipe_file, yaml.safe_dump(document, allow_unicode=True))
    assert result is None or isinstance(result, Recipe)


@pytest.mark.slow
@FUZZ
@given(st.data())
def test_a_shipped_recipe_with_one_value_replaced_gives_a_recipe_error_or_a_recipe(recipe_file, data):
    raw = yaml.safe_load(yaml.safe_dump(SHIPPED))
    node = raw
    while isinstance(node, dict) and node:
        key = data.draw(st.sampled_from(sorted(node)))
        if not isinstance(node[key], dict) or data.draw(st.booleans()):
            node[key] = data.draw(documents)
            break
        node = node[key]
    recipe = load(recipe_file, yaml.safe_dump(raw, allow_unicode=True))
    if recipe is not None:
        assert recipe.training.batch_size > 0 and recipe.training.learning_rate > 0
        assert math.isfinite(recipe.training.learning_rate) or recipe.training.learning_rate == math.inf


@pytest.mark.slow
@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200))
@example(b"\xff\xfe\x00")
@example("[" * 5000)
@example("a: &a [*a]\n")
@example("a: &a [1, 2]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: [*c, *c, *c, *c]\n")
@example("name: !!python/object/apply:os.system ['true']\n")
@example("%YAML 1.1\n--- a\n--- b\n")
def test_any_text_gives_a_recipe_error(recipe_file, text):
    assert load(recipe_file, text) is None
