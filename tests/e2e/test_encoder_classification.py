"""BERT classification end to end: train -> eval -> predict, LoRA, 8-bit, the run directory, bad input."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import yaml

from hftoolkit.base.run_layout import FILES
from tests.helpers import RECIPES, plain, run_cli, train_recipe

RECIPE = RECIPES / "encoder-classification.yaml"


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory):
    """The quickstart recipe itself, unchanged but for the capped eval set."""
    run = tmp_path_factory.mktemp("runs") / "bert-lora"
    result = train_recipe(RECIPE, run, "data.max_eval_samples=80")
    return run, result


@pytest.mark.slow
def test_train_writes_the_run_directory_contract(lora_run):
    run, result = lora_run
    for name in FILES:
        assert (run / name).is_file(), name
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert not list(run.rglob("*.bin")) and not list(run.rglob("*.pt")), "weights must be safetensors only"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["seed"] == 0 and manifest["data_fingerprint"] and manifest["versions"]["torch"]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["main_metric"] == "accuracy"
    assert set(metrics["eval"]) >= {"accuracy", "f1", "precision", "recall", "matthews_correlation", "loss"}
    assert 0 < metrics["trainable_params"] < metrics["total_params"]
    assert metrics["lora_rank"] == 8 and metrics["quantization"] == "none"
    assert 0 <= metrics["padding_fraction"] < 1 and metrics["tokens_per_second"] > 0
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recipe["data"]["label_names"] == ["negative", "positive"]
    assert recipe["data"]["max_eval_samples"] == 80, "the resolved recipe keeps the overrides"
    steps = [json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]
    assert any("loss" in s for s in steps)
    predictions = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 80
    assert {"input", "reference", "label", "probability"} <= set(predictions[0])
    assert "accuracy *" in result.output, "the train command ends with a results table"
    assert gc.isenabled() and gc.get_freeze_count() == 0, "a caller (a notebook) gets the garbage collector back"


@pytest.mark.slow
def test_prediction_records_are_their_own_inputs_predictions(lora_run, tmp_path):
    """Eval runs shortest first and takes its records from that pass: each must still be its input's."""
    run, _ = lora_run
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()][:24]
    words = [len(r["input"].split()) for r in records]
    assert words != sorted(words), "the eval texts differ in length, so shortest-first reorders them"
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("".join(r["input"] + "\n" for r in records))
    rows = run_cli("predict", run, "--input", inputs).stdout.strip().splitlines()[-len(records):]
    # Eval ran under the run's precision, predict in fp32: bf16 autocast rounds each product to 8 bits of
    # mantissa (2**-8 relative), which moves a probability by up to about 1e-2; fp32 differs only in how
    # batches are padded.
    tolerance = 1e-3 if json.loads((run / "metrics.json").read_text())["precision"] == "fp32" else 1e-2
    for record, row in zip(records, rows):
        text, label, probability = row.split("\t")
        assert (text, label) == (record["input"], record["label"])
        assert float(probability) == pytest.approx(record["probability"], abs=tolerance)


@pytest.mark.slow
def test_lora_trains_query_value_and_head_only(lora_run):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.workflows.evaluate import load_trained

    run, _ = lora_run
    _, _, model, _ = load_trained(run)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(("lora_" in n and (".query." in n or ".value." in n)) or "classifier" in n
                             for n in trainable), sorted(trainable)
    config = model.config
    r = load_recipe(run / "recipe.yaml").lora.r
    lora = config.num_hidden_layers * 2 * 2 * r * config.hidden_size  # layers x (q, v) x (A, B)
    head = config.hidden_size * 2 + 2
    assert sum(p.numel() for n, p in model.named_parameters() if p.requires_grad) == lora + head


@pytest.mark.slow
def test_eval_reproduces_the_metrics_and_predict_prints_label_and_probability(lora_run, tmp_path):
    run, _ = lora_run
    before = json.loads((run / "metrics.json").read_text())["eval"]
    run_cli("eval", run)
    after = json.loads((run / "metrics.json").read_text())["eval"]
    assert after["accuracy"] == pytest.approx(before["accuracy"])
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-4)
    out = run_cli("predict", run, "--input", "the movie was wonderful").stdout
    label, probability = out.strip().splitlines()[-1].split("\t")[1:]
    assert label in ("positive", "negative") and 0.5 <= float(probability) <= 1
    lines = tmp_path / "inputs.txt"
    lines.write_text("the plot was dull\nevery scene was superb\n")
    rows = run_cli("predict", run, "--input", lines).stdout.strip().splitlines()
    assert [r.split("\t")[0] for r in rows[-2:]] == ["the plot was dull", "every scene was superb"]


@pytest.mark.slow
def test_adapter_round_trip_gives_identical_logits(lora_run):
    import torch

    from hftoolkit.workflows.evaluate import load_trained

    run, _ = lora_run
    _, _, first, tokenizer = load_trained(run)
    _, _, second, _ = load_trained(run)
    batch = tokenizer(["the film was brilliant", "the cast was awful honestly"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(first(**batch).logits, second(**batch).logits)
    untrained_head = first.base_model.model.classifier.original_module.weight
    trained_head = first.base_model.model.classifier.modules_to_save["default"].weight
    assert not torch.equal(untrained_head, trained_head), "the head was trained and saved"


@pytest.mark.slow
def test_learns_the_builtin_sentiment_task(lora_run):
    """The quickstart learns: well above the 0.5 of guessing on balanced classes."""
    run, _ = lora_run
    assert json.loads((run / "metrics.json").read_text())["eval"]["accuracy"] >= 0.75


@pytest.mark.slow
def test_lora_with_8bit_base_trains_and_keeps_the_head_out_of_quantization(tmp_path):
    pytest.importorskip("bitsandbytes")
    run = tmp_path / "bert-8bit"
    train_recipe(RECIPE, run, "model.quantization=8bit", "training.max_steps=4", "data.max_train_samples=64",
                 "data.max_eval_samples=32")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["quantization"] == "8bit"
    from hftoolkit.workflows.evaluate import load_trained

    _, _, model, _ = load_trained(run)
    kinds = {type(m).__name__ for n, m in model.named_modules() if n.endswith("attention.self.key")}
    assert kinds == {"Linear8bitLt"}
    head = model.base_model.model.classifier.modules_to_save["default"]
    assert type(head).__name__ == "Linear" and head.weight.dtype.is_floating_point
    out = run_cli("predict", run, "--input", "every scene was delightful").stdout
    assert out.strip().split("\t")[1] in ("positive", "negative")


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["8bit", "4bit"])
def test_a_quantized_load_lets_go_of_the_checkpoint_file(tmp_path, quantization):
    """Quantizing reads every weight through the file's memory map; kept mapped, the whole file stays
    resident (BERT-base 8-bit: 439 MB more peak RSS). After the load nothing may point into it."""
    pytest.importorskip("bitsandbytes")
    import gc
    import shutil

    import torch

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.sources.tiny import ensure_tiny

    checkpoint = tmp_path / "bert"  # a private copy: other tests' models may map the shared one
    shutil.copytree(ensure_tiny("bert"), checkpoint)
    weights = str(checkpoint / "model.safetensors")
    recipe = load_recipe(RECIPE, [f"model.checkpoint={checkpoint}", f"model.quantization={quantization}",
                                  "data.label_names=[negative, positive]"])
    job = resolve_job(recipe, data=False)
    model, tokenizer = formulation(job).load_model(job)
    gc.collect()
    assert weights not in Path("/proc/self/maps").read_text()
    model.train()
    batch = tokenizer(["a fine film", "dull"], padding=True, return_tensors="pt")
    loss = model(**batch, labels=torch.tensor([0, 1])).loss
    loss.backward()  # the copied tensors still train
    assert loss.isfinite()


# ---------------------------------------------------------------- bad input (issue 2's list)


def _recipe(tmp_path, **data):
    raw = yaml.safe_load(RECIPE.read_text())
    for dotted, value in data.items():
        section, key = dotted.split("__")
        raw[section][key] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


BAD_INPUTS = {
    "recipe file missing": (lambda t: ["train", t / "missing.yaml"], "recipe file not found"),
    "yaml syntax": (lambda t: ["train", _write(t, "name: [x\n")], "YAML syntax error"),
    "unknown key": (lambda t: ["train", RECIPE, "--set", "training.epoch=2"], "did you mean 'epochs'"),
    "wrong type": (lambda t: ["train", RECIPE, "--set", "training.batch_size=big"], "training.batch_size"),
    "data file missing": (lambda t: ["train", _recipe(t, data__train=str(t / "no.csv"))], "data file"),
    "text column missing": (lambda t: ["train", _recipe(t, data__train=_csv(t, "review,label\nok,a\nbad,b\n"))],
                            "column 'text' not found"),
    "empty data": (lambda t: ["train", _recipe(t, data__train=_csv(t, "text,label\n"))], "has no rows"),
    "label outside names": (lambda t: ["train", _recipe(t, data__train=_csv(t, "text,label\na,pos\nb,neg\nc,meh\n"),
                                                        data__label_names=["pos", "neg"])],
                            "label 'meh' is not one of data.label_names"),
    "checkpoint dir missing": (lambda t: ["train", RECIPE, "--set", f"model.checkpoint={t}/nothing"],
                               "checkpoint directory"),
    "hub id offline": (lambda t: ["train", RECIPE, "--set", "model.checkpoint=bert-base-uncased"],
                       "is not in the cache"),
}


def _write(tmp_path, text):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    return path


def _csv(tmp_path, text):
    path = tmp_path / "data.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_with_one_clear_sentence_and_leaves_nothing(case, tmp_path):
    make_args, expected = BAD_INPUTS[case]
    run = tmp_path / "run"
    result = run_cli(*make_args(tmp_path), "--output", run, expect=2)
    assert expected in plain(result.output), result.output
    assert "Traceback" not in result.output
    assert not run.exists(), "no half-written run directory"
    assert gc.isenabled() and gc.get_freeze_count() == 0, "train turns garbage collection back on, even on error"


def test_non_empty_output_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "precious.txt").write_text("keep me")
    result = run_cli("train", RECIPE, "--output", run, expect=2)
    assert "is not empty: pass --overwrite" in plain(result.output)
    assert (run / "precious.txt").read_text() == "keep me"


@pytest.mark.slow
def test_predict_rejects_a_bad_decoding_option_with_a_clear_error(lora_run):
    run, _ = lora_run
    result = run_cli("predict", run, "--input", "fine", "--strategy", "telepathy", expect=2)
    assert "predict options: eval.generation.strategy" in plain(result.output)
