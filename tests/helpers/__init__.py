"""The one place test helpers live: the repository's paths and the in-process CLI runner here; what helps with one
kind of test in a module named for it (launches, kills, resume, packing, inputs, serving, processes, hub_cache,
browser). Test modules import from here, never from one another; pytest's fixtures stay in tests/conftest.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
RECIPES = ROOT / "recipes"
SHARED_DATA = ROOT.parent / "shared" / "data"


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skip where one of `modules` is not installed, found without importing it: `pytest.importorskip` at a module's
    top imports at collection, in every worker, even when its tests are deselected (bitsandbytes compiles kernels for
    seconds, openai and onnxscript take seconds too)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed: pip install -e '.[test]'")


def run_cli(*args: str, expect: int | None = 0, input: str | None = None):
    """Invoke the CLI in-process (no 10 s import per call), `input` as its standard input; asserts the exit code
    when `expect` is set."""
    from typer.testing import CliRunner

    from hftoolkit.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    if expect is not None and result.exit_code != expect:
        raise AssertionError(f"exit {result.exit_code} (expected {expect}) for {args}:\n{result.output}"
                             + (f"\n{result.exception!r}" if result.exception else ""))
    return result


def no_model_loads(monkeypatch) -> None:
    """Make any model load fail the test (every transformers model, peft's adapters on it included, loads through
    PreTrainedModel.from_pretrained): a command that loads weights before refusing its input is caught."""
    from transformers import PreTrainedModel

    def loaded(cls, *args, **kwargs):
        raise AssertionError(f"a model was loaded ({cls.__name__} from {args[:1]}) before the input was refused")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(loaded))


def plain(text: str) -> str:
    """Output without rich's box drawing and line wrapping, for matching sentences."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text)).strip()


def train_recipe(recipe: str | Path, out: Path, *sets: str, expect: int | None = 0):
    """Train a recipe into `out` with --set overrides; returns the CliRunner result."""
    args = ["train", str(recipe), "--output", str(out)]
    for s in sets:
        args += ["--set", s]
    return run_cli(*args, expect=expect)


def terminal_width(monkeypatch, columns: int) -> None:
    """Play a terminal `columns` wide for rich's consoles: COLUMNS, with LINES, which rich then takes as given
    instead of asking the terminal."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", "50")
