"""`eval RUN_DIR`: its table shows what the eval pass measured, and marks what it kept from the training run."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import ROOT, run_cli, terminal_width

OLD_RUN = ROOT / "tests" / "fixtures" / "run-before-job"  # a trained run, kept in the repository: nothing to train


def table(output: str) -> dict[str, str]:
    """The results table's rows, metric -> value."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]
    return {row[0]: row[1] for row in rows if len(row) == 2}


@pytest.mark.slow
def test_eval_of_a_run_shows_what_it_measured_and_labels_what_training_measured(tmp_path, monkeypatch):
    terminal_width(monkeypatch, 100)
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    trained = json.loads((run / "metrics.json").read_text())
    rows = table(run_cli("eval", run).stdout)
    after = json.loads((run / "metrics.json").read_text())
    assert rows["eval_seconds"] == str(after["eval_seconds"])  # measured by this pass
    assert rows["accuracy *"] == f"{after['eval']['accuracy']:.4f}"
    for key in ("setup_seconds", "train_seconds", "samples_per_second", "tokens_per_second", "peak_memory_mb"):
        assert key not in rows, f"{key} is the training run's, not eval's"
        assert rows[f"{key} (from training)"] == str(trained[key])
        assert after[key] == trained[key], "metrics.json keeps what training measured"


def _sst2_with_labels() -> tuple:
    """GLUE's sst2 as the hub lays it out (sentence, label as a ClassLabel, idx), every split labelled."""
    import datasets

    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"]),
                                  "idx": datasets.Value("int32")})
    words = ["dull", "superb"]
    splits = {split: [{"sentence": f"the {split} film was {words[i % 2]}", "label": i % 2, "idx": i}
                      for i in range(count)] for split, count in (("train", 16), ("validation", 8), ("test", 6))}
    return features, splits


@pytest.mark.slow
def test_eval_of_a_run_on_another_split_shows_that_split_s_seconds(tmp_path, monkeypatch):
    """--split scores a split of the run's hub data set: the table's eval_seconds is that pass's, while
    metrics.json's stays the eval split's (its contract) and the training figures are marked as training's."""
    import yaml

    from tests.helpers import hub_cache

    terminal_width(monkeypatch, 100)
    home = tmp_path / "hf-home"
    hub_cache.plant_dataset(home / "hub", home / "datasets", "nyu-mll/glue", {"sst2": _sst2_with_labels()})
    hub_cache.use_hf_home(monkeypatch, home)
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())  # the run as if trained on the hub's sst2
    recipe["data"].update({"train": "nyu-mll/glue", "config": "sst2", "eval_split": "validation",
                           "text_column": "sentence"})
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    trained = {**json.loads((run / "metrics.json").read_text()), "eval_seconds": 999.0}  # (no pass takes that)
    (run / "metrics.json").write_text(json.dumps(trained))
    result = run_cli("eval", run, "--split", "test")
    rows = table(result.stdout)
    after = json.loads((run / "metrics.json").read_text())
    assert "encoder-classification on test" in result.stdout and set(after["splits"]["test"]) >= {"accuracy"}
    assert after["eval_seconds"] == 999.0, "metrics.json's eval_seconds stays the eval split's"
    assert 0 < float(rows["eval_seconds"]) < 999.0 and "train_seconds" not in rows, rows
    assert rows["train_seconds (from training)"] == str(trained["train_seconds"])
