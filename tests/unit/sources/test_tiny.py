"""The cache of tiny `init:` checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.processes import start_in_group


@pytest.mark.slow
def test_two_runs_building_the_same_tiny_checkpoint_at_once_both_get_it(tmp_path):
    # Real processes: two runs started together on a cold cache both build init:bert; the one that
    # finishes second must use the first one's folder, not fail on it.
    code = "from hftoolkit.sources.tiny import ensure_tiny; print('PATH', ensure_tiny('bert'))"
    env = {**os.environ, "HFTOOLKIT_CACHE": str(tmp_path / "cache")}
    runs = [start_in_group([sys.executable, "-c", code], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (_, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-2000:]
    paths = {line.split()[1] for out, _ in outputs for line in out.splitlines() if line.startswith("PATH")}
    assert len(paths) == 1
    assert os.path.isfile(os.path.join(next(iter(paths)), "config.json"))
    leftovers = [p.name for p in (tmp_path / "cache").rglob("*") if p.name.startswith(".")]
    assert not leftovers, "the losing build's temporary folder is removed"


@pytest.mark.parametrize("arch", ["bert", "gpt2", "t5", "bart"])
def test_a_tiny_checkpoint_built_anywhere_has_the_shipped_tokenizer_and_the_same_weights(tmp_path, arch):
    # The tokenizer trainer orders tied merges as it happens to, so a tokenizer trained at first use made every
    # machine's init:bert another model (and a learned result that held on one failed on another).
    import json

    from safetensors.torch import load_file

    from hftoolkit.sources.tiny import TOKENIZERS, init_model

    built = [init_model(arch, tmp_path / name) for name in ("one", "two")]
    shipped = json.loads((TOKENIZERS / f"{arch}.json").read_text())["model"]["vocab"]
    for folder in built:
        assert json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"] == shipped
    one, two = (load_file(folder / "model.safetensors") for folder in built)
    assert one.keys() == two.keys() and all((one[k] == two[k]).all() for k in one)
