"""bench: the course's comparison trained for real (cut to a few steps here), then one report across the runs."""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, ROOT, browser, run_cli

SHORT = ["training.max_steps=4", "data.max_train_samples=64", "data.max_eval_samples=16", "eval.max_predictions=4",
         "training.logging_steps=1", "eval.generation.max_new_tokens=8"]
# run -> (task, family, checkpoint)
RUNS = {
    "classification-bert": ("classification", "encoder", "init:bert"),
    "classification-gpt2": ("classification", "decoder", "init:gpt2"),
    "classification-bart": ("classification", "seq2seq", "init:bart"),
    "translation-t5": ("translation", "seq2seq", "init:t5"),
    "translation-bart": ("translation", "seq2seq", "init:bart"),
    "translation-gpt2": ("translation", "decoder", "init:gpt2"),
    "vision-vit": ("image-classification", "vision", "init:vit"),
}


@pytest.fixture(scope="session")
def bench_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", "--out", out]
    for override in SHORT:
        args += ["--set", override]
    return out, run_cli(*args)


@pytest.mark.slow
def test_bench_trains_each_task_with_each_architecture_and_reports_them(bench_out):
    out, result = bench_out
    report = (out / "report.md").read_text()
    for name, (task, family, checkpoint) in RUNS.items():
        metrics = json.loads((out / "runs" / name / "metrics.json").read_text())
        assert (metrics["name"], metrics["task"], metrics["family"], metrics["checkpoint"]) == (
            name, task, family, checkpoint)
        assert f"| {name} " in report, f"{name} missing from the report"
        assert f"/7 {name} {metrics['main_metric']}=" in result.output, "a progress line per run"
    table = result.output[result.output.index("┃ run"):]
    assert table.count("│ ") >= 7 and table.count("★") >= 3, "the terminal shows the table, best of each task starred"
    for task, family in (("classification", "encoder"), ("translation", "seq2seq")):
        section = report.split(f"## Same-task comparison: {task}\n")[1].split("\n## ")[0]
        assert f"The course recommends the {family} family for {task}" in section
        assert section.count("| " + task.split("-")[0]) == 3, "three architectures side by side"
        assert (out / f"same-task-{task}-{'accuracy' if task == 'classification' else 'bleu'}.png").is_file()
    assert "## Same-task comparison: image-classification" not in report, "one vision run: nothing to compare"
    for plot in out.glob("*.png"):
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.skipif(browser.missing_reason() is not None, reason=str(browser.missing_reason()))
def test_real_report_renders_in_chromium(bench_out, tmp_path):
    out, _ = bench_out
    with browser.open_page(out / "report.html", tmp_path / "profile") as (page, record):
        widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.naturalWidth)")
        headings = page.eval_on_selector_all("section.same-task h2", "hs => hs.map(h => h.innerText)")
        text = page.inner_text("body")
        page.screenshot(path=str(ROOT / "tests" / "artifacts" / "bench-report.png"), full_page=True)
    assert not record.console_errors and not record.page_errors
    assert widths and all(w > 0 for w in widths)
    assert headings == ["Same-task comparison: classification", "Same-task comparison: translation"]
    assert all(name in text for name in RUNS)


def test_families_pick_their_runs():
    from hftoolkit.sweeps.across_families import bench_variants

    picked = bench_variants(["seq2seq", "vision"], RECIPES)
    assert [v.name for v in picked] == ["classification-bart", "translation-t5", "translation-bart", "vision-vit"]
    assert [v.name for v in bench_variants(None, RECIPES)] == list(RUNS)


def test_unknown_family_is_refused(tmp_path):
    result = run_cli("bench", "--families", "rnn", "--out", tmp_path, expect=2)
    assert "unknown rnn" in result.output
