"""merge: the merged checkpoint equals the adapter model (fp32, 1e-5), loads without peft, has the asked dtype."""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, run_cli, train_recipe

# family -> (smoke recipe, transformers Auto class, how to build a batch from the processor)
CASES = {
    "encoder": ("encoder-classification.yaml", "AutoModelForSequenceClassification",
                lambda p: p(["the film was brilliant", "every scene was dull"], padding=True, return_tensors="pt")),
    "decoder": ("decoder-clm.yaml", "AutoModelForCausalLM",
                lambda p: p(["the cat sees a dog"], return_tensors="pt")),
    "seq2seq": ("seq2seq-translation-t5.yaml", "AutoModelForSeq2SeqLM",
                lambda p: {**p(["the cat sees a dog"], return_tensors="pt"),
                           "decoder_input_ids": p(["de katze"], return_tensors="pt")["input_ids"]}),
    "vision": ("vision-classification.yaml", "AutoModelForImageClassification",
               lambda p: p([_digit()], return_tensors="pt")),
}


def _digit():
    from hftoolkit.sources.builtin import digits

    return digits(n=1)[0]["image"]


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("merge")


@pytest.mark.slow
@pytest.mark.parametrize("family", list(CASES))
@pytest.mark.parametrize("quantization", ["none", "8bit"])
def test_merged_equals_adapter_and_loads_without_peft(family, quantization, runs):
    import torch
    import transformers

    recipe, auto, make_batch = CASES[family]
    if quantization != "none":
        pytest.importorskip("bitsandbytes")
    run = runs / f"{family}-{quantization}"
    train_recipe(RECIPES / recipe, run, "training.max_steps=3", "data.max_train_samples=48",
                 "data.max_eval_samples=8", "eval.max_predictions=2", f"model.quantization={quantization}",
                 "training.logging_steps=1")
    out = runs / f"{family}-{quantization}-merged"
    run_cli("merge", run, "--out", out)
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()

    from hftoolkit.workflows.evaluate import load_trained

    _, _, adapter_model, processor = load_trained(run, full_precision=True)
    merged = getattr(transformers, auto).from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert merged.dtype == torch.float32
    batch = make_batch(processor)
    with torch.no_grad():
        expected = adapter_model(**batch).logits
        got = merged(**batch).logits
    assert torch.allclose(expected, got, atol=1e-5), (expected - got).abs().max()
    lora_b = [p for n, p in adapter_model.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b), "training moved B off zero, so the merge is a real test"


def test_merge_saves_the_dtype_asked_for(runs, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    run = runs / "encoder-bf16"
    train_recipe(RECIPES / "encoder-classification.yaml", run, "training.max_steps=2",
                 "data.max_train_samples=32", "data.max_eval_samples=8")
    out = tmp_path / "bf16"
    said = run_cli("merge", run, "--out", out, "--dtype", "bfloat16").stdout.strip()
    assert AutoModelForSequenceClassification.from_pretrained(out, dtype="auto").dtype == torch.bfloat16
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert {"config.json", "model.safetensors", "recipe.yaml", "tokenizer.json"} <= set(written), written
    assert said == f"merged checkpoint written to {out}: {', '.join(written)}", "the summary names every file"
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    result = run_cli("merge", run, "--out", out, expect=2)
    assert "is not empty" in result.output
