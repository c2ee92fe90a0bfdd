"""The recipes ship inside the package: a RECIPE argument names one by its name, its file name or its path in a clone,
wherever the command runs; a file in the working folder wins; `hftoolkit recipes --copy` writes them out."""

from __future__ import annotations

from pathlib import Path

import pytest

from hftoolkit.config import shipped
from hftoolkit.config.recipe import RecipeError, load_recipe
from tests.helpers import RECIPES, ROOT, run_cli

QUICKSTART = shipped.SHIPPED / "encoder-classification.yaml"


def test_the_clone_s_recipes_folder_is_the_package_s():
    assert RECIPES.resolve() == shipped.SHIPPED and QUICKSTART.is_file()
    assert (shipped.SHIPPED / "accelerate" / "ddp.yaml").is_file()


@pytest.mark.parametrize("typed", ["encoder-classification", "encoder-classification.yaml",
                                   "recipes/encoder-classification.yaml", "recipes/encoder-classification"])
def test_a_shipped_recipe_is_found_by_name_in_an_empty_folder(typed):
    assert shipped.find_recipe(typed) == QUICKSTART
    assert load_recipe(typed).name == "encoder-classification"


def test_a_launcher_config_is_found_by_its_name_under_accelerate():
    assert shipped.find_recipe("accelerate/ddp") == shipped.SHIPPED / "accelerate" / "ddp.yaml"
    assert shipped.find_recipe("recipes/accelerate/fsdp.yaml") == shipped.SHIPPED / "accelerate" / "fsdp.yaml"


def test_a_file_in_the_working_folder_wins_over_the_shipped_one():
    Path("encoder-classification.yaml").write_text(QUICKSTART.read_text().replace("epochs: 4", "epochs: 1"))
    assert shipped.find_recipe("encoder-classification") == Path("encoder-classification.yaml")
    assert load_recipe("encoder-classification").training.epochs == 1
    Path("recipes").mkdir()
    Path("recipes/encoder-classification.yaml").write_text(QUICKSTART.read_text().replace("epochs: 4", "epochs: 2"))
    assert load_recipe("recipes/encoder-classification.yaml").training.epochs == 2
    assert shipped.origin("recipes/encoder-classification.yaml") == str(Path.cwd() / "recipes" /
                                                                        "encoder-classification.yaml")


def test_the_manifest_names_a_shipped_recipe_by_name_and_version():
    from hftoolkit import __version__

    assert shipped.origin(QUICKSTART) == f"encoder-classification (shipped with hftoolkit {__version__})"
    assert shipped.origin(RECIPES / "accelerate" / "ddp.yaml").startswith("accelerate/ddp (shipped")


def test_a_mistyped_name_is_refused_with_the_close_match():
    with pytest.raises(RecipeError) as raised:
        load_recipe("encoder-clasification")
    assert raised.value.problems == ["encoder-clasification: recipe file not found: did you mean "
                                     "'encoder-classification'? check the path, or name a shipped recipe "
                                     "(`hftoolkit recipes` lists them)"]
    assert shipped.find_recipe("/no/such/file.yaml") == Path("/no/such/file.yaml")  # (an absolute path is a path)


def test_recipes_lists_names_a_train_argument_takes():
    lines = run_cli("recipes").stdout.splitlines()
    names = [line.split()[0] for line in lines]
    assert "encoder-classification" in names and "accelerate/ddp" not in names
    assert all(shipped.find_recipe(name).is_relative_to(shipped.SHIPPED) for name in names)


def test_copy_writes_every_shipped_file_then_refuses_to_overwrite_in_one_line(tmp_path):
    out = tmp_path / "mine"
    written = run_cli("recipes", "--copy", out).stdout.splitlines()
    assert sorted(Path(line).relative_to(out) for line in written) == \
        sorted(p.relative_to(shipped.SHIPPED) for p in shipped.shipped_recipes())
    assert (out / "encoder-classification.yaml").read_bytes() == QUICKSTART.read_bytes()
    assert load_recipe(out / "encoder-classification.yaml").name == "encoder-classification"
    (out / "encoder-classification.yaml").write_text("edited")
    refused = run_cli("recipes", "--copy", out, "encoder-classification", expect=2)
    assert refused.stderr.strip().count("\n") == 0 and "pass --overwrite" in refused.stderr
    assert (out / "encoder-classification.yaml").read_text() == "edited"
    run_cli("recipes", "--copy", out, "encoder-classification", "--overwrite")
    assert (out / "encoder-classification.yaml").read_bytes() == QUICKSTART.read_bytes()


def test_copy_checks_every_name_before_writing(tmp_path):
    refused = run_cli("recipes", "--copy", tmp_path / "out", "decoder-clm", "decoder-clmm", "nothing-like-it",
                      expect=2)
    assert "decoder-clmm: no shipped recipe of that name: did you mean 'decoder-clm'?" in refused.stderr
    assert "nothing-like-it: no shipped recipe of that name" in refused.stderr
    assert not (tmp_path / "out").exists()


def test_the_package_data_names_the_recipes_where_they_are():
    from setuptools.config.pyprojecttoml import read_configuration

    patterns = read_configuration(ROOT / "pyproject.toml", expand=False)["tool"]["setuptools"]["package-data"]
    matched = {p for pattern in patterns["hftoolkit"] for p in (ROOT / "hftoolkit").glob(pattern)}
    assert set(shipped.shipped_recipes()) <= {p.resolve() for p in matched}
