"""ViT image classification end to end: train -> eval -> predict, LoRA targets, 8/4-bit, image folders, bad images."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from tests.helpers import RECIPES, plain, run_cli, train_recipe

RECIPE = RECIPES / "vision-classification.yaml"
# The smoke recipe shortened from 12 epochs to 4: still far above guessing, in about 10 s of training.
SHORT = ("training.epochs=4",)
FEW_STEPS = ("training.max_steps=3", "data.max_train_samples=64", "data.max_eval_samples=32")


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "vit-digits"
    result = train_recipe(RECIPE, run, *SHORT)
    return run, result


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _prediction_row(output: str, image) -> list[str]:
    """predict's "input<TAB>label<TAB>probability" line for `image` (library logs share the captured output)."""
    rows = re.findall(rf"{re.escape(str(image))}\t([^\t\n]+)\t([^\t\n]+)\n", output)
    assert len(rows) == 1, output
    return list(rows[0])


def _digit_images(count: int):
    from hftoolkit.sources.builtin import digits

    return digits(count)


@pytest.mark.slow
def test_train_writes_metrics_predictions_and_the_adapter(digits_run):
    import yaml

    run, result = digits_run
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["family"] == "vision" and metrics["main_metric"] == "accuracy"
    assert {"accuracy", "f1", "loss"} <= set(metrics["eval"])
    assert metrics["lora_rank"] == 8 and 0 < metrics["trainable_params"] < metrics["total_params"]
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert (run / "adapter" / "preprocessor_config.json").is_file(), "the image processor is saved with the adapter"
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recipe["data"]["label_names"] == [str(d) for d in range(10)]
    predictions = _read_jsonl(run / "predictions.jsonl")
    assert len(predictions) == recipe["eval"]["max_predictions"]
    names = set(recipe["data"]["label_names"])
    assert all(p["label"] in names and p["reference"] in names and 0 < p["probability"] <= 1 for p in predictions)
    hits = sum(p["label"] == p["reference"] for p in predictions) / len(predictions)
    assert hits > 0.3, "the saved predictions are the trained model's, not a random head's"
    assert "accuracy *" in result.output


@pytest.mark.slow
def test_learns_digits_clearly_above_the_majority_baseline(digits_run):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    run, _ = digits_run
    eval_labels = load_data(load_recipe(run / "recipe.yaml"))[0]["eval"]["label"]
    majority = Counter(eval_labels).most_common(1)[0][1] / len(eval_labels)
    accuracy = json.loads((run / "metrics.json").read_text())["eval"]["accuracy"]
    assert accuracy >= majority + 0.3, f"accuracy {accuracy:.3f} vs majority-class baseline {majority:.3f}"


@pytest.mark.slow
def test_eval_reproduces_the_metrics_and_predict_reads_a_png(digits_run, tmp_path):
    from hftoolkit.workflows.evaluate import load_trained

    run, _ = digits_run
    before = json.loads((run / "metrics.json").read_text())["eval"]
    run_cli("eval", run)
    after = json.loads((run / "metrics.json").read_text())["eval"]
    assert after["accuracy"] == pytest.approx(before["accuracy"])
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-4)

    image = _digit_images(1)[0]["image"]
    png = tmp_path / "digit.png"
    image.save(png)
    row = _prediction_row(run_cli("predict", run, "--input", png).output, png)
    job, form, model, processor = load_trained(run)
    expected = form.generate(job, model, processor, [image])[0]
    assert row == [expected["label"], str(expected["probability"])], "predict on the PNG = the model on the image"

    text_file = tmp_path / "not-an-image.png"
    text_file.write_text("hello")
    result = run_cli("predict", run, "--input", text_file, expect=2)
    assert "is not a readable image" in plain(result.output)


@pytest.mark.slow
def test_lora_targets_the_query_value_projections_and_the_head_only(digits_run):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.models import lora
    from hftoolkit.workflows.evaluate import load_trained

    run, _ = digits_run
    job, _, model, _ = load_trained(run)
    base = model.base_model.model
    targets = lora.targets(base, job)
    assert targets in (["q_proj", "v_proj"], ["query", "value"]), targets
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(("lora_" in n and any(f".{t}." in n for t in targets)) or "classifier" in n
                             for n in trainable), sorted(trainable)
    config, r = model.config, load_recipe(run / "recipe.yaml").lora.r
    adapted = config.num_hidden_layers * len(targets) * 2 * r * config.hidden_size  # layers x (q, v) x (A, B)
    head = (config.hidden_size + 1) * config.num_labels
    assert sum(p.numel() for p in trainable.values()) == adapted + head


def test_lora_targets_keep_only_the_names_a_vit_release_has():
    """transformers 5 says q_proj/v_proj, older releases query/value: the table lists both, each model gets its own."""
    import torch

    from hftoolkit.config.recipe import validate_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models import lora

    class OlderViTAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (torch.nn.Linear(4, 4) for _ in range(3))

    class OlderViT(torch.nn.Module):
        config = type("Config", (), {"model_type": "vit"})()

        def __init__(self):
            super().__init__()
            self.layer = torch.nn.ModuleList([OlderViTAttention()])

    recipe = validate_recipe({"name": "v", "task": "image-classification", "model": {"checkpoint": "init:vit"},
                              "data": {"train": "builtin:digits"}})
    assert lora.targets(OlderViT(), resolve_job(recipe, data=False)) == ["query", "value"]


@pytest.mark.slow
@pytest.mark.parametrize("quantization,layer", [("8bit", "Linear8bitLt"), ("4bit", "Linear4bit")])
def test_lora_on_a_quantized_vit_trains_on_cpu(quantization, layer, tmp_path):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed, so 8-bit/4-bit loading can't run")
    from hftoolkit.workflows.evaluate import load_trained

    run = tmp_path / f"vit-{quantization}"
    train_recipe(RECIPE, run, f"model.quantization={quantization}", *FEW_STEPS)
    assert json.loads((run / "metrics.json").read_text())["quantization"] == quantization
    _, _, model, _ = load_trained(run)
    kinds = {type(m).__name__ for n, m in model.named_modules() if n.endswith(("attention.k_proj", "attention.key"))}
    assert kinds == {layer}, "the attention projections are quantized"
    head = model.base_model.model.classifier.modules_to_save["default"]
    assert type(head).__name__ == "Linear" and head.weight.dtype.is_floating_point, "the head stays full precision"
    png = _save_digit(tmp_path)
    assert _prediction_row(run_cli("predict", run, "--input", png).output, png)[0] in [str(d) for d in range(10)]


def _save_digit(folder):
    path = folder / "digit.png"
    _digit_images(1)[0]["image"].save(path)
    return path


def _image_folder(root, per_class: int = 12):
    """An image folder with one sub-folder per class, named by the digit's word, of real digit PNGs."""
    words = {"0": "zero", "1": "one", "2": "two"}
    counts = Counter()
    for row in _digit_images(300):
        if row["label"] in words and counts[row["label"]] < per_class:
            folder = root / words[row["label"]]
            folder.mkdir(parents=True, exist_ok=True)
            row["image"].save(folder / f"{counts[row['label']]}.png")
            counts[row["label"]] += 1
    return root


def test_an_image_folder_of_class_subfolders_trains(tmp_path):
    import yaml

    data = _image_folder(tmp_path / "images")
    run = tmp_path / "run"
    train_recipe(RECIPE, run, f"data.train={data}", "training.max_steps=3", "data.eval_fraction=0.25")
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recipe["data"]["label_names"] == ["one", "two", "zero"], "labels are the sub-folder names"
    predictions = _read_jsonl(run / "predictions.jsonl")
    assert len(predictions) == 9 and {p["reference"] for p in predictions} <= {"zero", "one", "two"}
    assert "accuracy" in json.loads((run / "metrics.json").read_text())["eval"]


def test_a_corrupt_image_in_an_image_folder_is_named(tmp_path):
    data = _image_folder(tmp_path / "images", per_class=4)
    broken = data / "one" / "broken.png"
    broken.write_text("this is text, not a PNG")
    result = train_recipe(RECIPE, tmp_path / "run", f"data.train={data}", "training.max_steps=1", expect=2)
    # Exit code 2 is a UserError (a crash exits 1), and its one sentence ends the output.
    last = plain(result.output.strip().splitlines()[-1])
    assert last.startswith(f"Error: data: image file {broken} can't be read as an image"), result.output


def test_image_paths_in_a_column_and_unreadable_bytes(tmp_path):
    """An image column of file paths works; a truncated file is named when drawn; bad bytes are named by row."""
    import datasets

    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import validate_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation

    recipe = validate_recipe({"name": "v", "task": "image-classification", "model": {"checkpoint": "init:vit"},
                              "data": {"train": "builtin:digits", "label_names": [str(d) for d in range(10)]}})
    job = resolve_job(recipe, data=False)
    vision = formulation(job)
    _, processor = vision.load_model(job)
    png = _save_digit(tmp_path)
    paths = datasets.Dataset.from_dict({"image": [str(png)] * 3, "label": [1, 2, 3]})
    encoded = vision.preprocess(job, processor, paths)
    batch = vision.collator(job, processor)(encoded.__getitems__([0, 2]))
    assert tuple(batch["pixel_values"].shape) == (2, 3, 32, 32) and batch["labels"].tolist() == [1, 3]

    # A truncated file has a readable header, so it passes the up-front check and fails when its batch is drawn.
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(png.read_bytes()[:-40])
    rows = datasets.Dataset.from_dict({"image": [str(truncated)], "label": [0]})
    encoded = vision.preprocess(job, processor, rows)
    with pytest.raises(UserError, match=f"image file {re.escape(str(truncated))} can't be read"):
        encoded.__getitems__([0])

    good = datasets.Dataset.from_dict({"image": [str(png)], "label": [0]}).cast_column("image", datasets.Image())
    bad = datasets.Dataset.from_dict({"image": [{"bytes": b"not an image", "path": None}], "label": [0]},
                                     features=good.features)
    with pytest.raises(UserError, match="the image in row 1 can't be read"):
        vision.preprocess(job, processor, datasets.concatenate_datasets([good, bad]))


def test_image_classification_with_a_bert_checkpoint_fails_validation_naming_vision():
    result = run_cli("validate", RECIPE, "--set", "model.checkpoint=init:bert", expect=2)
    message = plain(result.output)
    assert "task 'image-classification' can't be done by 'init:bert', an encoder model" in message, message
    assert "use a vision checkpoint" in message, message
