"""`eval --benchmark` and eval.benchmarks: lm-evaluation-harness on the model as hftoolkit loads it, offline.

The harness's numbers are checked against what the model itself says: its log-likelihoods of each choice, its
greedy answers as `predict` writes them. Tiny init: checkpoints, a few rows of each shipped task.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hftoolkit.runs.summary import BEST, format_value
from tests.helpers import RECIPES, needs, plain, run_cli, train_recipe

pytestmark = needs("lm_eval")

MC, GEN = "hftoolkit_everyday_mc", "hftoolkit_sums_gen"
DECODER, SEQ2SEQ = RECIPES / "decoder-clm.yaml", RECIPES / "seq2seq-translation-t5.yaml"
SHORT = ("training.max_steps=2", "data.max_train_samples=40", "data.max_eval_samples=8")


def shipped_rows(name: str) -> list[dict]:
    from hftoolkit.evaluation.harness import SHIPPED_TASKS

    return [json.loads(line) for line in (SHIPPED_TASKS / f"{name}.jsonl").read_text().splitlines()]


def samples(run: Path, task: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "benchmark-samples.jsonl").read_text().splitlines()]
    return sorted((r for r in rows if r["task"] == task), key=lambda r: r["doc_id"])


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory) -> Path:
    """A LoRA run of the tiny GPT-2 whose recipe asks for both shipped tasks after training."""
    run = tmp_path_factory.mktemp("bench") / "lora"
    train_recipe(DECODER, run, *SHORT, f"eval.benchmarks.tasks=[{MC},{GEN}]", "eval.benchmarks.limit=5",
                 "eval.benchmarks.num_fewshot=0", "eval.generation.max_new_tokens=8")  # (0-shot: one-line prompts)
    return run


def test_the_shipped_tasks_are_package_data_found_from_any_folder(tmp_path, monkeypatch):
    """A wheel install carries them (pyproject's package-data), and the index finds them wherever the command runs."""
    import fnmatch

    from setuptools.config.pyprojecttoml import read_configuration  # (tomllib is 3.11 on)

    from hftoolkit.evaluation.harness import SHIPPED_TASKS, _index, task_manager

    package = SHIPPED_TASKS.parents[1]
    patterns = read_configuration(package.parent / "pyproject.toml", expand=False)["tool"]["setuptools"][
        "package-data"]
    files = {p.relative_to(package).as_posix() for p in SHIPPED_TASKS.iterdir() if p.is_file()}
    assert {f"evaluation/harness_tasks/{name}" for name in ("everyday_mc.yaml", "everyday_mc.jsonl", "sums_gen.yaml",
                                                            "sums_gen.jsonl", "loader.py")} <= files
    assert [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns["hftoolkit"])] == []
    monkeypatch.chdir(tmp_path)
    _index.cache_clear()
    assert {MC, GEN} <= set(task_manager(None, (MC, GEN)).all_tasks)


def test_the_keys_that_tell_a_harness_task_file_are_the_harness_own_and_no_recipe_key():
    import dataclasses

    from lm_eval.api.group import GroupConfig
    from lm_eval.api.task import TaskConfig

    from hftoolkit.config.recipe import Recipe
    from hftoolkit.evaluation.harness import HARNESS_KEYS

    fields = {f.name for config in (TaskConfig, GroupConfig) for f in dataclasses.fields(config)}
    assert HARNESS_KEYS - {"include"} <= fields  # (include: a file the harness's loader reads in first)
    assert not HARNESS_KEYS & set(Recipe.model_fields)


@pytest.mark.slow
def test_train_with_eval_benchmarks_records_each_task(lora_run):
    metrics = json.loads((lora_run / "metrics.json").read_text())
    assert set(metrics["benchmarks"]) == {MC, GEN}
    mc = metrics["benchmarks"][MC]
    assert mc["metric"] == "acc" and mc["rows"] == 5 and mc["limit"] == 5 and mc["num_fewshot"] == 0
    assert 0.0 <= mc["value"] <= 1.0 and mc["stderr"] is not None and mc["harness_version"]
    assert len(samples(lora_run, MC)) == 5 and len(samples(lora_run, GEN)) == 5
    assert json.loads((lora_run / "manifest.json").read_text())["status"] == "complete"


def _choice_logprobs(model, tokenizer, context: str, choices: list[str], seq2seq: bool) -> list[float]:
    """Sum of log p(choice tokens | context), as the model gives them, one forward pass per choice."""
    import torch

    scores = []
    for choice in choices:
        continuation = " " + choice
        if seq2seq:
            enc = tokenizer(context, return_tensors="pt")
            labels = tokenizer(continuation, add_special_tokens=False, return_tensors="pt").input_ids
            logits = model(**enc, labels=labels).logits[0]
            target = labels[0]
        else:
            whole = tokenizer(context + continuation).input_ids
            n_context = len(tokenizer(context).input_ids)
            ids = torch.tensor([whole])
            logits = model(input_ids=ids).logits[0, n_context - 1:-1]
            target = ids[0, n_context:]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        scores.append(logprobs.gather(1, target[:, None]).sum().item())
    return scores


@pytest.mark.parametrize("recipe,seq2seq", [(DECODER, False), (SEQ2SEQ, True),
                                            pytest.param("smollm2", False, marks=pytest.mark.slow)],
                         ids=["gpt2", "t5", "smollm2"])
@pytest.mark.slow
def test_multiple_choice_accuracy_equals_the_accuracy_from_the_models_loglikelihoods(recipe, seq2seq, tmp_path,
                                                                                      request):
    import torch

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation

    sets = ["data.max_eval_samples=8", "lora.enabled=false"] + (["data.source_prefix="] if seq2seq else [])
    if recipe == "smollm2":  # a llama with SmolLM2's tokenizer (the tiny stand-in)
        recipe = DECODER
        sets += [f"model.checkpoint={request.getfixturevalue('tiny_smollm2')}"]
    base = tmp_path / "base"
    result = run_cli("eval", recipe, "--benchmark", MC, "--limit", "6", "--output", base,
                     *[a for s in sets for a in ("--set", s)])
    record = json.loads((base / "metrics.json").read_text())["benchmarks"][MC]
    assert "benchmarks" in plain(result.output) and MC in result.output
    job = resolve_job(load_recipe(recipe, sets), data=False)
    model, tokenizer = formulation(job).load_model(job)
    model.eval()
    rows, right = shipped_rows("everyday_mc")[:6], 0
    logged = samples(base, MC)
    with torch.no_grad():
        for row, sample in zip(rows, logged):
            scores = _choice_logprobs(model, tokenizer, f"Question: {row['question']}\nAnswer:", row["choices"],
                                      seq2seq)
            harness = [float(r[0][0]) for r in sample["resps"]]
            assert scores == pytest.approx(harness, abs=1e-3)
            right += max(range(len(scores)), key=scores.__getitem__) == row["label"]
    assert record["value"] == pytest.approx(right / len(rows))


@pytest.mark.slow
def test_generation_exact_match_equals_the_one_from_predicts_answers(lora_run, tmp_path):
    rows = shipped_rows("sums_gen")[:5]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Question: {r['question']} Answer:\n" for r in rows))  # the task's prompt
    predicted = run_cli("predict", lora_run, "--input", prompts, "--format", "jsonl").stdout.splitlines()
    answers = [json.loads(line)["text"] for line in predicted]
    harness = [s["resps"][0][0] for s in samples(lora_run, GEN)]
    cut = [re.split("\n|Question:", a)[0] for a in answers]  # the task's stop strings
    assert harness == cut
    first_number = [re.findall(r"-?\d+", c)[:1] for c in cut]
    by_hand = sum(n == [r["answer"]] for n, r in zip(first_number, rows)) / len(rows)
    record = json.loads((lora_run / "metrics.json").read_text())["benchmarks"][GEN]
    assert record["metric"] == "exact_match" and record["value"] == pytest.approx(by_hand)


@pytest.mark.parametrize("recipe,sets,tasks,says", [
    (RECIPES / "encoder-classification.yaml", [], MC, "encoder checkpoint"),
    (DECODER, ["task=classification", "data.train=builtin:sentiment", "data.packing=false"], MC,
     "classification head"),
    pytest.param(DECODER, [], f"{MC},no_such_task", "no task named no_such_task", marks=pytest.mark.slow),
], ids=["encoder", "classification-head", "unknown-task"])
def test_what_the_harness_cant_score_is_refused_in_one_line_before_loading(recipe, sets, tasks, says, tmp_path):
    args = [a for s in sets for a in ("--set", s)]
    result = run_cli("eval", recipe, "--benchmark", tasks, "--output", tmp_path / "base", *args, expect=2)
    assert says in plain(result.output) and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "base").exists()


def test_without_the_harness_benchmark_says_how_to_install_it(monkeypatch):
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name == "lm_eval":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    result = run_cli("eval", DECODER, "--benchmark", MC, expect=2)
    assert "pip install 'hftoolkit[benchmarks]'" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_lora_run_and_its_merged_folder_score_the_same(lora_run, tmp_path):
    merged = tmp_path / "merged"
    run_cli("merge", lora_run, "--output", merged)
    tasks = f"{MC},{GEN}"
    tuned = json.loads(run_cli("eval", lora_run, "--benchmark", tasks, "--limit", "4", "--json").stdout)
    plain_ = json.loads(run_cli("eval", DECODER, "--set", f"model.checkpoint={merged}", "--benchmark", tasks,
                                "--limit", "4", "--json").stdout)
    for task in (MC, GEN):
        assert tuned["benchmarks"][task]["metrics"] == pytest.approx(plain_["benchmarks"][task]["metrics"])
    assert tuned["benchmarks"][MC]["rows"] == 4  # (the run's own eval.benchmarks asked for 5: replaced)


def ai2_arc_easy(n: int = 6) -> tuple:
    """ARC-Easy's columns (question, choices {text, label}, answerKey), n made-up rows a split."""
    import datasets

    features = datasets.Features({"id": datasets.Value("string"), "question": datasets.Value("string"),
                                  "choices": {"text": datasets.Sequence(datasets.Value("string")),
                                              "label": datasets.Sequence(datasets.Value("string"))},
                                  "answerKey": datasets.Value("string")})
    rows = [{"id": f"q{i}", "question": f"Which of these is number {i}?",
             "choices": {"text": [f"number {i}", f"letter {i}", f"colour {i}", f"sound {i}"],
                         "label": ["A", "B", "C", "D"]}, "answerKey": "ABCD"[i % 4]} for i in range(n)]
    return features, {"train": rows, "validation": rows, "test": rows}


@pytest.mark.slow  # (the harness indexes its own thousands of tasks to find arc_easy)
def test_a_hub_task_runs_from_a_planted_data_set_cache_with_limit(monkeypatch, tmp_path):
    from tests.helpers import hub_cache

    home = tmp_path / "hf"
    hub_cache.plant_dataset(home / "hub", home / "datasets", "allenai/ai2_arc", {"ARC-Easy": ai2_arc_easy()},
                            default="ARC-Easy")
    hub_cache.use_hf_home(monkeypatch, home)
    base = tmp_path / "base"
    run_cli("eval", DECODER, "--benchmark", "arc_easy", "--limit", "3", "--output", base,
            "--set", "data.max_eval_samples=8")
    record = json.loads((base / "metrics.json").read_text())["benchmarks"]["arc_easy"]
    assert record["rows"] == 3 and record["metric"] == "acc" and record["limit"] == 3
    logged = samples(base, "arc_easy")
    assert [s["doc"]["question"] for s in logged] == [f"Which of these is number {i}?" for i in range(3)]


SLOW_TASK = """task: slow_to_load
custom_dataset: !function loader.load
output_type: multiple_choice
test_split: test
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list:
  - metric: acc
"""
SLOW_LOADER = """import pathlib, time
def load(**_):
    pathlib.Path(__file__).with_name("loading").write_text("now")
    time.sleep(120)
"""


@pytest.mark.slow  # a real process, killed
def test_a_run_killed_during_its_benchmarks_keeps_its_weights_and_eval_completes_it(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from tests.helpers.processes import kill_tree, start_in_group

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "slow.yaml").write_text(SLOW_TASK)
    (tasks / "loader.py").write_text(SLOW_LOADER)
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "hftoolkit", "train", str(DECODER), "--output", str(run),
            *[a for s in SHORT for a in ("--set", s)], "--set", "eval.benchmarks.tasks=[slow_to_load]",
            "--set", f"eval.benchmarks.path={tasks}"]
    process = start_in_group(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.time() + 240
        while not (tasks / "loading").exists() and process.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert (tasks / "loading").exists(), "the benchmark never started"
    finally:
        kill_tree(process)
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((run / "manifest.json").read_text())["status"] != "complete"
    result = run_cli("eval", run, "--benchmark", MC, "--limit", "3")
    assert MC in result.output
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["benchmarks"][MC]["rows"] == 3 and metrics["eval"]  # what training measured is kept


@pytest.fixture(scope="session")
def base_and_tuned_report(lora_run, tmp_path_factory) -> tuple[Path, Path]:
    """The LoRA run and its untrained base (the same tasks and limit) in one comparison report."""
    root = tmp_path_factory.mktemp("report")
    base = root / "base"
    run_cli("eval", DECODER, "--benchmark", f"{MC},{GEN}", "--limit", "5", "--output", base,
            "--set", "data.max_eval_samples=8")
    run_cli("compare", lora_run, base, "--output", root / "out")
    return base, root / "out"


@pytest.mark.slow
def test_the_report_sets_each_benchmark_of_the_tuned_run_beside_its_base(lora_run, base_and_tuned_report):
    base, out = base_and_tuned_report
    report = (out / "report.md").read_text()
    section = report[report.index("## Benchmarks"):]
    tuned = json.loads((lora_run / "metrics.json").read_text())["benchmarks"][MC]
    untrained = json.loads((base / "metrics.json").read_text())["benchmarks"][MC]
    row = next(line for line in section.splitlines() if line.startswith(f"| {MC}"))
    change = f"{tuned['value'] - untrained['value']:+.4f} vs base"
    assert f"{format_value(tuned['value'])} ± {format_value(tuned['stderr'])} ({change})" in row
    assert row.rstrip(" |").endswith(f"{format_value(untrained['value'])} ± {format_value(untrained['stderr'])}")
    assert "(base)" in section.splitlines()[4]  # the header names the base's column
    assert (out / "benchmarks.png").read_bytes().startswith(b"\x89PNG")
    runs_table = report[:report.index("## ")]
    assert "(untrained baseline)" in runs_table and f"(untrained baseline) {BEST}" not in runs_table


@pytest.mark.slow
def test_the_benchmark_section_shows_in_a_browser(base_and_tuned_report, tmp_path):
    from tests.helpers import browser

    if browser.missing_reason() is not None:
        pytest.skip(browser.missing_reason())
    _, out = base_and_tuned_report
    with browser.open_page(out / "report.html", tmp_path / "profile") as (page, record):
        section = page.locator("#benchmarks")
        heads = section.locator("th").all_inner_texts()
        cells = section.locator("tr").nth(1).locator("td").all_inner_texts()
        image = section.locator("img").evaluate("img => [img.naturalWidth, img.getBoundingClientRect().width]")
    assert record.page_errors == []
    assert heads[:2] == ["benchmark", "metric"] and any(h.endswith("(base)") for h in heads)
    assert any("vs base" in c for c in cells) and image[0] > 0 and image[1] > 0


@pytest.mark.slow
def test_eval_benchmarks_in_a_recipe_is_validated_with_the_rest():
    empty = run_cli("validate", DECODER, "--set", "eval.benchmarks.tasks=[]", expect=2)
    assert "eval.benchmarks.tasks" in plain(empty.output) and "name at least one task" in plain(empty.output)
    typo = run_cli("validate", DECODER, "--set", f"eval.benchmarks.tasks=[{MC}]", "--set", "eval.benchmarks.shots=3",
                   expect=2)
    assert "eval.benchmarks.shots" in plain(typo.output)


def test_benchmark_options_without_benchmark_or_beside_split_are_refused():
    alone = run_cli("eval", DECODER, "--limit", "3", expect=2)
    assert "apply to --benchmark" in plain(alone.output)
    both = run_cli("eval", DECODER, "--benchmark", MC, "--split", "test", expect=2)
    assert "--split and --benchmark" in plain(both.output)


@pytest.mark.slow
def test_a_preference_run_scores_its_benchmarks_with_its_adapter_beside_its_base(tmp_path):
    preference = RECIPES / "decoder-preference.yaml"
    quick = ("data.max_train_samples=64", "data.max_eval_samples=16", "eval.max_predictions=0")
    train_recipe(preference, tmp_path / "run", *quick, f"eval.benchmarks.tasks=[{MC}]", "eval.benchmarks.limit=5",
                 "eval.benchmarks.num_fewshot=0")
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())["benchmarks"][MC]
    again = json.loads(run_cli("eval", tmp_path / "run", "--benchmark", MC, "--limit", "5", "--json").stdout)
    assert again["benchmarks"][MC]["metrics"] == pytest.approx(recorded["metrics"])
    run_cli("eval", preference, *[x for s in quick for x in ("--set", s)], "--benchmark", MC, "--limit", "5",
            "--num-fewshot", "0", "--output", tmp_path / "base")
    # The tuned model is scored, not its base: its log-likelihoods of the choices differ.
    tuned, base = (samples(tmp_path / run, MC) for run in ("run", "base"))
    assert len(tuned) == len(base) == 5 and [r["resps"] for r in tuned] != [r["resps"] for r in base]
    run_cli("compare", tmp_path / "base", tmp_path / "run", "--output", tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert MC in report and "## Preference: loss and reward margin" in report


def test_the_harness_s_own_task_index_is_kept_once_per_version_and_read_back(tmp_path):
    """patches/lm_eval_0_4.py: indexing lm-eval's own task files takes seconds each time; the index is kept in the
    cache and read back while the same lm-eval is installed. Shown here on a stand-in folder of two tasks."""
    from lm_eval.tasks._index import TaskIndex

    from hftoolkit.patches.lm_eval_0_4 import cached_default_index

    defaults, extra, cache = tmp_path / "defaults", tmp_path / "extra", tmp_path / "cache"
    for folder, names in ((defaults, ("alpha", "beta")), (extra, ("gamma",))):
        folder.mkdir()
        for name in names:
            (folder / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: x\noutput_type: multiple_choice\n")
    original = TaskIndex.__dict__["build"]
    fresh = TaskIndex.build([defaults, extra])
    with cached_default_index(cache, defaults):
        first = TaskIndex.build([defaults, extra])
    assert sorted(first) == sorted(fresh) == ["alpha", "beta", "gamma"] and len(list(cache.iterdir())) == 1
    (defaults / "delta.yaml").write_text("task: delta\ndataset_path: x\noutput_type: multiple_choice\n")
    (extra / "epsilon.yaml").write_text("task: epsilon\ndataset_path: x\noutput_type: multiple_choice\n")
    with cached_default_index(cache, defaults):
        kept = TaskIndex.build([defaults, extra])
    assert sorted(kept) == ["alpha", "beta", "epsilon", "gamma"], "the defaults read back, any other folder indexed"
    next(cache.iterdir()).write_bytes(b"cut sh")
    with cached_default_index(cache, defaults):
        assert "delta" in TaskIndex.build([defaults]), "a damaged file is indexed again"
    assert TaskIndex.__dict__["build"] is original and "delta" in TaskIndex.build([defaults])
