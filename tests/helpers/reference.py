"""Test helpers: one tolerant comparison with a message a reader can act on."""

from __future__ import annotations

import torch

from hftoolkit.reference.parity import max_abs_difference


def assert_close(reference: torch.Tensor, library: torch.Tensor, tolerance: float, what: str) -> None:
    diff = max_abs_difference(reference, library)
    assert diff <= tolerance, (
        f"{what}: max |reference - library| = {diff:.3g} exceeds {tolerance:g} "
        f"(shapes {tuple(reference.shape)} and {tuple(library.shape)})"
    )
