"""Output and security: what the toolkit loads, what it runs, what it writes, and what it never overwrites.

- torch.load only with weights_only=True, no pickle, YAML only through safe_load (read from the source);
- a YAML tag that would run code is refused and does not run;
- trust_remote_code stays off unless the recipe sets it with a pinned revision;
- weights are written only as safetensors, and every other binary state in a run loads with weights_only=True;
- a non-empty run directory survives a refused command; --overwrite replaces it;
- no secret (a hub token, a database password) in any file a train or a search writes, nor in train.log, the run
  lock or a search worker's log: masked as `***` (base/secrets.py; the rule itself: tests/unit/base/test_secrets.py).
"""

from __future__ import annotations

import ast
import json

import pytest

from hftoolkit.config.recipe import RecipeError, load_recipe
from tests.helpers import RECIPES, ROOT, plain, run_cli, train_recipe

RECIPE = RECIPES / "encoder-classification.yaml"
SOURCES = sorted((ROOT / "hftoolkit").rglob("*.py"))


def _calls(attribute: str):
    """(file:line, call) for every call of `<something>.<attribute>(...)` in the package."""
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attribute:
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node


def _receiver(call: ast.Call) -> str:
    return ast.unparse(call.func.value)


@pytest.mark.slow
def test_the_source_scan_sees_the_package():
    assert len(SOURCES) > 20 and any(_receiver(c) == "yaml" for _, c in _calls("safe_load"))


@pytest.mark.slow
def test_torch_load_is_only_called_with_weights_only_true():
    unsafe = [where for where, call in _calls("load") if _receiver(call) == "torch"
              and not any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                          for k in call.keywords)]
    assert unsafe == [], f"torch.load without weights_only=True at {unsafe}"
    pickles = [where for name in ("load", "loads", "Unpickler") for where, call in _calls(name)
               if _receiver(call) in ("pickle", "cPickle", "dill", "joblib")]
    assert pickles == []


@pytest.mark.slow
def test_yaml_is_only_read_through_safe_load():
    unsafe = [where for name in ("load", "load_all", "full_load", "full_load_all", "unsafe_load", "unsafe_load_all")
              for where, call in _calls(name) if _receiver(call) == "yaml"]
    assert unsafe == [], f"yaml read without safe_load at {unsafe}"
    loaders = [f"{p.relative_to(ROOT)}" for p in SOURCES
               if any(name in p.read_text() for name in ("yaml.Loader", "UnsafeLoader", "FullLoader", "yaml.CLoader"))]
    assert loaders == []


@pytest.mark.slow
def test_trust_remote_code_is_never_switched_on_in_the_source():
    literal = [where for name in ("from_pretrained", "from_config") for where, call in _calls(name)
               for k in call.keywords if k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant)
               and k.value.value is True]
    assert literal == []


def test_a_yaml_tag_that_would_run_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    for tag in ("!!python/object/apply:os.system", "!!python/object/new:os.system"):
        recipe = tmp_path / "evil.yaml"
        recipe.write_text(RECIPE.read_text().replace("name: encoder-classification",
                                                     f"name: {tag} ['touch {marker}']"))
        with pytest.raises(RecipeError, match="YAML syntax error"):
            load_recipe(recipe)
        result = run_cli("train", recipe, "--set", f"name={tag} ['touch {marker}']", "--output", tmp_path / "run",
                         expect=2)
        assert "YAML syntax error" in plain(result.output)
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_remote_code_needs_a_pinned_revision_and_is_off_by_default():
    assert load_recipe(RECIPE).model.trust_remote_code is False
    with pytest.raises(RecipeError, match="set model.revision to a pinned commit"):
        load_recipe(RECIPE, ["model.trust_remote_code=true"])
    pinned = load_recipe(RECIPE, ["model.trust_remote_code=true", "model.revision=0123abcd"])
    assert pinned.model.trust_remote_code and pinned.model.revision == "0123abcd"


@pytest.fixture(scope="session")
def checkpointed_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("security") / "run"
    train_recipe(RECIPE, run, "data.max_train_samples=16", "data.max_eval_samples=8", "training.batch_size=8",
                 "training.max_steps=2", "training.save_steps=1", "eval.max_predictions=2")
    return run


def test_weights_are_safetensors_and_every_other_state_loads_with_weights_only(checkpointed_run):
    import torch
    from safetensors.torch import load_file

    files = [p for p in checkpointed_run.rglob("*") if p.is_file()]
    assert len(list(checkpointed_run.glob("checkpoints/checkpoint-*"))) == 2
    weights = [p for p in files if p.suffix == ".safetensors"]
    assert {p.parent.name for p in weights} == {"adapter", "checkpoint-1", "checkpoint-2"}
    assert all(load_file(p) for p in weights)
    binary = [p for p in files if p.suffix not in (".safetensors", ".json", ".jsonl", ".yaml", ".md", ".txt", ".log")]
    assert binary and {p.suffix for p in binary} <= {".pt", ".pth"}, sorted(map(str, binary))
    from transformers.trainer_pt_utils import safe_globals  # numpy arrays (the RNG state), as the Trainer allows

    for path in binary:  # optimizer, scheduler and RNG states: tensors, arrays and plain values, no pickled objects
        with safe_globals():
            torch.load(path, weights_only=True)
    assert not list(checkpointed_run.rglob("training_args.bin")), "the pickled TrainingArguments are not kept"


def test_a_refused_run_leaves_the_existing_run_directory_alone(checkpointed_run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(checkpointed_run, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    result = run_cli("train", RECIPE, "--output", copy, expect=2)
    assert "is not empty: pass --overwrite to replace it, --resume to continue it" in plain(result.output)
    result = run_cli("train", RECIPE, "--output", copy, "--overwrite", "--set", "training.batch_size=0", expect=2)
    assert "training.batch_size" in plain(result.output)
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_overwrite_replaces_the_run_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "old-notes.txt").write_text("from an earlier run")
    sets = ("data.max_train_samples=16", "data.max_eval_samples=8", "training.batch_size=8", "training.max_steps=1",
            "eval.max_predictions=0")
    run_cli("train", RECIPE, "--output", run, "--overwrite", *[x for s in sets for x in ("--set", s)])
    assert not (run / "old-notes.txt").exists()
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"


# ---------------------------------------------------------------- no secret in anything hftoolkit writes

TOKEN = "hf_" + "Secr3tT0ken" * 3
PASSWORD = "pg-Pa55word-9"  # a database's, in a storage URL and in PGPASSWORD
SECRETS = (TOKEN, PASSWORD)
SHORT = ("data.max_train_samples=16", "data.max_eval_samples=8", "training.batch_size=8", "training.max_steps=2",
         "eval.max_predictions=8")


def secrets_in(folder) -> list[str]:
    """`file: secret` for every file under `folder`, text or binary (SQLite, safetensors, PNG), that holds a secret's
    bytes."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    assert files
    return [f"{p.relative_to(folder)}: {s}" for p in files for s in SECRETS if s.encode() in p.read_bytes()]


def test_no_secret_in_any_file_a_train_writes(tmp_path, monkeypatch):
    """A hub token and a database password in the environment, on the command line (a recipe value set there) and in
    the training data: neither is in any file of the run directory, while manifest.json's command shows `***` where
    they were, and the masked recipe.yaml still loads."""
    import sys

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f"{'great' if i % 2 else 'awful'} film {i}, my token is {TOKEN} and my "
                                             f"password {PASSWORD},{'positive' if i % 2 else 'negative'}\n"
                                             for i in range(24)))
    run = tmp_path / "run"
    args = ["train", str(RECIPE), "--output", str(run), "--set", f"data.train={data}",
            "--set", f"description=reviews from postgresql://me:{PASSWORD}@db/reviews, pushed with --hub-token {TOKEN}",
            *[x for s in SHORT for x in ("--set", s)]]
    monkeypatch.setattr(sys, "argv", ["hftoolkit", *args])  # (the command line as typed, which manifest.json records)
    run_cli(*args)

    assert secrets_in(run) == []
    command = json.loads((run / "manifest.json").read_text())["command"]
    assert "postgresql://me:***@db/reviews, pushed with --hub-token ***" in command, command
    assert load_recipe(run / "recipe.yaml").description == "reviews from postgresql://me:***@db/reviews, pushed with " \
                                                           "--hub-token ***"
    assert "my token is *** and my password ***" in (run / "predictions.jsonl").read_text()
    assert (run / "train.log").is_file()


@pytest.mark.slow
def test_no_secret_in_any_file_a_search_writes(tmp_path):
    """A search whose command line names a storage URL with a password: its trials' manifests, the study (SQLite),
    study.json, best.yaml, the plots and the report hold no password, and the manifests show `me:***@`. The search
    runs in SQLite, in process: a PostgreSQL URL is refused before anything is written (not reachable here), and
    that refusal hides the password too."""
    from hftoolkit.sweeps.search import search

    url = f"postgresql://me:{PASSWORD}@127.0.0.1:1/studies"
    refused = run_cli("sweep", RECIPE, "--search", "--param", "lora.r=int:2:8", "--storage", url,
                      "--out", tmp_path / "refused", expect=2)
    assert PASSWORD not in refused.output and "postgresql://me:***@127.0.0.1:1/studies" in plain(refused.output)
    assert not (tmp_path / "refused").exists()

    params = ["training.learning_rate=float:1e-4:5e-2:log", "lora.r=int:2:8"]
    command = ["hftoolkit", "sweep", str(RECIPE), "--search", "--storage", url, "--trials", "1",
               *[x for p in params for x in ("--param", p)]]
    said = []
    search(RECIPE, params, list(SHORT), tmp_path, trials=1, pruner="none", command=command, echo=said.append)
    folder = tmp_path / "encoder-classification"
    assert (folder / "study.db").is_file() and (folder / "study.json").is_file() and (folder / "report.md").is_file()
    assert secrets_in(folder) == []
    assert "--storage postgresql://me:***@127.0.0.1:1/studies" in json.loads(
        (folder / "trial-000" / "manifest.json").read_text())["command"]
    assert not [line for line in said if PASSWORD in line]


def test_the_log_the_lock_and_a_worker_s_log_are_written_with_secrets_masked(tmp_path, monkeypatch):
    """train.log (the toolkit's lines, a library's log and print, the launcher's log appended), the run lock's record
    of the command, a search worker's log (a subprocess's output, copied line by line), and the recipe comparison of
    --resume, which reads the masked recipe.yaml."""
    import logging
    import subprocess
    import sys

    from hftoolkit.base import console
    from hftoolkit.runs.rundir import RunDirectory
    from hftoolkit.sweeps.search import copy_redacted
    from hftoolkit.training.checkpoints import changed_keys
    from hftoolkit.training.relaunch import _keep_log

    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    with console.capture(run / "train.log"):
        console.phase(f"data loaded from https://user:{PASSWORD}@example.com/data.csv")
        logging.getLogger("transformers").warning("token=%s", TOKEN)
        print(f"the library says {TOKEN}")
    launcher = tmp_path / "launcher.log"
    launcher.write_text(f"torchrun: PGPASSWORD is {PASSWORD}\n")
    _keep_log(launcher, run.path)
    log = (run / "train.log").read_text()
    assert "the library says ***" in log and "https://user:***@example.com" in log and "PGPASSWORD is ***" in log

    with run.held("train", f"hftoolkit train r.yaml --hub-token {TOKEN}"):
        assert TOKEN.encode() not in (run / "run.lock").read_bytes()
        assert RunDirectory(run.path).holder()["command"] == "hftoolkit train r.yaml --hub-token ***"

    worker = subprocess.Popen([sys.executable, "-c", f"import sys; print('joining postgresql://me:{PASSWORD}@db/s'); "
                                                     f"sys.stderr.write('--hub-token={TOKEN}\\n')"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    copy_redacted(worker.stdout, run / "worker-0.log")
    assert worker.wait() == 0
    assert sorted((run / "worker-0.log").read_text().splitlines()) == ["--hub-token=***",
                                                                       "joining postgresql://me:***@db/s"]
    assert secrets_in(run.path) == []

    recipe = f"name: r\ndescription: {TOKEN}\ndata:\n  train: https://me:{PASSWORD}@h/d.csv\n"
    run.write_text("recipe.yaml", recipe)
    assert changed_keys((run / "recipe.yaml").read_text(), recipe) == []  # (resume and a sweep's rerun go on)
    assert changed_keys((run / "recipe.yaml").read_text(), recipe.replace("d.csv", "e.csv")) == ["data.train"]
