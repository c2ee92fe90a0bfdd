"""Every row of the `hftoolkit parity` table, as a test: the same functions, the same tolerances."""

from __future__ import annotations

import pytest

from hftoolkit.reference.parity import TOLERANCES, all_comparisons, run_comparison
from tests.helpers.reference import assert_close

COMPARISONS = all_comparisons()


@pytest.mark.parametrize("row", COMPARISONS, ids=[c.component for c in COMPARISONS])
def test_reference_equals_library(row):
    reference, library = row.run()
    assert_close(reference, library, row.tolerance, f"{row.component} vs {row.against}")


def test_every_row_uses_a_tolerance_from_the_one_table():
    assert {c.kind for c in COMPARISONS} <= set(TOLERANCES)
    looser = {kind for kind, (tol, _) in TOLERANCES.items() if tol > TOLERANCES["model"][0]}
    assert all(len(TOLERANCES[kind][1]) > 20 for kind in looser), "a looser tolerance must say why"


def test_the_suite_covers_every_mechanism_of_the_course():
    groups = {c.group for c in COMPARISONS}
    assert {"attention", "t5_attention", "positional", "norm", "feedforward", "blocks", "bert", "gpt2", "vit",
            "lora", "optim", "objectives", "decoding", "preference"} <= groups


def test_a_failing_row_is_reported_not_raised():
    from hftoolkit.reference.parity import Comparison

    def broken():
        raise RuntimeError("library changed its signature")

    result = run_comparison(Comparison("demo.broken", "nothing", "layer", broken))
    assert not result.passed
    assert "library changed its signature" in result.error
