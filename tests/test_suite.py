"""The suite's own assumptions about its runner, which fail silently when they break."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.slow
def test_xdist_groups_keep_their_tests_on_one_worker(tmp_path):
    """The tests that start processes, build the Docker image or convert SmolLM2 share a worker through
    xdist_group. pytest 9.2 made loadgroup ignore the mark (pytest-xdist issue 1386): they then ran at once,
    two-process runs on 2 cores, with session fixtures built on both workers."""
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent("""
        import os, pytest
        pytestmark = pytest.mark.xdist_group("together")

        @pytest.mark.parametrize("i", range(6))
        def test_grouped(i):
            print("worker", os.environ["PYTEST_XDIST_WORKER"])
    """))
    (tmp_path / "test_free.py").write_text("def test_a(): pass\ndef test_b(): pass\ndef test_c(): pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                             "loadgroup", "-v", "-s", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    workers = {line.split("]")[0] for line in result.stdout.splitlines() if "test_grouped.py" in line
               and "PASSED" in line}
    assert len(workers) == 1, f"one group ran on {sorted(workers)}:\n{result.stdout[-2000:]}"


def test_ci_runs_the_readme_s_test_command_step_by_step():
    """.ci/run is the README's test command (its `pip install -q` quiet, its pytest listing the slowest tests), so
    that what CI passes is what a contributor runs."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\*\*Tests\*\*.*?```bash\n(.*?)\n```", readme, re.S).group(1)
    ci = [shlex.split(line, comments=True) for line in (root / ".ci" / "run").read_text().splitlines()
          if line.startswith(("pip ", "ruff ", "mkdocs ", "python "))]
    def essential(words: list[str]) -> list[str]:
        return [w for w in words if w not in ("-q", "-p", "no:cacheprovider") and not w.startswith("--durations")]

    for step in block.split(" && "):
        words = shlex.split(step)
        if words[:2] == ["python3", "-m"] or words[0] == ".":  # (.ci/run makes its venv the same way)
            continue
        assert any(essential(words) == essential(line) for line in ci), step
    assert "constraints.txt" in block
