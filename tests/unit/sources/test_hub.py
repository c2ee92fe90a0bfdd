"""Hub ids offline: caches planted as an online run leaves them, loaded by the libraries themselves; the one-line
errors of hftoolkit.sources.hub; the doctor rows; the shipped regression metrics."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import RECIPES, hub_cache

MIRROR = "https://hf-mirror.example.org"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port on loopback: the connection is refused at once


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """One HF_HOME for the module: the MiniLM model and four hub data sets, planted once."""
    home = tmp_path_factory.mktemp("hf-home")
    sha = hub_cache.plant_model(home / "hub", hub_cache.MINILM_ID, hub_cache.minilm_folder())
    shas = {
        "nyu-mll/glue": hub_cache.plant_dataset(home / "hub", home / "datasets", "nyu-mll/glue",
                                                {"mnli": hub_cache.glue_mnli(), "stsb": hub_cache.glue_stsb()}),
        "wmt16": hub_cache.plant_dataset(home / "hub", home / "datasets", "wmt16", {"de-en": hub_cache.wmt16_de_en()}),
        "eriktks/conll2003": hub_cache.plant_dataset(home / "hub", home / "datasets", "eriktks/conll2003",
                                                     {"conll2003": hub_cache.conll2003()}),
    }
    return home, sha, shas


@pytest.fixture
def hf_home(planted, monkeypatch):
    """The planted HF_HOME, offline, for this test (environment and library constants restored afterwards)."""
    home, _, _ = planted
    hub_cache.use_hf_home(monkeypatch, home)
    return home


# ---------------------------------------------------------------- models


@pytest.mark.parametrize("how", ["main", "revision", "mirror"])
def test_planted_model_loads_offline_like_a_cached_download(planted, monkeypatch, how):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils.hub import cached_file

    home, sha, _ = planted
    hub_cache.use_hf_home(monkeypatch, home, endpoint=MIRROR if how == "mirror" else None)
    revision = sha if how == "revision" else None
    config = AutoConfig.from_pretrained(hub_cache.MINILM_ID, revision=revision)
    tokenizer = AutoTokenizer.from_pretrained(hub_cache.MINILM_ID, revision=revision)
    model = AutoModelForSequenceClassification.from_pretrained(hub_cache.MINILM_ID, revision=revision, num_labels=3)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("bert", 6, 384)
    assert tokenizer("hello world")["input_ids"] == [101, 7592, 2088, 102]
    # The pretrained encoder weights, not a random initialisation, and read through the planted snapshot.
    shipped = load_file(hub_cache.minilm_folder() / "model.safetensors")
    loaded = model.bert.embeddings.word_embeddings.weight.detach()
    assert loaded.equal(shipped["embeddings.word_embeddings.weight"])
    snapshot = home / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / sha
    assert cached_file(hub_cache.MINILM_ID, "config.json", revision=revision) == str(snapshot / "config.json")


def test_planted_entry_has_the_hub_cache_layout(planted):
    home, sha, _ = planted
    repo = home / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2"
    assert (repo / "refs" / "main").read_text() == sha
    weights = repo / "snapshots" / sha / "model.safetensors"
    config = repo / "snapshots" / sha / "config.json"
    assert weights.is_symlink() and not weights.readlink().is_absolute()
    assert len(weights.resolve().name) == 64  # LFS file: its sha256
    assert len(config.resolve().name) == 40  # plain git file: its blob sha1
    from huggingface_hub.utils.sha import git_hash

    assert config.resolve().name == git_hash(config.read_bytes())
    # huggingface_hub's own cache scanner reads the entry as a complete download of one revision.
    from huggingface_hub import scan_cache_dir

    info = {r.repo_id: r for r in scan_cache_dir(home / "hub").repos}[hub_cache.MINILM_ID]
    assert [r.commit_hash for r in info.revisions] == [sha] and info.repo_type == "model"
    assert {f.file_name for f in next(iter(info.revisions)).files} >= {"model.safetensors", "tokenizer.json"}


@pytest.mark.parametrize("loader", ["AutoConfig", "AutoTokenizer", "AutoModelForSequenceClassification"])
def test_model_missing_from_the_cache_offline_is_one_line(hf_home, loader):
    import transformers

    from hftoolkit.sources import hub

    with pytest.raises(OSError) as info:
        getattr(transformers, loader).from_pretrained("hftoolkit-test/not-cached")
    err = hub.explain(info.value, "model.checkpoint", "hftoolkit-test/not-cached", "model")
    assert err is not None
    message = err.format_message()
    assert "\n" not in message
    assert message.startswith("model.checkpoint: hub model hftoolkit-test/not-cached is not in the cache (")
    assert str(hf_home / "hub") in message
    assert "HF_HUB_OFFLINE" in message and "run once online" in message and "local folder" in message


def test_revision_missing_from_the_cache_names_the_revision(hf_home):
    from transformers import AutoConfig

    from hftoolkit.sources import hub

    with pytest.raises(OSError) as info:
        AutoConfig.from_pretrained(hub_cache.MINILM_ID, revision="v9.9")
    message = hub.explain(info.value, "model.checkpoint", hub_cache.MINILM_ID, "model",
                          revision="v9.9").format_message()
    assert f"hub model {hub_cache.MINILM_ID} at revision v9.9 is not in the cache" in message


def test_online_with_an_unreachable_mirror_uses_the_cache_and_explains_what_is_missing(planted, monkeypatch):
    from types import SimpleNamespace

    from huggingface_hub.utils import _http
    from transformers import AutoConfig

    from hftoolkit.sources import hub

    home, _, _ = planted
    hub_cache.use_hf_home(monkeypatch, home, endpoint=UNREACHABLE, offline=False)
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=lambda seconds: None))  # retries without the backoff
    assert AutoConfig.from_pretrained(hub_cache.MINILM_ID).hidden_size == 384  # cached: served despite no connection
    with pytest.raises(OSError) as info:
        AutoConfig.from_pretrained("hftoolkit-test/not-cached")
    message = hub.explain(info.value, "model.checkpoint", "hftoolkit-test/not-cached", "model").format_message()
    assert f"could not be fetched from {UNREACHABLE} (no connection)" in message
    assert "HF_ENDPOINT" in message


def _http_error(cls, status: int, **kwargs):
    import httpx2  # the HTTP client huggingface_hub 2 uses

    response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/models/a/b"))
    return cls(f"{status} Client Error", response=response, **kwargs)


@pytest.mark.parametrize("error,expected", [
    ("RepositoryNotFoundError", "hub model org/private-model was not found at https://huggingface.co: check the id"),
    ("GatedRepoError", "hub model org/private-model is gated: accept its conditions at "
                       "https://huggingface.co/org/private-model and set HF_TOKEN"),
    ("RevisionNotFoundError", "hub model org/private-model at revision v2: the revision does not exist"),
])
def test_online_hub_errors_wrapped_by_transformers_are_one_line(hf_home, error, expected):
    import huggingface_hub.errors

    from hftoolkit.sources import hub

    try:  # transformers raises OSError from the hub error (transformers/utils/hub.py, cached_files)
        try:
            raise _http_error(getattr(huggingface_hub.errors, error), 404 if error != "GatedRepoError" else 401)
        except Exception as cause:
            raise OSError("org/private-model is not a local folder and is not a valid model identifier") from cause
    except OSError as err:
        message = hub.explain(err, "model.checkpoint", "org/private-model", "model",
                              revision="v2" if error == "RevisionNotFoundError" else None).format_message()
    assert message.startswith("model.checkpoint: " + expected), message
    if error != "RevisionNotFoundError":
        assert "HF_TOKEN" in message


def test_errors_that_are_not_hub_problems_are_left_alone():
    from hftoolkit.sources import hub

    assert hub.explain(RuntimeError("CUDA out of memory"), "model.checkpoint", "a/b", "model") is None
    assert hub.explain(ValueError("Unrecognized model in a/b"), "model.checkpoint", "a/b", "model") is None
    with pytest.raises(KeyError), hub.explained("model.checkpoint", "a/b", "model"):
        raise KeyError("classifier.weight")


# ---------------------------------------------------------------- data sets


def test_glue_mnli_loads_offline_with_its_named_splits(hf_home, planted):
    import datasets

    ds = datasets.load_dataset("nyu-mll/glue", "mnli", split="validation_matched")
    assert len(ds) == 6 and ds[0]["premise"].startswith("matched premise 0")
    assert ds.features["label"].names == ["entailment", "neutral", "contradiction"]
    sha = planted[2]["nyu-mll/glue"]
    assert len(datasets.load_dataset("nyu-mll/glue", "mnli", split="validation_mismatched", revision=sha)) == 6
    stsb = datasets.load_dataset("nyu-mll/glue", "stsb", split="train")
    assert stsb.features["label"].dtype == "float32" and stsb[-1]["label"] == pytest.approx(5.0)


def test_nested_and_sequence_columns_survive_the_cache(hf_home):
    import datasets

    wmt = datasets.load_dataset("wmt16", "de-en", split="validation")
    assert wmt[1]["translation"] == {"de": "Das ist Satz Nummer 1.", "en": "This is sentence number 1."}
    assert wmt.flatten()["translation.de"][:2] == ["Das ist Satz Nummer 0.", "Das ist Satz Nummer 1."]
    conll = datasets.load_dataset("eriktks/conll2003", "conll2003", split="train")
    assert conll[0]["tokens"][:2] == ["John", "Smith"]
    assert conll.features["ner_tags"].feature.names[conll[0]["ner_tags"][0]] == "B-PER"


def _dataset_error(repo_id, config=None, split="train"):
    import datasets

    with pytest.raises(Exception) as info:
        datasets.load_dataset(repo_id, config, split=split)
    return info.value


@pytest.mark.parametrize("args,expected", [
    (("nyu-mll/glue", "qqp"), "data.train: hub data set nyu-mll/glue (config qqp) has no config 'qqp' in the cache; "
                              "cached configs: mnli, stsb: name one of them, or run once online to cache that config"),
    (("nyu-mll/glue", None), "data.train: hub data set nyu-mll/glue has several configs in the cache (mnli, stsb): "
                             "name one of them"),
    (("nyu-mll/glue", "mnli", "validation"), "data.train: hub data set nyu-mll/glue (config mnli) has no split "
                                             "'validation'; its splits: train, validation_matched, "
                                             "validation_mismatched: use one of them"),
], ids=["config", "no-config", "split"])
def test_wrong_config_or_split_lists_what_exists(hf_home, args, expected):
    from hftoolkit.sources import hub

    err = _dataset_error(*args)
    assert hub.explain(err, "data.train", args[0], "dataset", config=args[1]).format_message() == expected


def test_dataset_missing_from_the_cache_offline_is_one_line(hf_home):
    import datasets

    from hftoolkit.base.errors import UserError
    from hftoolkit.sources import hub

    with pytest.raises(UserError) as info, hub.explained("data.train", "hftoolkit-test/not-cached", "dataset"):
        datasets.load_dataset("hftoolkit-test/not-cached", split="train")
    message = info.value.format_message()
    assert message.startswith("data.train: hub data set hftoolkit-test/not-cached is not in the cache (")
    assert str(hf_home / "datasets") in message and "run once online" in message and "a local file" in message


def test_online_dataset_errors_are_one_line():
    from datasets.exceptions import DatasetNotFoundError

    from hftoolkit.sources import hub

    gone = DatasetNotFoundError("Dataset 'org/gone' doesn't exist on the Hub or cannot be accessed.")
    assert "was not found at" in hub.explain(gone, "data.eval", "org/gone", "dataset").format_message()
    gated = DatasetNotFoundError("Dataset 'org/gated' is a gated dataset on the Hub. You must be authenticated.")
    message = hub.explain(gated, "data.eval", "org/gated", "dataset").format_message()
    assert "is gated: accept its conditions at https://huggingface.co/datasets/org/gated" in message
    script = RuntimeError("Dataset scripts are no longer supported, but found glue.py")
    assert "Python script" in hub.explain(script, "data.train", "glue", "dataset").format_message()
    unknown = ValueError("BuilderConfig 'qqq' not found. Available: ['ax', 'cola', 'mnli']")
    assert hub.explain(unknown, "data.train", "nyu-mll/glue", "dataset").format_message().endswith(
        "has no config 'qqq'; its configs: ax, cola, mnli: name one of them")


# ---------------------------------------------------------------- doctor rows and lightness


def test_cache_report_sizes_blobs_once_and_never_shows_the_token(hf_home, monkeypatch):
    from hftoolkit.sources import hub

    rows = dict(hub.cache_report())
    blob = (hub_cache.minilm_folder() / "model.safetensors").stat().st_size
    size_mib = float(rows["hub cache"].split("(")[1].split(" MiB")[0])
    assert rows["hub cache"].startswith(str(hf_home / "hub"))
    assert blob / 2**20 < size_mib < 1.5 * blob / 2**20  # symlinked snapshots are not counted a second time
    assert rows["datasets cache"] == str(hf_home / "datasets")
    assert rows["hub endpoint"] == "https://huggingface.co" and rows["hub offline"].startswith("yes")
    assert rows["hub token"] == "not set"
    (hf_home / "token").write_text("hf_secretfromfile")
    try:
        assert dict(hub.cache_report())["hub token"] == "set (token file)"
    finally:
        (hf_home / "token").unlink()
    monkeypatch.setenv("HF_TOKEN", "hf_secretfromenv")
    text = repr(hub.cache_report())
    assert "set (HF_TOKEN)" in text and "secret" not in text
    hub_cache.use_hf_home(monkeypatch, hf_home, endpoint=MIRROR)
    assert dict(hub.cache_report())["hub endpoint"] == f"{MIRROR} (HF_ENDPOINT)"


def test_hub_module_is_light():
    # A real process: what importing and using the module pulls in is what is under test.
    code = ("import sys, time\nt = time.perf_counter()\nfrom hftoolkit.sources import hub\nhub.cache_report()\n"
            "hub.explain(OSError('x'), 'model.checkpoint', 'a/b', 'model')\n"
            "print('SECONDS', time.perf_counter() - t)\n"
            "print('HEAVY', [m for m in ('torch', 'transformers', 'datasets', 'httpx2') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


# ---------------------------------------------------------------- regression metrics


@pytest.mark.parametrize("name", ["pearsonr", "spearmanr"])
def test_regression_metrics_load_offline_and_match_scipy(name):
    import scipy.stats

    from hftoolkit.metrics import available, load_metric

    assert name in available()
    predictions = [0.1, 2.3, 1.9, 4.8, 3.2, 0.7]
    references = [0.0, 2.0, 2.5, 5.0, 3.0, 1.5]
    expected = getattr(scipy.stats, name)(references, predictions)[0]
    result = load_metric(name).compute(predictions=predictions, references=references)
    assert result == {name: pytest.approx(expected, abs=1e-12)}
    assert result[name] != pytest.approx(1.0)  # imperfect ranking and fit: a real correlation, not a constant


def test_a_long_hub_read_says_how_much_has_arrived_and_a_quick_one_says_nothing(tmp_path, monkeypatch, capsys):
    import time

    import datasets

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources import data, hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "PROGRESS_AFTER", 0.2)
    monkeypatch.setattr(hub, "PROGRESS_EVERY", 0.2)
    blobs = tmp_path / "hub" / "datasets--someone--reviews" / "blobs"

    def slow_download(*args, **kwargs):  # what load_dataset does to the cache while it downloads
        blobs.mkdir(parents=True, exist_ok=True)
        for part in range(3):
            (blobs / f"part-{part}.incomplete").write_bytes(b"x" * 300_000)
            time.sleep(0.35)
        return datasets.Dataset.from_list([{"text": "good", "label": 1}, {"text": "bad", "label": 0}])

    monkeypatch.setattr(datasets, "load_dataset", slow_download)
    recipe = load_recipe(RECIPES / "encoder-classification.yaml", ["data.train=someone/reviews"])
    assert len(data.read_source(recipe.data.train, "data.train", recipe, split="train")) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "reading someone/reviews from the hub" in line]
    assert said and all(line.endswith("MiB in the cache so far") for line in said)  # up to 3 x 300,000 bytes
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(
        [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]))
    data.read_source(recipe.data.train, "data.train", recipe, split="train")
    assert "from the hub" not in capsys.readouterr().err  # read from the cache at once: nothing said
