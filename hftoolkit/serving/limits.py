"""serve's limits on a request, stated once: the API refuses what passes them (api.py), and `hftoolkit serve`
offers them as its options' defaults (cli/serving.py). Light: the standard library only, for the CLI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    max_input_tokens: int = 4096
    max_tokens: int = 1024  # the most new tokens a request may ask for
