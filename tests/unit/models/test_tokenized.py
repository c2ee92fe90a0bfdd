"""Tokenization once and in parallel (models/tokenized.py): a second run on the same data, tokenizer and lengths
reads the tokenized cache and says so in one line; a changed max_length or tokenizer tokenizes again;
data.num_proc tokenizes with several processes into the same rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import RECIPES, train_recipe

ENCODER = RECIPES / "encoder-classification.yaml"
REUSED = "tokenized data reused from the cache"


def reviews(folder: Path) -> Path:
    """A CSV of its own per test: its path and time are part of the cache key, so no other test's cache matches."""
    path = folder / "reviews.csv"
    path.write_text("review,label\n" + "".join(f"{'a great fun film' if i % 2 else 'a dull slow film'} {i},"
                                               f"{'positive' if i % 2 else 'negative'}\n" for i in range(60)))
    return path


def short(data: Path, *more: str) -> tuple[str, ...]:
    return (f"data.train={data}", "data.text_column=review", "training.max_steps=1", "training.batch_size=8",
            *more)


def eval_of(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())["eval"]


def lowercase_flipped(tmp_path: Path) -> Path:
    """The tiny BERT checkpoint with a tokenizer that keeps case: same vocabulary, other token ids for 'A'."""
    from hftoolkit.sources.tiny import ensure_tiny

    folder = tmp_path / "cased-bert"
    shutil.copytree(ensure_tiny("bert"), folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["normalizer"]["lowercase"] = False
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


@pytest.mark.slow
def test_a_second_run_reuses_the_tokenized_data_and_a_new_max_length_or_tokenizer_does_not(tmp_path, monkeypatch):
    from hftoolkit.base import console

    monkeypatch.setattr(console, "PROGRESS_AFTER", 0.0)  # (off a terminal, short work shows no progress lines)
    data = reviews(tmp_path)
    first = train_recipe(ENCODER, tmp_path / "first", *short(data)).output
    assert "tokenized 60 rows in" in first and REUSED not in first
    assert "tokenizing: 48/48 rows" in first  # the progress of the train split (a bar on a terminal)
    again = train_recipe(ENCODER, tmp_path / "again", *short(data)).output
    assert [line for line in again.splitlines() if REUSED in line] == [
        line for line in again.splitlines() if "tokenized" in line], "one line says the cache was reused"
    assert f"{REUSED}" in again and "60 rows, nothing tokenized" in again
    assert "tokenizing:" not in again  # nothing tokenized: no progress
    assert eval_of(tmp_path / "again") == eval_of(tmp_path / "first")
    longer = train_recipe(ENCODER, tmp_path / "longer", *short(data, "data.max_length=48")).output
    assert "tokenized 60 rows in" in longer and REUSED not in longer
    cased = train_recipe(ENCODER, tmp_path / "cased", *short(data, f"model.checkpoint={lowercase_flipped(tmp_path)}"))
    assert "tokenized 60 rows in" in cased.output and REUSED not in cased.output


@pytest.mark.slow
def test_num_proc_tokenizes_with_several_processes_into_the_same_rows(tmp_path):
    import os

    environ = os.environ
    data = reviews(tmp_path)
    parallel = train_recipe(ENCODER, tmp_path / "parallel", *short(data, "data.num_proc=2")).output
    assert "tokenized 60 rows in" in parallel and "with 2 processes" in parallel
    # (datasets' map with num_proc swaps os.environ for a copy: the process's own mapping is put back)
    assert os.environ is environ
    train_recipe(ENCODER, tmp_path / "serial", *short(data))  # (the parallel run's files are shards: no reuse)
    assert eval_of(tmp_path / "parallel") == eval_of(tmp_path / "serial")


def test_a_tokenizer_keeps_its_identity_when_called_and_loses_it_when_its_rules_change(tmp_path):
    from transformers import AutoTokenizer

    from hftoolkit.models.tokenized import tokenizer_identity
    from hftoolkit.sources.tiny import ensure_tiny

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny("bert"))
    before = tokenizer_identity(tokenizer)
    tokenizer(["a film", "another film"], truncation=True, max_length=3, padding=True)
    assert tokenizer_identity(tokenizer) == before  # a call's truncation and padding are not the tokenizer
    assert tokenizer_identity(AutoTokenizer.from_pretrained(lowercase_flipped(tmp_path))) != before
