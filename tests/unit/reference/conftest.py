"""Shared fixtures for the reference-layer tests: every test starts from the same seed."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)
