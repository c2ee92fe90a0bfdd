"""Export formats as modules: every module of hftoolkit/exports that holds a `FORMAT` is registered in
`exports.FORMATS` and follows `ExportFormat`; `export --format` accepts exactly the registered formats; and a format
registered in a test alone goes through the export workflow's refusals, its check and its summary (no model loads:
the run's merged model is stood in for)."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hftoolkit.base import extras
from hftoolkit.base.run_layout import EXPORT, MANIFEST, RECIPE
from hftoolkit.config import tasks
from hftoolkit.config.families import FAMILIES
from hftoolkit.exports import FORMATS
from hftoolkit.exports.format import Check, ExportFormat, Written
from tests.helpers import RECIPES, ROOT, plain, run_cli

EXPORTS = ROOT / "hftoolkit" / "exports"


def format_modules() -> list:
    """The modules of hftoolkit/exports that hold a FORMAT, found by a glob (so one left out of FORMATS is seen)."""
    names = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in sorted(EXPORTS.rglob("*.py"))]
    modules = [importlib.import_module(name) for name in names if not name.endswith("__init__")]
    return [m for m in modules if hasattr(m, "FORMAT")]


def test_every_format_module_is_registered_and_follows_the_protocol():
    modules = format_modules()
    unregistered = [m.__name__ for m in modules if FORMATS.get(m.FORMAT.name) is not m.FORMAT]
    assert modules and not unregistered, f"modules whose FORMAT is not in exports.FORMATS: {unregistered}"
    assert sorted(m.FORMAT.name for m in modules) == sorted(FORMATS), "FORMATS registers the modules' formats only"
    for name, export_format in FORMATS.items():
        assert isinstance(export_format, ExportFormat) and export_format.name == name
        for method in ("takes", "write", "check"):  # the protocol's parameters, by name
            declared = list(inspect.signature(getattr(ExportFormat, method)).parameters)[1:]
            assert list(inspect.signature(getattr(export_format, method)).parameters) == declared, (name, method)
        assert all(isinstance(getattr(export_format, a), str) and getattr(export_format, a)
                   for a in ("title", "help", "runs", "holds")), name
        assert export_format.extra is None or export_format.extra in extras.EXTRAS, name
        if export_format.quantizations:
            assert export_format.default_quantization in export_format.quantizations, name
        else:
            assert export_format.default_quantization is None, name
        taken = [(family, task) for family in FAMILIES for task in tasks.names() if export_format.takes(family, task)]
        assert taken, f"--format {name} takes no run of any task and family"


def test_export_accepts_exactly_the_registered_formats(tmp_path):
    import typer

    from hftoolkit.cli.app import app

    command = typer.main.get_command(app).commands["export"]
    said = next(p.help for p in command.params if p.name == "format_")
    assert [item.split(":")[0] for item in said.rstrip(".").split("; ")] == list(FORMATS), said
    for name in FORMATS:  # past the format's own checks: refused for the missing run, not as a format
        said = plain(run_cli("export", tmp_path / "no-run", "-f", name, "-o", tmp_path / "out", expect=2).output)
        assert "no such run folder" in said and "is not one of" not in said, said
    said = plain(run_cli("export", tmp_path / "no-run", "-f", "tflite", "-o", tmp_path / "out", expect=2).output)
    assert f"--format: 'tflite' is not one of {', '.join(FORMATS)}:" in said, said


def test_the_export_page_lists_every_format():
    page = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    assert re.findall(r"^\| `([\w-]+)` \|", page, re.MULTILINE) == list(FORMATS)


# ---------------------------------------------------------------- a format of the test's own


class ToyFormat:
    """toy.txt: the eval inputs the check runs on, one a line (upper case at `-q loud`); checked by reading it
    back."""

    name = "toy"
    title = "Toy"
    help = "toy.txt, the eval inputs"
    runs = "encoder runs"
    holds = "toy holds encoder classifiers"
    extra = None
    quantizations = ("plain", "loud")
    default_quantization = "plain"

    def __init__(self, passes: bool = True):
        self.passes = passes

    def takes(self, family: str | None, task: str) -> bool:
        return family == "encoder" and task == tasks.CLASSIFICATION

    def write(self, export) -> Written:
        lines = [x.upper() if export.quantization == "loud" else x for x in export.inputs]
        export.write_text(export.folder / "toy.txt", "".join(f"{line}\n" for line in lines))
        return Written(["toy.txt"], {"toy": {"lines": len(lines)}})

    def check(self, export, written: Written) -> Check:
        back = (export.folder / written.files[0]).read_text().splitlines()
        line = f"checked toy.txt on {len(export.inputs)} eval inputs: lines {len(back)}/{len(export.inputs)}"
        return Check(line, self.passes and len(back) == len(export.inputs),
                     {"inputs": len(export.inputs), "lines": len(back)})


EVAL_ROWS = [{"text": "a wonderful film", "label": 1}, {"text": "dull", "label": 0}]


def finished_run(tmp_path: Path, recipe: str, family: str) -> Path:
    """A finished run's folder as train leaves it, without weights (the merged model is stood in for)."""
    run = tmp_path / f"{family}-run"
    (run / "adapter").mkdir(parents=True)
    parsed = yaml.safe_load((RECIPES / recipe).read_text())
    parsed["model"]["family"] = family
    (run / RECIPE).write_text(yaml.safe_dump(parsed))
    (run / MANIFEST).write_text(json.dumps({"status": "complete"}))
    return run


@pytest.fixture
def toy(monkeypatch):
    """The toy format registered beside the shipped ones, and the run's merged model stood in for: a job with two
    eval rows and no model (the toy format reads neither weights nor tokenizer)."""
    from hftoolkit.workflows import merge

    toy = ToyFormat()
    monkeypatch.setitem(FORMATS, toy.name, toy)

    def merged_model(run, data=False):
        job = SimpleNamespace(task=run.recipe.task, family=run.recipe.model.family, recipe=run.recipe,
                              data={"eval": EVAL_ROWS})
        return job, None, None, None

    monkeypatch.setattr(merge, "merged_model", merged_model)
    return toy


def test_a_registered_format_is_written_checked_recorded_and_summarised(toy, tmp_path):
    run = finished_run(tmp_path, "encoder-classification.yaml", "encoder")
    out = tmp_path / "exports" / "toy"
    result = run_cli("export", run, "--format", "toy", "-q", "loud", "--output", out)
    line = "checked toy.txt on 2 eval inputs: lines 2/2"
    assert result.stdout.splitlines() == [f"exported toy (loud) to {out}: {EXPORT}, {RECIPE}, toy.txt", line]
    assert (out / "toy.txt").read_text() == "A WONDERFUL FILM\nDULL\n", "the quantization reached the format"
    assert (out / RECIPE).read_bytes() == (run / RECIPE).read_bytes()
    record = json.loads((out / EXPORT).read_text())
    assert {k: record[k] for k in ("format", "quantization", "files", "run", "task", "family", "check", "toy")} == {
        "format": "toy", "quantization": "loud", "files": ["toy.txt"], "run": str(run.resolve()),
        "task": "classification", "family": "encoder", "check": {"line": line, "inputs": 2, "lines": 2},
        "toy": {"lines": 2}}
    exports = json.loads((run / MANIFEST).read_text())["exports"]
    assert [(e["format"], e["quantization"], e["path"], e["check"]["lines"]) for e in exports] == [
        ("toy", "loud", str(out.resolve()), 2)]
    assert sorted(p.name for p in out.parent.iterdir()) == ["toy"], "no staging folder is left beside the export"


@pytest.mark.parametrize("recipe, family, args, expected", [
    ("decoder-clm.yaml", "decoder", ("--format", "toy"),
     "--format toy: toy holds encoder classifiers, and this is a decoder clm run: export it with --format gguf or "
     "ollama"),
    ("encoder-classification.yaml", "encoder", ("--format", "gguf"), "export it with --format onnx or toy"),
    ("encoder-classification.yaml", "encoder", ("--format", "tflite"),
     "--format: 'tflite' is not one of gguf, ollama, onnx, toy: gguf and ollama for decoder runs, onnx and toy for "
     "encoder runs"),
    ("encoder-classification.yaml", "encoder", ("--format", "toy", "-q", "q8_0"),
     "--quantization: 'q8_0' is not one of plain, loud"),
    ("encoder-classification.yaml", "encoder", ("--format", "onnx", "-q", "q8_0"),
     "--quantization: q8_0 applies to gguf, ollama and toy; an ONNX export keeps the run's float32 weights"),
], ids=["toy-of-decoder", "gguf-names-toy", "unknown-format", "toy-quantization", "onnx-quantized"])
def test_a_registered_format_reaches_every_refusal(toy, monkeypatch, tmp_path, recipe, family, args, expected):
    from hftoolkit.workflows import merge

    monkeypatch.setattr(merge, "merged_model", lambda *a, **k: pytest.fail("the run was loaded before a refusal"))
    run = finished_run(tmp_path, recipe, family)
    said = plain(run_cli("export", run, *args, "--output", tmp_path / "exports" / "out", expect=2).output)
    assert said.count("Error:") == 1 and expected in said, said
    assert not (tmp_path / "exports").exists()
    assert "exports" not in json.loads((run / MANIFEST).read_text())


def test_a_registered_format_whose_check_fails_leaves_nothing(toy, tmp_path):
    toy.passes = False
    run = finished_run(tmp_path, "encoder-classification.yaml", "encoder")
    said = plain(run_cli("export", run, "--format", "toy", "--output", tmp_path / "exports" / "toy", expect=2).output)
    assert said.count("Error:") == 1 and "export: checked toy.txt on 2 eval inputs: lines 2/2: beyond the format's " \
        "tolerance, so nothing was kept" in said, said
    assert not (tmp_path / "exports").exists(), "neither the folder nor its staging copy is left"
    assert "exports" not in json.loads((run / MANIFEST).read_text())
