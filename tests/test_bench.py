"""bench: every family's smoke recipe trained for real, then one comparison report across them."""

from __future__ import annotations

import json

import pytest

from tests import browser
from tests.conftest import run_cli

FAMILIES = ["encoder", "decoder", "seq2seq", "vision"]
SHORT = ["training.max_steps=4", "data.max_train_samples=64", "data.max_eval_samples=16", "eval.max_predictions=4",
         "training.logging_steps=1"]


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", "--out", out]
    for family in FAMILIES:
        args += ["--families", family]
    for override in SHORT:
        args += ["--set", override]
    result = run_cli(*args)
    return out, result


def test_bench_trains_every_family_and_reports_them(bench_out):
    out, result = bench_out
    report = (out / "report.md").read_text()
    for family in FAMILIES:
        metrics = json.loads((out / "runs" / family / "metrics.json").read_text())
        assert metrics["family"] == family
        assert metrics["name"] in report, f"{family} run missing from the report table"
        assert f"│ {family}" in result.stdout, "the terminal shows the table too"
    assert report.count("★") >= len({json.loads((out / "runs" / f / "metrics.json").read_text())["task"]
                                     for f in FAMILIES}), "the best run of each task is marked"
    for plot in out.glob("*.png"):
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(browser.missing_reason() is not None, reason=str(browser.missing_reason()))
def test_real_report_renders_in_chromium(bench_out, tmp_path):
    out, _ = bench_out
    with browser.open_page(out / "report.html", tmp_path / "profile") as (page, record):
        widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.naturalWidth)")
        text = page.inner_text("body")
        page.screenshot(path=str(browser.Path(__file__).parent / "artifacts" / "bench-report.png"), full_page=True)
    assert not record.console_errors and not record.page_errors
    assert widths and all(w > 0 for w in widths)
    for family in FAMILIES:
        assert json.loads((out / "runs" / family / "metrics.json").read_text())["name"] in text


def test_unknown_family_is_refused(tmp_path):
    result = run_cli("bench", "--families", "rnn", "--out", tmp_path, expect=2)
    assert "unknown rnn" in result.output
