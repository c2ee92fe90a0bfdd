"""The bad input catalogue: recipes, data files, checkpoints and CLI arguments a user gets wrong.

Each row must end the command with a non-zero exit and one sentence (one line) that names
the input and what to do, no traceback, and nothing half-written: no run directory (or
output folder) appears, and an existing run directory is left byte for byte as it was.
tests/test_encoder_classification.py holds issue 2's first eleven cases; none repeat here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import RECIPES, plain, run_cli

ENCODER = RECIPES / "encoder-classification.yaml"
TAGGING = RECIPES / "encoder-tagging.yaml"
SEQ2SEQ = RECIPES / "seq2seq-translation-t5.yaml"
VISION = RECIPES / "vision-classification.yaml"


@dataclass
class Case:
    kind: str  # recipe, data, checkpoint or cli
    make: Callable[[Path], list]  # tmp_path -> CLI arguments (train commands get --output <tmp>/run)
    expect: str  # a phrase of the one-line error


def _sets(*pairs: str) -> list[str]:
    return [x for p in pairs for x in ("--set", p)]


def _write(tmp: Path, name: str, content: str | bytes) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def _recipe(tmp: Path, base: Path = ENCODER, drop: str | None = None, **sections) -> Path:
    """The base recipe with whole sections replaced or dropped, written to tmp/recipe.yaml."""
    raw = yaml.safe_load(base.read_text())
    raw.update(sections)
    raw.pop(drop, None)
    return _write(tmp, "recipe.yaml", yaml.safe_dump(raw))


def _train(recipe: Path, *pairs: str) -> list:
    return ["train", recipe, *_sets(*pairs)]


def _data(recipe: Path, path: Path, *pairs: str) -> list:
    return _train(recipe, f"data.train={path}", *pairs)


def _tiny_checkpoint(tmp: Path, arch: str = "bert") -> Path:
    """A copy of the session's tiny checkpoint that a case may then damage."""
    import shutil

    from hftoolkit.tiny import ensure_tiny

    copy = tmp / f"tiny-{arch}"
    shutil.copytree(ensure_tiny(arch), copy)
    return copy


def _truncated_weights(tmp: Path) -> Path:
    ckpt = _tiny_checkpoint(tmp)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return ckpt


def _config(tmp: Path, text: str) -> Path:
    ckpt = _tiny_checkpoint(tmp)
    (ckpt / "config.json").write_text(text)
    return ckpt


def _image_folder(tmp: Path) -> Path:
    from PIL import Image

    for label in ("cat", "dog"):
        for i in range(3):
            path = tmp / "images" / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(path)
    _write(tmp, "images/dog/broken.png", "this is a text file named like an image")
    return tmp / "images"


def _killed_run(tmp: Path, damage: Callable[[Path], None]) -> Path:
    """A run directory as a SIGKILL leaves it (manifest "running", one checkpoint), then damaged.

    Built without training: the resolved recipe as train writes it, and a checkpoint whose
    files have the right form (a safetensors adapter, zip archives of states).
    """
    import torch
    from safetensors.torch import save_file

    from hftoolkit.data import load_data
    from hftoolkit.recipe import load_recipe, recipe_to_yaml

    recipe = load_recipe(ENCODER)
    load_data(recipe)  # fills data.label_names, as train does before writing recipe.yaml
    run = tmp / "killed"
    ckpt = run / "checkpoints" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (run / "recipe.yaml").write_text(recipe_to_yaml(recipe))
    (run / "manifest.json").write_text(json.dumps({"status": "running"}))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    save_file({"lora_A": torch.ones(4, 2), "lora_B": torch.zeros(2, 4)}, str(ckpt / "adapter_model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": {}}, ckpt / name)
    damage(ckpt)
    return run


def _truncate(name: str, keep: float = 0.5):
    def damage(ckpt: Path):
        data = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(data[: int(len(data) * keep)])
    return damage


CASES: dict[str, Case] = {
    # ------------------------------------------------------------ recipes
    "recipe is a YAML list": Case("recipe", lambda t: ["train", _write(t, "r.yaml", "- name: x\n- task: y\n")],
                                  "a recipe is a YAML mapping of sections"),
    "recipe file is empty": Case("recipe", lambda t: ["train", _write(t, "r.yaml", "")],
                                 "a recipe is a YAML mapping of sections"),
    "recipe is not UTF-8": Case("recipe", lambda t: ["train", _write(t, "r.yaml", b"name: caf\xe9\n")],
                                "not UTF-8 text: save the recipe as UTF-8"),
    "python object tag in YAML": Case(
        "recipe", lambda t: ["train", _write(t, "r.yaml", "name: !!python/object/apply:os.system ['true']\n")],
        "YAML syntax error"),
    "unknown task": Case("recipe", lambda t: _train(ENCODER, "task=question-answering"), "task: input should be"),
    "typo in a section name": Case(
        "recipe", lambda t: ["train", _recipe(t, drop="training", trainig={"epochs": 1})], "did you mean 'training'"),
    "section given as a string": Case("recipe", lambda t: _train(ENCODER, "model=init:bert"), "model:"),
    "required section missing": Case("recipe", lambda t: ["train", _recipe(t, drop="data")],
                                     "data: required key missing"),
    "negative batch size": Case("recipe", lambda t: _train(ENCODER, "training.batch_size=-8"),
                                "training.batch_size: input should be greater than 0"),
    "zero epochs": Case("recipe", lambda t: _train(ENCODER, "training.epochs=0"),
                        "training.epochs: input should be greater than 0"),
    "zero LoRA rank": Case("recipe", lambda t: _train(ENCODER, "lora.r=0"), "lora.r: input should be greater than 0"),
    "LoRA dropout of 1": Case("recipe", lambda t: _train(ENCODER, "lora.dropout=1"), "lora.dropout: input should be"),
    "negative learning rate": Case("recipe", lambda t: _train(ENCODER, "training.learning_rate=-0.001"),
                                   "training.learning_rate: input should be greater than 0"),
    "a list where a number goes": Case("recipe", lambda t: _train(ENCODER, "training.epochs=[1, 2]"),
                                       "training.epochs: input should be a valid number"),
    "top_p above 1": Case("recipe", lambda t: _train(SEQ2SEQ, "eval.generation.top_p=1.5"),
                          "eval.generation.top_p: input should be less than or equal to 1"),
    "task the family cannot do": Case("recipe", lambda t: _train(ENCODER, "task=clm"),
                                      "task 'clm' can't be done by 'init:bert', an encoder model"),
    "remote code without a pinned revision": Case("recipe", lambda t: _train(ENCODER, "model.trust_remote_code=true"),
                                                  "set model.revision to a pinned commit"),
    "run name that is a path": Case("recipe", lambda t: _train(ENCODER, "name=../elsewhere"), "name: string should"),
    "T5 in fp16": Case("recipe", lambda t: _train(SEQ2SEQ, "training.precision=fp16"), "T5 overflows in fp16"),
    "denoising with T5": Case("recipe", lambda t: _train(SEQ2SEQ, "task=denoise"), "use a bart checkpoint"),
    "--set without a value": Case("cli", lambda t: ["train", ENCODER, "--set", "training.epochs"],
                                  "expected key=value"),
    "--set below a plain value": Case("cli", lambda t: _train(ENCODER, "name.first=x"), "name is not a section"),
    # ------------------------------------------------------------ data files
    "one-class data": Case("data", lambda t: _data(ENCODER, _write(t, "d.csv", "text,label\n" + "fine,pos\n" * 6)),
                           "only one class"),
    "label column of mixed types": Case(
        "data", lambda t: _data(ENCODER, _write(t, "d.jsonl", '{"text": "a", "label": 1}\n'
                                                              '{"text": "b", "label": "pos"}\n'
                                                              '{"text": "c", "label": 0}\n')),
        "make every label a name or every label an integer id"),
    "data file is not UTF-8": Case(
        "data", lambda t: _data(ENCODER, _write(t, "d.csv", b"text,label\ncaf\xe9,a\nb,b\n")),
        "is not UTF-8 text: convert it to UTF-8"),
    "unsupported data extension": Case("data", lambda t: _data(ENCODER, _write(t, "d.xlsx", "not a sheet")),
                                       "unsupported extension"),
    "malformed JSON lines": Case(
        "data", lambda t: _data(ENCODER, _write(t, "d.jsonl", '{"text": "a", "label": 1}\n{oops\n')),
        "check its format"),
    "a .gz that is not gzip": Case(
        "data", lambda t: _data(RECIPES / "encoder-mlm.yaml", _write(t, "d.txt.gz", "plain")), "could not read"),
    "empty eval file": Case("data", lambda t: _train(ENCODER, f"data.eval={_write(t, 'e.csv', 'text,label')}"),
                            "data.eval"),
    "a single row and no eval split": Case("data", lambda t: _data(ENCODER, _write(t, "d.csv", "text,label\na,pos\n")),
                                           "single row"),
    "unknown built-in set": Case("data", lambda t: _train(ENCODER, "data.train=builtin:nope"), "unknown built-in set"),
    "aligned files of different lengths": Case(
        "data", lambda t: _data(SEQ2SEQ, _write(t, "src.txt", "a\nb\nc\n"),
                                "data.train_target=" + str(_write(t, "tgt.txt", "x\ny\n"))),
        "aligned files differ in length"),
    "aligned target file missing": Case(
        "data", lambda t: _data(SEQ2SEQ, _write(t, "src.txt", "a\nb\n"), f"data.train_target={t / 'nothing.txt'}"),
        "target file"),
    "tagging rows that are text, not words": Case(
        "data", lambda t: _data(TAGGING, _write(t, "d.jsonl", '{"text": "a b", "label": ["O", "O"]}\n' * 4)),
        "tagging needs a list of words per row"),
    "tagging row with fewer tags than words": Case(
        "data", lambda t: _data(TAGGING, _write(t, "d.jsonl",
                                                '{"text": ["a", "b", "c"], "label": ["O", "B-X"]}\n' * 4)),
        "give exactly one tag per word"),
    "an image that is not an image": Case("data", lambda t: _data(VISION, _image_folder(t)), "broken.png"),
    # ------------------------------------------------------------ checkpoints
    "checkpoint folder without config.json": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={(t / 'empty').mkdir() or t / 'empty'}"),
        "has no config.json"),
    "truncated safetensors weights": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_truncated_weights(t)}"), "model.checkpoint"),
    "config.json that is not JSON": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_config(t, '{oops')}"), "model.checkpoint"),
    "unknown model type": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_config(t, json.dumps({'model_type': 'nope'}))}"),
        "model.checkpoint"),
    "checkpoint under an unknown ~user": Case(
        "checkpoint", lambda t: _train(ENCODER, "model.checkpoint=~nobody-here/bert"),
        "starts with an unknown ~user: write the full path"),
    "data under an unknown ~user": Case("data", lambda t: _train(ENCODER, "data.train=~nobody-here/d.csv"),
                                        "data.train: ~nobody-here/d.csv starts with an unknown ~user"),
    "LoRA target that matches no module": Case("checkpoint", lambda t: _train(ENCODER, "lora.targets=[q_proj]"),
                                               "match no module"),
    "resume from a truncated adapter": Case(
        "checkpoint", lambda t: ["train", "--resume", _killed_run(t, _truncate("adapter_model.safetensors"))],
        "adapter_model.safetensors is damaged"),
    "resume from a damaged optimizer state": Case(
        "checkpoint", lambda t: ["train", "--resume", _killed_run(t, _truncate("optimizer.pt", 0.3))],
        "optimizer.pt is damaged"),
    "resume from a damaged trainer state": Case(
        "checkpoint", lambda t: ["train", "--resume", _killed_run(t, _truncate("trainer_state.json"))],
        "trainer_state.json is damaged"),
    # ------------------------------------------------------------ CLI arguments
    "--output is a file": Case("cli", lambda t: ["train", ENCODER, "--output", _write(t, "taken", "x")],
                               "is a file, not a folder"),
    "--resume with --overwrite": Case("cli", lambda t: ["train", ENCODER, "--resume", "--overwrite"],
                                      "contradict each other"),
    "unknown option": Case("cli", lambda t: ["train", ENCODER, "--epochs", "3"], "No such option: --epochs"),
    "eval of a folder that is not a run": Case("cli", lambda t: ["eval", t], "not a run directory"),
    "predict with a run that never finished": Case(
        "cli", lambda t: ["predict", _killed_run(t, lambda c: None), "--input", "hello"],
        "no adapter/ or model/ folder"),
    "merge to an unknown dtype": Case("cli", lambda t: ["merge", t, "--out", t / "merged", "--dtype", "int8"],
                                      "--dtype: 'int8' is not one of"),
    "init-model of an unknown architecture": Case("cli", lambda t: ["init-model", "llama", t / "model"],
                                                  "unknown architecture"),
}


@pytest.fixture(autouse=True)
def library_logs_to_the_current_stderr():
    """datasets and transformers bind their log handlers to the stderr of the first CliRunner call, closed
    since; re-bound here, a library's log line is printed, not a "Logging error" traceback."""
    import logging
    import sys

    for name in ("datasets", "transformers"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                handler.stream = sys.stderr  # (setStream would flush the closed one)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_catalogue_is_large_and_covers_every_kind_of_input():
    kinds = [c.kind for c in CASES.values()]
    assert len(CASES) >= 30
    assert {k: kinds.count(k) >= 4 for k in ("recipe", "data", "checkpoint", "cli")} == dict.fromkeys(
        ("recipe", "data", "checkpoint", "cli"), True)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_fails_with_one_sentence_and_leaves_nothing_half_written(name, tmp_path):
    case = CASES[name]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    args = [str(a) for a in case.make(inputs)]
    run = tmp_path / "run"
    if args[0] == "train" and "--output" not in args and "--resume" not in args:
        args += ["--output", str(run)]
    before = _snapshot(inputs)
    result = run_cli(*args, expect=None)
    output = result.output
    assert result.exit_code != 0, f"{name}: exit 0\n{output}"
    assert "Traceback" not in output and not (result.exception and result.exit_code == 1), \
        f"{name}: crashed\n{output}\n{result.exception!r}"
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and output.rstrip().endswith(errors[0]), f"{name}: not one line of error\n{output}"
    assert case.expect in plain(errors[0]), f"{name}: {errors[0]!r} lacks {case.expect!r}"
    assert not run.exists(), f"{name}: left a run directory behind"
    assert _snapshot(inputs) == before, f"{name}: changed or added files among its inputs"
