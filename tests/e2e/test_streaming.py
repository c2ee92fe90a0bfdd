"""Streaming (data.streaming): a corpus read row by row as training takes it, its first rows held out for eval,
and a run killed with SIGKILL resumed at the row its checkpoint had reached, exactly as if never stopped.

The hub recipe's data set (HuggingFaceFW/fineweb-edu, sample-10BT) is planted offline as
tests/helpers/hub_cache.py does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import RECIPES, hub_cache, run_cli, train_recipe
from tests.helpers.resume import assert_same_training, kill_when_paused, killed_on_error, start_training

CLM = RECIPES / "decoder-clm.yaml"
ENCODER = RECIPES / "encoder-classification.yaml"
FINEWEB = RECIPES / "smollm2-fineweb-edu-stream.yaml"
WORDS = "the cat sat on a mat while dogs ran over green hills and birds sang all day long".split()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """400 numbered documents, one JSON object a line."""
    import random

    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with path.open("w") as f:
        for i in range(400):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24)))
            f.write(json.dumps({"body": f"doc {i}: {words}", "id": i}) + "\n")
    return path


def streamed(corpus: Path, *more: str) -> tuple[str, ...]:
    return (f"data.train={corpus}", "data.text_column=body", "data.streaming=true", "data.max_eval_samples=8",
            "data.max_length=32", "data.packing=false", "training.max_steps=6", "training.batch_size=4",
            "training.logging_steps=1", "eval.max_predictions=8", "eval.generation.max_new_tokens=4", *more)


def test_a_stream_without_a_step_count_or_eval_rows_is_refused_with_every_fix_at_once():
    result = run_cli("validate", CLM, "--set", "data.streaming=true", "--set", "data.num_workers=2", expect=2)
    assert "set training.max_steps" in result.output
    assert "set data.max_eval_samples" in result.output
    assert "set data.num_workers to 0" in result.output


def test_streaming_images_or_aligned_target_files_is_refused():
    vision = run_cli("validate", RECIPES / "vision-classification.yaml", "--set", "data.streaming=true",
                     "--set", "training.max_steps=2", "--set", "data.max_eval_samples=4", expect=2).output
    assert "image classification" in vision and "set data.streaming to false" in vision
    aligned = run_cli("validate", RECIPES / "seq2seq-translation-t5.yaml", "--set", "data.streaming=true",
                      "--set", "training.max_steps=2", "--set", "data.max_eval_samples=4",
                      "--set", "data.train_target=targets.txt", expect=2).output
    assert "put the targets in a column of data.train" in aligned


@pytest.mark.slow
def test_a_streamed_corpus_trains_its_steps_and_holds_out_its_first_rows_for_eval(corpus, tmp_path):
    run = tmp_path / "run"
    output = train_recipe(CLM, run, *streamed(corpus)).output
    assert "data opened: train streamed, 8 eval rows" in output
    assert "the stream is tokenized as training reads it" in output
    steps = [json.loads(line)["step"] for line in (run / "log_history.jsonl").read_text().splitlines()]
    assert max(steps) == 6
    prompts = [json.loads(line)["prompt"] for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert [p.split(":")[0] for p in prompts] == [f"doc {i}" for i in range(8)]  # the stream's first 8 rows
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["data_seconds"] > 0 and metrics["tokenize_seconds"] >= 0


def test_stream_classes_come_from_label_names_and_a_stream_without_them_is_refused(tmp_path):
    data = tmp_path / "reviews.csv"
    data.write_text("review,stars\n" + "".join(f"{'great fun' if i % 2 else 'dull and slow'} {i},"
                                               f"{'good' if i % 2 else 'bad'}\n" for i in range(40)))
    sets = (f"data.train={data}", "data.text_column=review", "data.label_column=stars", "data.streaming=true",
            "data.max_eval_samples=8", "training.max_steps=2", "training.batch_size=8")
    refused = train_recipe(ENCODER, tmp_path / "refused", *sets, expect=2).output
    assert "data.label_names" in refused and "set data.label_names to the class names" in refused
    run = tmp_path / "run"
    train_recipe(ENCODER, run, *sets, "data.label_names=[bad, good]")
    labels = [json.loads(line)["label"] for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(labels) == 8 and set(labels) <= {"bad", "good"}


def test_a_resumed_stream_starts_at_the_saved_row_and_never_maps_the_rows_before_it():
    """The position, not a replay: the resumed stream's encoding sees no row before the saved one but those of the
    map batch in flight (datasets saves a batched map's position as its batch's start plus the rows given out)."""
    import datasets

    from hftoolkit.training.streaming import row_stream

    seen: list[int] = []

    def encoded():
        rows = datasets.Dataset.from_list([{"i": i} for i in range(100)]).to_iterable_dataset(num_shards=1)
        return rows.map(lambda batch: seen.extend(batch["i"]) or batch, batched=True, batch_size=10)

    first = row_stream(encoded(), rows_per_batch=4)
    taken = [row["i"] for row, _ in zip(first, range(23))]  # 20 rows trained, the loader 3 rows ahead
    assert taken == list(range(23))
    seen.clear()
    again = row_stream(encoded(), rows_per_batch=4)
    again.resume(20, first.position(20))
    assert [row["i"] for row in again][:3] == [20, 21, 22]
    assert min(seen) >= 20 - 10, "rows before the saved position were read again"
    assert next(iter(again))["i"] == 0, "a pass after the resumed one starts at the stream's first row"


def test_a_stream_with_its_own_eval_file_keeps_every_train_row_and_reads_that_file_for_eval(corpus, tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.streaming import load_stream

    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"body": f"held {i}"}) + "\n" for i in range(5)))
    sets = [s for s in streamed(corpus) if not s.startswith("data.max_eval_samples")]
    data, _ = load_stream(load_recipe(CLM, [*sets, f"data.eval={held}"]))
    assert data["eval"]["text"] == [f"held {i}" for i in range(5)]
    assert next(iter(data["train"]))["text"].startswith("doc 0:")  # nothing of the train stream held out


@pytest.mark.slow
def test_a_stream_killed_with_sigkill_and_resumed_matches_the_uninterrupted_run(corpus, tmp_path):
    sets = streamed(corpus, "training.save_steps=3", "data.packing=blocks")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    process = start_training(CLM, killed, sets, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE="3")
    with killed_on_error(process):
        train_recipe(CLM, reference, *sets)
    kill_when_paused(process)
    assert json.loads((killed / "manifest.json").read_text())["status"] == "running"
    position = json.loads((killed / "checkpoints" / "checkpoint-3" / "stream_position.json").read_text())
    assert position["rows"] == 3 * 4  # three steps of four rows: not the rows the loader had read ahead
    run_cli("train", "--resume", killed)
    assert_same_training(reference, killed, steps=6)


@pytest.mark.slow
def test_the_streamed_corpus_recipe_trains_offline_from_its_hub_id(monkeypatch, tmp_path):
    import datasets

    home = tmp_path / "hf"
    hub_cache.use_hf_home(monkeypatch, home)
    features = datasets.Features({"text": datasets.Value("string"), "id": datasets.Value("string")})
    rows = [{"text": f"Lesson {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(20)), "id": f"<{i}>"}
            for i in range(60)]
    hub_cache.plant_dataset(home / "hub", home / "datasets", "HuggingFaceFW/fineweb-edu",
                            {"sample-10BT": (features, {"train": rows})})
    run = tmp_path / "run"
    output = train_recipe(FINEWEB, run, "model.checkpoint=init:gpt2", "lora.targets=[c_attn]",
                          "data.max_length=32", "data.max_eval_samples=4", "training.max_steps=2",
                          "training.batch_size=4", "training.gradient_accumulation=1", "training.warmup_steps=0",
                          "eval.batch_size=4", "eval.max_predictions=2", "eval.generation.max_new_tokens=4").output
    assert "data opened: train streamed, 4 eval rows" in output
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
