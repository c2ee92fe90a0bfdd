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

    project = read_configuration(PACKAGE.parent / "pyproject.toml", expand=False)["project"]
    optional = project["optional-dependencies"]
    assert set(extras.EXTRAS) == set(optional) - {"test", "all"} == set(extras.FEATURES)
    providers = packages_distributions()
    for extra, modules in extras.EXTRAS.items():
        required = {canonicalize_name(Requirement(r).name) for r in optional[extra]}
        installing = {canonicalize_name(d) for module in modules for d in providers.get(module, [])}
        assert installing == required, extra
    # `all` is every feature's extra, and the tests install it; no optional library is a core dependency.
    [everything] = [Requirement(r) for r in optional["all"]]
    assert (everything.name, everything.extras) == ("hftoolkit", set(extras.EXTRAS))
    assert "all" in {e for r in optional["test"] if Requirement(r).name == "hftoolkit" for e in Requirement(r).extras}
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    optional_libraries = {canonicalize_name(Requirement(r).name) for extra in extras.EXTRAS for r in optional[extra]}
    assert core & optional_libraries == set()
    assert {"trl", "gguf", "bitsandbytes"} <= optional_libraries


def test_the_bitsandbytes_optimizers_are_those_training_maps_to_bitsandbytes():
    from hftoolkit.job.hardware import BITSANDBYTES_OPTIMIZERS
    from hftoolkit.training.arguments import OPTIMIZERS

    assert set(BITSANDBYTES_OPTIMIZERS) == {ours for ours, theirs in OPTIMIZERS.items() if "8bit" in theirs}


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


# ---------------------------------------------------------------- preference (TRL), gguf, quantization (bitsandbytes)


@pytest.mark.parametrize(("sets", "module", "line"), [
    ([], "trl", "task: preference needs TRL, which is not installed: pip install 'hftoolkit[preference]'"),
    (["model.quantization=8bit"], "bitsandbytes",
     "model.quantization: 8bit needs bitsandbytes, which is not installed: pip install 'hftoolkit[quantization]'"),
])
def test_train_without_the_extra_is_refused_in_one_line_and_writes_nothing(monkeypatch, tmp_path, sets, module, line):
    recipe = RECIPES / ("decoder-preference.yaml" if module == "trl" else "encoder-classification.yaml")
    hidden(monkeypatch, module)
    run = tmp_path / "run"
    result = run_cli("train", recipe, "--output", run, *(a for s in sets for a in ("--set", s)), expect=2)
    assert result.output.strip().splitlines() == [f"Error: {line}"]
    assert not run.exists()


@pytest.mark.parametrize(("recipe", "sets", "module", "line"), [
    ("decoder-grpo.yaml", [], "trl", "task: grpo needs TRL"),
    ("encoder-classification.yaml", ["model.quantization=4bit"], "bitsandbytes", "model.quantization: 4bit needs"),
    ("encoder-classification.yaml", ["training.optimizer=paged_adamw_8bit"], "bitsandbytes",
     "training.optimizer: paged_adamw_8bit needs bitsandbytes"),
    ("encoder-classification.yaml", ["training.report_to=[tensorboard]"], "tensorboard", "training.report_to"),
])
def test_each_feature_of_a_recipe_names_the_extra_that_installs_its_library(monkeypatch, recipe, sets, module, line):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.hardware import library_problems

    loaded = load_recipe(RECIPES / recipe, sets)
    assert library_problems(loaded) == []
    hidden(monkeypatch, module)
    [said] = library_problems(loaded)
    assert said.startswith(line) and said.endswith(f"pip install 'hftoolkit[{_extra_of(module)}]'")


def test_task_reward_and_an_eval_pass_need_only_what_they_use(monkeypatch):
    """A reward model trains with hftoolkit's own loss (no TRL); an eval pass creates no optimizer."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.hardware import library_problems

    hidden(monkeypatch, "trl", "bitsandbytes")
    assert library_problems(load_recipe(RECIPES / "encoder-reward.yaml")) == []
    eight_bit_optimizer = load_recipe(RECIPES / "encoder-classification.yaml", ["training.optimizer=adamw_8bit"])
    assert library_problems(eight_bit_optimizer, training=False) == []


def test_a_quantized_model_is_refused_where_it_would_load(monkeypatch):
    """predict and serve of a quantized run load it through models/loading.py: refused before from_pretrained."""
    from types import SimpleNamespace

    from hftoolkit.models.loading import quantization_config

    hidden(monkeypatch, "bitsandbytes")
    job = SimpleNamespace(recipe=SimpleNamespace(model=SimpleNamespace(quantization="4bit")))
    with pytest.raises(extras.UserError, match=r"^model.quantization: 4bit needs bitsandbytes, which is not "
                                               r"installed: pip install 'hftoolkit\[quantization\]'$"):
        quantization_config(job, [])


def test_eval_of_a_preference_run_without_trl_is_refused_before_its_model_loads(monkeypatch, tmp_path):
    run = _finished_run(tmp_path / "run", "decoder-preference.yaml")
    before = sorted(p.name for p in run.iterdir())
    hidden(monkeypatch, "trl")
    result = run_cli("eval", run, expect=2)
    assert result.output.strip().splitlines() == [
        "Error: task: preference needs TRL, which is not installed: pip install 'hftoolkit[preference]'"]
    assert sorted(p.name for p in run.iterdir()) == before


def test_export_to_gguf_without_gguf_is_refused_after_the_run_s_own_checks_and_writes_nothing(monkeypatch, tmp_path):
    """The run is checked first (a run GGUF can't hold is told so, not sent to install a library it would not use),
    then the library, before the lock is taken or any weight is read."""
    hidden(monkeypatch, "gguf")
    out = tmp_path / "export"
    result = run_cli("export", tmp_path / "no-run", "--format", "gguf", "--output", out, expect=2)
    assert "no such run folder" in result.output
    encoder = _finished_run(tmp_path / "encoder", "encoder-classification.yaml", family="encoder")
    result = run_cli("export", encoder, "--format", "gguf", "--output", out, expect=2)
    assert "GGUF holds a decoder language model" in result.output
    run = _finished_run(tmp_path / "run", "decoder-clm.yaml", family="decoder")
    before = sorted(p.name for p in run.iterdir())
    for fmt in ("gguf", "ollama"):
        result = run_cli("export", run, "--format", fmt, "--output", out, expect=2)
        assert result.output.strip().splitlines() == [
            f"Error: export --format {fmt} needs gguf, which is not installed: pip install 'hftoolkit[gguf]'"]
    assert not out.exists() and sorted(p.name for p in run.iterdir()) == before


def test_a_gguf_checkpoint_without_gguf_is_refused_before_it_is_read(monkeypatch, tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources import gguf
    from hftoolkit.sources.checkpoint import resolve_checkpoint

    line = "model.checkpoint: reading a GGUF file needs gguf, which is not installed: pip install 'hftoolkit[gguf]'"
    hidden(monkeypatch, "gguf")
    monkeypatch.setattr(gguf, "plain_checkpoint", lambda *a, **k: pytest.fail("the GGUF file was read"))
    named = tmp_path / "model.gguf"
    named.write_bytes(b"GGUF")
    folder = tmp_path / "package"  # a folder of one .gguf file, as a checkpoint package ships it
    folder.mkdir()
    (folder / "model.gguf").write_bytes(b"GGUF")
    hub = ["model.checkpoint=someone/model-GGUF", "model.gguf_file=model.Q8_0.gguf"]  # refused before a download
    for sets in ([f"model.checkpoint={named}"], [f"model.checkpoint={folder}"], hub):
        with pytest.raises(extras.UserError) as refused:
            resolve_checkpoint(load_recipe(RECIPES / "decoder-clm.yaml", sets))
        assert refused.value.format_message() == line
    run = tmp_path / "run"
    result = run_cli("train", RECIPES / "decoder-clm.yaml", "--set", f"model.checkpoint={named}", "--output", run,
                     expect=2)
    assert result.output.strip().splitlines() == [f"Error: {line}"]
    assert not run.exists()


def test_a_text_task_trains_with_none_of_the_three_installed(monkeypatch, tmp_path):
    """trl, gguf and bitsandbytes absent as where none of their extras is installed: not importable, found by no
    find_spec (transformers' and peft's cached probes asked again) and by no metadata lookup."""
    import importlib.metadata
    import json

    from peft import import_utils as peft_probes
    from transformers.utils import import_utils as transformers_probes

    absent = ("trl", "gguf", "bitsandbytes")
    hidden(monkeypatch, *absent)
    from_name = importlib.metadata.Distribution.from_name.__func__

    def no_distribution(cls, name):
        if name.lower() in absent:
            raise importlib.metadata.PackageNotFoundError(name)
        return from_name(cls, name)

    monkeypatch.setattr(importlib.metadata.Distribution, "from_name", classmethod(no_distribution))
    probes = (transformers_probes.is_bitsandbytes_available, transformers_probes.is_gguf_available,
              peft_probes.is_bnb_available, peft_probes.is_bnb_4bit_available)
    for probe in probes:  # (answers cached while the libraries were there)
        probe.cache_clear()
    try:
        run = tmp_path / "run"
        result = run_cli("train", RECIPES / "encoder-classification.yaml", "--output", run,
                         "--set", "training.max_steps=2", "--set", "eval.max_predictions=4")
    finally:
        for probe in probes:  # (asked again once the libraries are back)
            probe.cache_clear()
    assert "accuracy *" in result.output and f"run directory: {run}" in result.output
    assert json.loads((run / "manifest.json").read_text())["versions"]["bitsandbytes"] is None


def _extra_of(module: str) -> str:
    return next(extra for extra, modules in extras.EXTRAS.items() if module in modules)


def _finished_run(folder, recipe: str, family: str | None = None):
    """A run folder as eval and export open it (its recipe, a model/ folder, status complete): no weights, so a
    refusal that comes later than promised fails on them."""
    import json

    import yaml

    raw = yaml.safe_load((RECIPES / recipe).read_text())
    if family:
        raw["model"]["family"] = family
    (folder / "model").mkdir(parents=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(raw))
    (folder / "manifest.json").write_text(json.dumps({"status": "complete"}))
    return folder
