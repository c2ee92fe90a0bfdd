"""An optional feature's library is one of pyproject's extras (base/extras.py's table, held to pyproject here), and
where it is missing the feature is refused in one line: what is missing, for what, and the pip command."""

from __future__ import annotations

import sys

import pytest

from hftoolkit.base import extras
from tests.helpers import RECIPES, ROOT, run_cli

PACKAGE = ROOT / "hftoolkit"


def hidden(monkeypatch, *modules: str) -> None:
    """Make `modules` not found (a None entry in sys.modules: an import fails, find_spec answers None)."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_the_table_is_pyproject_s_extras_and_their_libraries_install_its_modules():
    from importlib.metadata import packages_distributions

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from setuptools.config.pyprojecttoml import read_configuration  # (tomllib is 3.11 on)

    optional = read_configuration(PACKAGE.parent / "pyproject.toml", expand=False)["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) == set(optional) - {"test"}
    providers = packages_distributions()
    for extra, modules in extras.EXTRAS.items():
        required = {canonicalize_name(Requirement(r).name) for r in optional[extra]}
        installing = {canonicalize_name(d) for module in modules for d in providers.get(module, [])}
        assert installing == required, extra


def test_a_missing_library_is_said_in_one_line_with_its_extra(monkeypatch):
    assert extras.missing("serve", "serve") is None  # (the test environment has every extra)
    hidden(monkeypatch, "uvicorn")
    with pytest.raises(extras.UserError) as raised:
        extras.requires("serve", "serve")
    assert raised.value.format_message() == \
        "serve needs uvicorn, which is not installed: pip install 'hftoolkit[serve]'"
    hidden(monkeypatch, "fastapi")
    assert extras.missing("serve", "serve") == \
        "serve needs FastAPI and uvicorn, which are not installed: pip install 'hftoolkit[serve]'"


def test_serve_without_its_extra_stops_before_any_model_loads(monkeypatch, tmp_path):
    hidden(monkeypatch, "fastapi")
    result = run_cli("serve", tmp_path / "no-such-run", expect=2)
    assert "serve needs FastAPI, which is not installed: pip install 'hftoolkit[serve]'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_benchmark_without_the_harness_is_refused_with_its_extra(monkeypatch):
    import importlib.metadata

    from hftoolkit.evaluation.harness import harness_version

    def version(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(extras.UserError, match=r"^--benchmark needs lm-evaluation-harness, which is not installed: "
                                               r"pip install 'hftoolkit\[benchmarks\]'$"):
        harness_version()


def test_a_deepspeed_launch_without_deepspeed_is_a_problem_naming_its_extra(monkeypatch):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.training.strategies import strategy_for
    from hftoolkit.training.strategies.launch import plan_from_config

    strategy = strategy_for(plan_from_config(RECIPES / "accelerate" / "deepspeed-zero3.yaml", None))
    recipe = load_recipe(RECIPES / "encoder-classification.yaml")
    hidden(monkeypatch, "deepspeed")
    problems = strategy.problems(recipe, cuda=False)
    assert [p for p in problems if "DeepSpeed" in p] == [
        f"{strategy.launch.source} needs DeepSpeed, which is not installed: pip install 'hftoolkit[deepspeed]', or "
        "use ddp.yaml or fsdp.yaml"]


def test_tensorboard_asked_for_without_tensorboard_is_a_problem_naming_its_extra(monkeypatch):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.hardware import hardware_problems

    recipe = load_recipe(RECIPES / "encoder-classification.yaml", ["training.report_to=[tensorboard]"])
    assert hardware_problems(recipe) == []
    hidden(monkeypatch, "tensorboard")
    assert hardware_problems(recipe) == ["training.report_to: tensorboard needs TensorBoard, which is not installed: "
                                         "pip install 'hftoolkit[tensorboard]'"]


def test_the_install_hint_is_written_in_one_place():
    writers = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if "pip install 'hftoolkit[" in p.read_text(encoding="utf-8")]
    assert writers == ["base/extras.py"]
