"""The wheel as users install it carries what the toolkit needs beside its code: every shipped recipe and launcher
config, the metric modules, the tiny tokenizers. Built from a copy of the source (the repository is left as it is),
installed without its dependencies into a folder of its own, and run from an empty folder, where nothing of the
repository can be found. .ci/wheel does the whole install in a fresh environment and trains the quickstart by name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from hftoolkit.config.shipped import SHIPPED, shipped_name, shipped_recipes
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "hftoolkit", source / "hftoolkit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)],
                   check=True, capture_output=True)
    [built] = out.glob("hftoolkit-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_shipped_recipe_and_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = {f"hftoolkit/recipes/{p.relative_to(SHIPPED).as_posix()}" for p in shipped_recipes()}
    assert len(recipes) > 30 and recipes <= names, sorted(recipes - names)
    for data in ("hftoolkit/metrics/accuracy/accuracy.py", "hftoolkit/data/tiny-tokenizers"):
        assert any(name.startswith(data) for name in names), data


@pytest.mark.slow
def test_the_installed_wheel_lists_its_recipes_in_an_empty_folder(wheel, tmp_path):
    target, empty = tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    # The wheel's package first on the path; the test environment's libraries after it (typer, yaml).
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONSAFEPATH": "1"}
    code = "import sys; sys.argv = ['hftoolkit', 'recipes']; from hftoolkit.cli.app import main; main()"
    shown = subprocess.run([sys.executable, "-c", code], cwd=empty, env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    listed = [line.split()[0] for line in shown.stdout.splitlines()]
    assert listed == [shipped_name(p) for p in shipped_recipes() if p.parent == SHIPPED]
    where = subprocess.run([sys.executable, "-c", "import hftoolkit; print(hftoolkit.__file__)"], cwd=empty, env=env,
                           capture_output=True, text=True).stdout
    assert where.startswith(str(target)), where
