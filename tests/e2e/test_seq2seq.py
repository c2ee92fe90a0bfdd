"""T5 and BART end to end: translation, summarization, BART denoising, LoRA, 8/4-bit, noising statistics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hftoolkit.models.families import noising
from hftoolkit.sources.builtin import LEXICON
from tests.helpers import RECIPES, needs, plain, run_cli, train_recipe

FEW_STEPS = ("training.max_steps=6", "data.max_train_samples=96", "data.max_eval_samples=12",
             "training.logging_steps=2")


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metrics_of(run):
    return json.loads((run / "metrics.json").read_text())


def lora_parameters(config, r: int) -> int:
    """LoRA A (r x in) and B (out x r) on q and v of every attention block: encoder self, decoder self and cross."""
    if config.model_type == "t5":
        blocks = config.num_layers + 2 * config.num_decoder_layers
        width_in, width_out = config.d_model, config.num_heads * config.d_kv
    else:
        blocks = config.encoder_layers + 2 * config.decoder_layers
        width_in = width_out = config.d_model
    return blocks * 2 * r * (width_in + width_out)


def tiny_config(arch: str):
    from transformers import AutoConfig

    from hftoolkit.sources.tiny import ensure_tiny

    return AutoConfig.from_pretrained(ensure_tiny(arch))


# ---------------------------------------------------------------- learning (BART translation recipe, unchanged)


@pytest.fixture(scope="session")
def bart_translation(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "bart-translation"
    # fp32: the beam-search test's bar (3 of 4 main clauses right) was set by this recipe trained in fp32; in bf16
    # autocast the tiny model, trained from scratch, had not yet told the articles apart (all "de").
    train_recipe(RECIPES / "seq2seq-translation-bart.yaml", run, "training.precision=fp32")
    return run


@pytest.mark.slow
def test_translation_recipe_beats_copying_the_source(bart_translation):
    import sacrebleu

    metrics = metrics_of(bart_translation)
    rows = read_jsonl(bart_translation / "predictions.jsonl")
    assert len(rows) == 100, "the whole eval split (10% of builtin:translation) is predicted"
    sources, references = [r["input"] for r in rows], [r["reference"] for r in rows]
    copy_bleu = sacrebleu.corpus_bleu(sources, [references]).score
    copy_chrf = sacrebleu.corpus_chrf(sources, [references]).score
    assert metrics["main_metric"] == "bleu" and metrics["greater_is_better"] is True
    assert metrics["eval"]["bleu"] > copy_bleu + 30, (metrics["eval"], copy_bleu)
    assert metrics["eval"]["chrf"] > copy_chrf + 20, (metrics["eval"], copy_chrf)
    # The score is the generated text's, the same text predictions.jsonl shows.
    generated = sacrebleu.corpus_bleu([r["text"] for r in rows], [references]).score
    assert metrics["eval"]["bleu"] == pytest.approx(generated, abs=1e-6)
    assert metrics["trainable_params"] == lora_parameters(tiny_config("bart"), 64)


@pytest.mark.slow
def test_predict_with_beam_search_keeps_the_input_order(bart_translation, tmp_path):
    sentences = ["the dog sees a cat near the river", "a bird likes the man",
                 "the small woman follows a big dog near the house", "a cat sees the child"]
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(sentences) + "\n")  # lengths differ: generate sorts them for batching
    out = run_cli("predict", bart_translation, "--input", inputs, "--strategy", "beam", "--num-beams", "3").stdout
    rows = [line.split("\t") for line in out.strip().splitlines()[-len(sentences):]]
    assert [r[0] for r in rows] == sentences
    # The tiny model still mixes up the place after "near" now and then: compare the main clause.
    clause = lambda words: words[:words.index("nahe")] if "nahe" in words else words
    right = sum(clause(r[1].split()) == clause([LEXICON[w] for w in s.split()]) for r, s in zip(rows, sentences))
    assert right >= 3, rows


# ---------------------------------------------------------------- T5 translation, a few steps


@pytest.fixture(scope="session")
def t5_translation(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "t5-translation"
    train_recipe(RECIPES / "seq2seq-translation-t5.yaml", run, *FEW_STEPS)
    return run


@pytest.mark.slow
def test_t5_translation_writes_bleu_chrf_and_generated_predictions(t5_translation):
    metrics = metrics_of(t5_translation)
    assert metrics["family"] == "seq2seq" and metrics["main_metric"] == "bleu"
    assert {"bleu", "chrf", "loss"} <= set(metrics["eval"])
    assert all(isinstance(metrics["eval"][k], float) for k in ("bleu", "chrf"))
    rows = read_jsonl(t5_translation / "predictions.jsonl")
    assert len(rows) == 12
    assert all({"input", "reference", "text"} <= set(r) and isinstance(r["text"], str) for r in rows)
    assert rows[0]["reference"] == " ".join(LEXICON[w] for w in rows[0]["input"].split())
    assert (t5_translation / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_t5_lora_trains_only_q_and_v_adapters(t5_translation):
    from hftoolkit.workflows.evaluate import load_trained

    job, _, model, _ = load_trained(t5_translation)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and (".q." in n or ".v." in n) for n in trainable), sorted(trainable)
    expected = lora_parameters(model.config, job.recipe.lora.r)
    assert sum(trainable.values()) == expected == metrics_of(t5_translation)["trainable_params"]


@pytest.mark.slow
def test_eval_scores_the_saved_adapter_again(t5_translation):
    before = metrics_of(t5_translation)["eval"]
    run_cli("eval", t5_translation)
    after = metrics_of(t5_translation)["eval"]
    assert after["bleu"] == pytest.approx(before["bleu"]) and after["chrf"] == pytest.approx(before["chrf"])
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-4)


# ---------------------------------------------------------------- BART summarization and denoising, a few steps


@pytest.mark.slow
def test_bart_summarization_scores_rouge(tmp_path):
    run = tmp_path / "summarization"
    train_recipe(RECIPES / "seq2seq-summarization.yaml", run, *FEW_STEPS)
    metrics = metrics_of(run)
    assert metrics["main_metric"] == "rougeL"
    assert all(0 <= metrics["eval"][k] <= 1 for k in ("rouge1", "rouge2", "rougeL"))
    rows = read_jsonl(run / "predictions.jsonl")
    assert len(rows) == 12 and all(r["input"].startswith(r["reference"]) and "text" in r for r in rows)


@pytest.mark.slow
def test_bart_denoise_reports_perplexity_and_reconstructs_text(tmp_path):
    run = tmp_path / "denoise"
    train_recipe(RECIPES / "seq2seq-denoise.yaml", run, *FEW_STEPS)
    metrics = metrics_of(run)
    assert metrics["main_metric"] == "perplexity" and metrics["greater_is_better"] is False
    assert metrics["eval"]["perplexity"] == pytest.approx(math.exp(metrics["eval"]["loss"]))
    assert metrics["eval"]["perplexity"] < tiny_config("bart").vocab_size, "better than a uniform guess"
    rows = read_jsonl(run / "predictions.jsonl")
    assert len(rows) == 12 and all(isinstance(r["text"], str) for r in rows)
    out = run_cli("predict", run, "--input", "the big dog <mask> a cat near the river.").stdout
    assert out.rstrip("\n").splitlines()[-1].split("\t")[0] == "the big dog <mask> a cat near the river."


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_label_smoothing_collator_shifts_labels_as_the_model_would(arch):
    """With label smoothing the Trainer hides the labels from the model, so the collator makes decoder inputs."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.sources.tiny import ensure_tiny

    job = resolve_job(load_recipe(RECIPES / f"seq2seq-translation-{arch}.yaml", ["training.label_smoothing=0.1"]),
                      data=False)
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny(arch))
    features = [{"input_ids": tokenizer(s)["input_ids"], "labels": tokenizer(text_target=t)["input_ids"]}
                for s, t in (("a cat", "ein katze"), ("the big dog sees a bird", "de gross hund sieht ein vogel"))]
    batch = formulation(job).collator(job, tokenizer)(features)
    model = AutoModelForSeq2SeqLM.from_pretrained(ensure_tiny(arch))
    expected = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    assert batch["decoder_input_ids"].tolist() == expected.tolist()
    assert (batch["labels"][0] == -100).any(), "label padding is ignored by the loss"


# ---------------------------------------------------------------- quantized LoRA on CPU


@pytest.mark.slow
@needs("bitsandbytes")
@pytest.mark.parametrize("arch", ["t5", "bart"])
@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_quantized_lora_trains_a_few_steps(arch, bits, tmp_path):
    run = tmp_path / f"{arch}-{bits}"
    train_recipe(RECIPES / f"seq2seq-translation-{arch}.yaml", run, f"model.quantization={bits}",
                 "training.max_steps=3", "data.max_train_samples=48", "data.max_eval_samples=4")
    metrics = metrics_of(run)
    assert metrics["quantization"] == bits
    assert math.isfinite(metrics["eval"]["loss"]) and "bleu" in metrics["eval"]
    assert metrics["trainable_params"] == lora_parameters(tiny_config(arch), 64)
    losses = [s["loss"] for s in read_jsonl(run / "log_history.jsonl") if "loss" in s]
    assert losses and all(math.isfinite(x) for x in losses)


# ---------------------------------------------------------------- validation and data errors


def test_denoise_with_a_t5_checkpoint_fails_validation():
    result = run_cli("validate", RECIPES / "seq2seq-denoise.yaml", "--set", "model.checkpoint=init:t5", expect=2)
    assert "'denoise'" in plain(result.output) and "use a bart checkpoint" in plain(result.output)


def test_t5_in_fp16_fails_validation_naming_bf16_and_fp32():
    result = run_cli("validate", RECIPES / "seq2seq-translation-t5.yaml", "--set", "training.precision=fp16",
                     expect=2)
    text = plain(result.output)
    assert "fp16" in text and "bf16" in text and "fp32" in text


def test_aligned_files_of_different_lengths_fail_naming_both(tmp_path):
    source, target = tmp_path / "train.en.txt", tmp_path / "train.de.txt"
    source.write_text("a cat\na dog\nthe bird\n")
    target.write_text("ein katze\nein hund\n")
    result = train_recipe(RECIPES / "seq2seq-translation-t5.yaml", tmp_path / "run", f"data.train={source}",
                          f"data.train_target={target}", expect=2)
    text = plain(result.output)
    assert str(source) in text and str(target) in text and "3 lines" in text


def test_shipped_seq2seq_recipes_validate_and_open_with_their_command():
    paths = sorted(RECIPES.glob("seq2seq-*.yaml")) + [RECIPES / "t5-wmt16.yaml"]
    assert len(paths) == 5
    run_cli("validate", *paths)
    for path in paths:
        assert path.read_text().splitlines()[0] == f"# hftoolkit train recipes/{path.name}"


# ---------------------------------------------------------------- BART noising


MASK, BOS, EOS = 4, 0, 2


def noised_runs(n: int, samples: int, seed: int = 0):
    """Noise `samples` bodies of n distinct ids (no sentence ends): (masked tokens, masks) per sample."""
    body = list(range(10, 10 + n))
    out = []
    for i in range(samples):
        noised = noising.noise([BOS, *body, EOS], {BOS, EOS, MASK}, MASK, lambda t: False,
                               np.random.default_rng([seed, i]))
        assert noised[0] == BOS and noised[-1] == EOS, "special tokens stay in place"
        kept = [t for t in noised[1:-1] if t != MASK]
        assert kept == sorted(kept), "without sentence ends the kept tokens keep their order"
        out.append((n - len(kept), noised.count(MASK)))
    return out


def test_text_infilling_masks_30_percent_in_spans_of_mean_length_3():
    runs = noised_runs(n=300, samples=200)
    masked = sum(m for m, _ in runs)
    spans = sum(s for _, s in runs)
    assert masked / (300 * 200) == pytest.approx(noising.MASK_RATIO, abs=0.005)
    # One mask token per span: masked tokens / mask tokens is the mean span length, Poisson(3) counting the
    # zero-length spans (inserted masks) and the last span of each text, trimmed to the budget.
    assert 2.7 < masked / spans < 3.3, masked / spans


def test_short_texts_are_masked_at_30_percent_on_average():
    runs = noised_runs(n=7, samples=3000)
    assert sum(m for m, _ in runs) / (7 * 3000) == pytest.approx(noising.MASK_RATIO, abs=0.01)


def test_zero_length_spans_insert_a_mask_without_removing_tokens():
    rng = np.random.default_rng(0)
    spans = [s for _ in range(300) for s in noising.infill_spans(200, rng)]
    zero = [s for s in spans if s[1] == 0]
    # Poisson(3) gives 0 with probability e^-3 (5%); the trimmed last spans are never 0.
    assert len(zero) / len(spans) == pytest.approx(math.exp(-3), abs=0.02)
    tokens = list(range(10, 20))
    assert noising.apply_spans(tokens, [(3, 0)], MASK) == [10, 11, 12, MASK, 13, 14, 15, 16, 17, 18, 19]
    assert noising.apply_spans(tokens, [(2, 3), (5, 2)], MASK) == [10, 11, MASK, MASK, 17, 18, 19]


def test_sentence_permutation_moves_whole_sentences():
    end = 99
    sentences = [[1, 2, end], [3, end], [4, 5, 6, end], [7]]  # the last one has no full stop
    orders = set()
    for seed in range(30):
        out = noising.permute_sentences([t for s in sentences for t in s], lambda t: t == end,
                                        np.random.default_rng(seed))
        pieces, current = [], []
        for t in out:
            current.append(t)
            if t == end or t == 7:
                pieces.append(current)
                current = []
        assert sorted(pieces) == sorted(sentences), out
        orders.add(tuple(out))
    assert len(orders) > 10


def test_denoise_preprocessing_keeps_special_tokens_and_is_seeded():
    import dataclasses

    import datasets
    from transformers import AutoTokenizer

    from hftoolkit.config.recipe import load_recipe, replaced
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import seq2seq
    from hftoolkit.sources.builtin import text
    from hftoolkit.sources.tiny import ensure_tiny

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny("bart"))
    rows = datasets.Dataset.from_list([{"text": r["text"] + " a cat <mask> the dog."} for r in text(100)])
    job = resolve_job(load_recipe(RECIPES / "seq2seq-denoise.yaml"), data=False)
    denoise = seq2seq.FORMULATIONS["denoise"]
    encoded = denoise.preprocess(job, tokenizer, rows)
    mask, special = tokenizer.mask_token_id, set(tokenizer.all_special_ids)
    for row, source in zip(encoded, rows["text"]):
        ids, labels = row["input_ids"], row["labels"]
        assert labels == tokenizer(source)["input_ids"], "the label is the clean text"
        assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id and row["length"] == len(ids)
        assert labels.count(mask) == 1 and ids.count(mask) >= 1, "a <mask> typed in the text is never masked away"
        kept = [t for t in ids if t not in special]
        assert all(kept.count(t) <= labels.count(t) for t in set(kept)), "noise only moves and removes tokens"
    assert encoded["input_ids"] == denoise.preprocess(job, tokenizer, rows)["input_ids"], "seeded"
    reseeded = dataclasses.replace(job, recipe=replaced(job.recipe, {"training.seed": 1}))
    assert encoded["input_ids"] != denoise.preprocess(reseeded, tokenizer, rows)["input_ids"]


@pytest.mark.slow
def test_beam_search_returns_the_best_scoring_beam(bart_translation):
    """The text `generate` gives for strategy beam is the beam that model.generate scores highest."""
    import dataclasses

    import torch

    from hftoolkit.config.recipe import replaced
    from hftoolkit.models.families import decoding_options
    from hftoolkit.workflows.evaluate import load_trained

    job, form, model, tokenizer = load_trained(bart_translation)
    job = dataclasses.replace(job, recipe=replaced(job.recipe, {
        "eval.generation.strategy": "beam", "eval.generation.num_beams": 4, "eval.generation.length_penalty": 1.0,
        "eval.generation.max_new_tokens": 16}))
    sources = ["the cat sees a dog", "a small bird likes the old man near the river"]
    chosen = [o["text"] for o in form.generate(job, model, tokenizer, sources)]
    for source, text in zip(sources, chosen):
        batch = tokenizer([source], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**batch, **decoding_options(job), num_return_sequences=4,
                                 output_scores=True, return_dict_in_generate=True)
        best = int(out.sequences_scores.argmax())  # beams come back ranked; take the top score explicitly
        assert tokenizer.decode(out.sequences[best], skip_special_tokens=True).strip() == text
