"""The Docker page (docs/docker.md), the one copy of the Docker documentation that the Docker tests read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCKER_DOC = ROOT / "docs" / "docker.md"
SECTION_TITLE = "Docker on GPU servers"


def docker_section() -> tuple[Path, str]:
    """The "Docker on GPU servers" section of docs/docker.md, the one copy of the Docker documentation."""
    lines = DOCKER_DOC.read_text(encoding="utf-8").splitlines()
    in_code, start, level = False, None, None
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        heading = re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if in_code or not heading:
            continue
        depth, title = len(heading.group(1)), heading.group(2)
        if start is None and title.strip().lower() == SECTION_TITLE.lower():
            start, level = i, depth
        elif start is not None and depth <= level:
            return DOCKER_DOC, "\n".join(lines[start:i])
    if start is None:
        pytest.fail(f'no "{SECTION_TITLE}" section in {DOCKER_DOC.relative_to(ROOT)}')
    return DOCKER_DOC, "\n".join(lines[start:])
