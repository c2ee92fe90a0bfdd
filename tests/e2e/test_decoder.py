"""GPT-2 causal-LM end to end: train -> eval -> predict, perplexity, packing and padding, LoRA, 8/4-bit."""

from __future__ import annotations

import json
import math

import pytest

from hftoolkit.base.run_layout import FILES
from hftoolkit.config.recipe import RecipeError, load_recipe
from tests.helpers import RECIPES, SHARED_DATA, plain, run_cli, train_recipe

RECIPE = RECIPES / "decoder-clm.yaml"
SHAKESPEARE = SHARED_DATA / "tinyshakespeare" / "input.txt"
SHORT = ("training.max_steps=24", "data.max_eval_samples=60", "eval.max_predictions=4")


@pytest.fixture(scope="session")
def clm_run(tmp_path_factory):
    """The smoke recipe cut to 24 steps (of its 57), with a capped eval set."""
    run = tmp_path_factory.mktemp("runs") / "gpt2-clm"
    result = train_recipe(RECIPE, run, *SHORT)
    return run, result


def _recipe(*sets: str):
    return load_recipe(RECIPE, list(sets))


def _job(*sets: str):
    """The recipe resolved without its data (the checkpoint's config and tokenizer loaded)."""
    from hftoolkit.job.resolve import resolve_job

    return resolve_job(_recipe(*sets), data=False)


def _clm():
    from hftoolkit.models.families import decoder

    return decoder.FORMULATIONS["clm"]


def _loaded(*sets: str):
    job = _job(*sets)
    model, tokenizer = _clm().load_model(job)
    return job.recipe, model.eval(), tokenizer


def test_train_writes_the_run_directory_with_perplexity(clm_run):
    run, result = clm_run
    for name in FILES:
        assert (run / name).is_file(), name
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert not list(run.rglob("*.bin")) and not list(run.rglob("*.pt")), "weights must be safetensors only"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["main_metric"] == "perplexity" and metrics["greater_is_better"] is False
    assert metrics["eval"]["perplexity"] == pytest.approx(math.exp(metrics["eval"]["loss"]))
    assert metrics["padding_fraction"] == 0, "packed blocks hold no padding"
    assert metrics["lora_rank"] == 8 and 0 < metrics["trainable_params"] < metrics["total_params"]
    assert "perplexity *" in result.output


def test_predictions_continue_the_first_quarter_of_eval_texts(clm_run):
    run, _ = clm_run
    predictions = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 4
    for p in predictions:
        assert p["input"].startswith(p["prompt"]) and len(p["prompt"]) < len(p["input"])
        assert isinstance(p["text"], str) and p["text"].strip(), p


def test_learns_synthetic_text_far_below_the_untrained_perplexity(clm_run):
    """The untrained model (LoRA's B starts at zero) scored on the same eval blocks, computed directly."""
    import torch

    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation

    run, _ = clm_run
    job = resolve_job(load_recipe(run / "recipe.yaml"))
    form = formulation(job)
    model, tokenizer = form.load_model(job)
    blocks = form.preprocess(job, tokenizer, job.data["eval"]).remove_columns("length")
    batch = form.collator(job, tokenizer)(list(blocks))
    with torch.no_grad():
        untrained = math.exp(model.eval()(**batch).loss.item())
    trained = json.loads((run / "metrics.json").read_text())["eval"]["perplexity"]
    assert trained < 0.5 * untrained, (trained, untrained)


def test_eval_reproduces_the_loss_and_predict_generates_with_beam_search(clm_run, tmp_path):
    run, _ = clm_run
    before = json.loads((run / "metrics.json").read_text())["eval"]
    run_cli("eval", run)
    after = json.loads((run / "metrics.json").read_text())["eval"]
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-4)
    assert after["perplexity"] == pytest.approx(before["perplexity"], rel=1e-4)
    out = run_cli("predict", run, "--input", "the cat", "--strategy", "beam", "--num-beams", "3").stdout
    given, continuation = out.strip().splitlines()[-1].split("\t")
    assert given == "the cat" and continuation.strip()
    lines = tmp_path / "prompts.txt"
    lines.write_text("a dog\nthe old woman sees\n")
    rows = run_cli("predict", run, "--input", lines, "--max-new-tokens", "5").stdout.strip().splitlines()
    assert [r.split("\t")[0] for r in rows[-2:]] == ["a dog", "the old woman sees"]


def test_batched_generation_matches_one_by_one_and_top1_sampling_matches_greedy(clm_run):
    """Left padding: a short prompt batched with a long one continues exactly as it does alone."""
    import dataclasses

    from hftoolkit.config.recipe import replaced
    from hftoolkit.workflows.evaluate import load_trained

    run, _ = clm_run
    job, form, model, tokenizer = load_trained(run)
    prompts = ["a", "the big dog sees a small cat near the", "the woman"]
    batched = form.generate(job, model, tokenizer, prompts)
    alone = [form.generate(job, model, tokenizer, [p])[0] for p in prompts]
    assert batched == alone
    sampled = dataclasses.replace(job, recipe=replaced(job.recipe, {"eval.generation.strategy": "sample",
                                                                    "eval.generation.top_k": 1}))
    assert form.generate(sampled, model, tokenizer, prompts) == batched


def test_lora_on_gpt2_trains_c_attn_only_with_the_expected_count():
    """Default targets for gpt2: the fused q,k,v Conv1D c_attn (n_embd -> 3 n_embd) in every layer."""
    recipe, model, _ = _loaded("lora.targets=auto")
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and ".c_attn." in n for n in trainable), sorted(trainable)
    config, r = model.config, recipe.lora.r
    d_in, d_out = config.n_embd, 3 * config.n_embd
    assert sum(trainable.values()) == config.n_layer * r * (d_in + d_out)  # A: r x d_in, B: d_out x r
    assert model.peft_config["default"].fan_in_fan_out, "GPT-2's Conv1D stores its weight transposed"


@pytest.mark.slow
@pytest.mark.parametrize("bits, layer", [("8bit", "Linear8bitLt"), ("4bit", "Linear4bit")])
def test_quantized_lora_trains_with_lm_head_in_full_precision(bits, layer, tmp_path):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    run = tmp_path / f"gpt2-{bits}"
    train_recipe(RECIPE, run, f"model.quantization={bits}", "training.max_steps=2", "data.max_train_samples=60",
                 "data.max_eval_samples=20", "eval.max_predictions=1", "eval.generation.max_new_tokens=4")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["quantization"] == bits and math.isfinite(metrics["eval"]["loss"])
    from hftoolkit.workflows.evaluate import load_trained

    _, _, model, _ = load_trained(run)
    bases = [m.base_layer for n, m in model.named_modules() if n.endswith(".c_attn")]
    assert bases and all(type(b).__name__ == layer and type(b).__module__.startswith("bitsandbytes") for b in bases)
    head = model.get_output_embeddings()
    assert type(head).__name__ == "Linear" and head.weight.dtype.is_floating_point, "lm_head stays unquantized"


def test_packing_cuts_exact_blocks_with_eos_between_documents():
    from datasets import Dataset

    job = _job("data.max_length=16", "data.packing=blocks")
    tokenizer = job.model.processor
    texts = [f"the dog sees a cat number {i} near the river." for i in range(10)]
    blocks = _clm().preprocess(job, tokenizer, Dataset.from_dict({"text": texts}))
    stream = [i for t in texts for i in [*tokenizer(t)["input_ids"], tokenizer.eos_token_id]]
    assert len(blocks) == len(stream) // 16 > 1
    assert all(len(ids) == 16 and length == 16 for ids, length in zip(blocks["input_ids"], blocks["length"]))
    assert [i for ids in blocks["input_ids"] for i in ids] == stream[:len(blocks) * 16], "the remainder is dropped"
    assert blocks["labels"] == blocks["input_ids"], "labels are the inputs: the model shifts them"


def test_packing_longer_than_the_eval_text_is_a_clear_error():
    from datasets import Dataset

    from hftoolkit.base.errors import UserError

    job = _job("data.max_length=500")
    with pytest.raises(UserError, match="lower data.max_length"):
        _clm().preprocess(job, job.model.processor, Dataset.from_dict({"text": ["a short text."]}))


def test_without_packing_padding_is_masked_from_the_loss_but_eos_is_not():
    from datasets import Dataset

    job = _job("data.packing=false", "data.max_length=12")
    tokenizer = job.model.processor
    texts = ["a cat.", "the big dog sees the small cat near the old house by the river."]
    encoded = _clm().preprocess(job, tokenizer, Dataset.from_dict({"text": texts}))
    assert encoded["length"][1] == 12 < len(tokenizer(texts[1])["input_ids"]), "truncated to data.max_length"
    batch = _clm().collator(job, tokenizer)([{k: v for k, v in row.items() if k != "length"} for row in encoded])
    padding = batch["attention_mask"] == 0
    assert padding.any() and (batch["labels"][padding] == -100).all()
    assert (batch["labels"][~padding] == batch["input_ids"][~padding]).all()
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # GPT-2 pads with eos, so eos must be told apart
    short = encoded["length"][0]
    assert batch["labels"][0, short - 1] == tokenizer.eos_token_id, "the real eos ending a text is still learned"


def test_clm_on_a_bert_checkpoint_is_refused_naming_the_decoder_family():
    with pytest.raises(RecipeError) as err:
        _recipe("model.checkpoint=init:bert")
    assert "task 'clm' can't be done by 'init:bert', an encoder model" in str(err.value)
    assert "the course recommends decoder: the output continues a prompt" in str(err.value)
    result = run_cli("validate", RECIPE, "--set", "model.checkpoint=init:bert", expect=2)
    assert "use a decoder checkpoint" in plain(result.output)


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"real data not on this machine: {SHAKESPEARE}")
@pytest.mark.slow
def test_shakespeare_recipe_reads_the_text_file_line_by_line(tmp_path):
    run = tmp_path / "shakespeare"
    # The real-job recipe (GPT-2 on WikiText-2 through its hub id), pointed at a local text file and a tiny GPT-2.
    train_recipe(RECIPES / "gpt2-wikitext2.yaml", run, "model.checkpoint=init:gpt2", f"data.train={SHAKESPEARE}",
                 "data.config=null", "data.eval_split=null", "data.max_length=128", "training.max_steps=2",
                 "data.max_train_samples=300", "data.max_eval_samples=100", "eval.max_predictions=2",
                 "eval.generation.max_new_tokens=8")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["task"] == "clm" and math.isfinite(metrics["eval"]["perplexity"])
    lines = {line.strip() for line in SHAKESPEARE.read_text().splitlines()}
    predictions = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2 and all(p["input"].strip() in lines for p in predictions)
