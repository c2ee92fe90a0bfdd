"""The site's generated pages, made from the code at build time so that they cannot drift (mkdocs.yml, `hooks:`).

- reference/recipe.md: every recipe key, from the pydantic schema (config/recipe.py, config/sections.py);
- reference/tasks.md: every task, from the task table (config/tasks.py);
- reference/commands.md: every command and its options, from the Typer app (cli/app.py), through click;
- index.md and contributing.md: README.md and CONTRIBUTING.md, their links rewritten for the site.

The three reference pages are also committed in docs/reference/, so that the pages linking them read the same in
the repository as on the site; the build makes them afresh all the same, and tests/e2e/test_doc_links.py fails when
the committed copy differs from what the code makes now, naming the command that writes it again:
`python docs/hooks/reference.py`.

Each page is a function returning Markdown, so tests/e2e/test_docs_reference.py calls them directly. Light: the schema
and the Typer app import no torch.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

from markdown.extensions.toc import slugify
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]

# (page path in the site, function that writes it)
PAGES = {}
# The generated pages kept in the repository too, under docs/ (README.md and CONTRIBUTING.md are their own sources).
COMMITTED = ("reference/recipe.md", "reference/tasks.md", "reference/commands.md")
REFRESH = "python docs/hooks/reference.py"


def page(path: str):
    def register(function):
        PAGES[path] = function
        return function
    return register


def _cell(text: object) -> str:
    """Prose fit for one cell of a Markdown table: no pipes, no line breaks, and <arch> or *_column kept literal."""
    text = str(text).replace("|", "\\|").replace("\n", " ")
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _code(text: object) -> str:
    """Text fit for a code span inside a Markdown table cell (Python-Markdown splits no cell inside a code span)."""
    return str(text).replace("`", "'")


# ----------------------------------------------------------------------------------------------- recipe keys

def _section_of(annotation) -> type[BaseModel] | None:
    """The section model an annotation holds (`GenerationSection`, `BenchmarksSection | None`), else None."""
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _type_name(annotation, inner: bool = False) -> str:
    """A key's type in words: `text or null`, `list of text`, `mapping of text to (text or null)`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return " or ".join(dict.fromkeys(_type_name(type(a)) for a in args))
    if origin in (typing.Union, types.UnionType):
        words = " or ".join(dict.fromkeys(_type_name(a) for a in args))
        return f"({words})" if inner else words
    if origin is list:
        return f"list of {_type_name(args[0], inner=True)}"
    if origin is dict:
        return f"mapping of {_type_name(args[0], inner=True)} to {_type_name(args[1], inner=True)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return {str: "text", int: "integer", float: "number", bool: "boolean"}.get(annotation, getattr(
        annotation, "__name__", str(annotation)))


def _allowed(annotation, metadata) -> str:
    """The values a key accepts: its literals, and its bounds (gt, ge, lt, le, min_length)."""
    literals = []

    def walk(a):
        if typing.get_origin(a) is typing.Literal:
            literals.extend(typing.get_args(a))
        for arg in typing.get_args(a):
            if typing.get_origin(a) is not typing.Literal:
                walk(arg)
    walk(annotation)
    if literals and bool in typing.get_args(annotation):  # (data.packing: true, false, or one of its words)
        literals = [True, False, *literals]
    parts = [", ".join(f"`{_literal(v)}`" for v in literals)] if literals else []
    symbols = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "length ≥", "pattern": "matches"}
    for item in metadata:
        for name, symbol in symbols.items():
            value = getattr(item, name, None)
            if value is not None:
                parts.append(f"{symbol} `{value}`")
    return "; ".join(parts)


def _literal(value) -> str:
    return {True: "true", False: "false", None: "null"}.get(value, value) if not isinstance(value, (int, float)) \
        or isinstance(value, bool) else str(value)


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(its keys' defaults)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def recipe_keys() -> list[tuple[str, object]]:
    """Every recipe key as (dotted name, pydantic field), sections before their keys, in the schema's order."""
    from hftoolkit.config.recipe import Recipe

    keys = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            keys.append((prefix + name, field))
            section = _section_of(field.annotation)
            if section is not None:
                walk(section, f"{prefix}{name}.")
    walk(Recipe, "")
    return keys


@page("reference/recipe.md")
def recipe_page() -> str:
    from hftoolkit.config import tasks

    lines = ["# Recipe keys", "",
             "Every key a recipe takes, generated from the recipe's schema (`hftoolkit/config/recipe.py` and "
             "`hftoolkit/config/sections.py`) when the site is built. An unknown key is an error; "
             "`--set KEY=VALUE` takes the same keys, written with dots. The prose on what they do is in "
             "[Recipes](../recipes.md).", ""]
    top = [(name, f) for name, f in recipe_keys() if "." not in name]
    sections = [(name, f) for name, f in recipe_keys() if _section_of(f.annotation) is not None]
    tables = [("Top level", "", top)]
    for name, field in sections:
        model = _section_of(field.annotation)
        keys = [(k, f) for k, f in recipe_keys() if k.startswith(name + ".") and k.count(".") == name.count(".") + 1]
        tables.append((f"`{name}`", (field.description or (model.__doc__ or "").strip().split("\n")[0]), keys))
    for title, about, keys in tables:
        lines += [f"## {title}", ""]
        if about:
            lines += [about, ""]
        lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for key, field in keys:
            allowed = _allowed(field.annotation, field.metadata)
            if key == "task":  # (validated against the task table, not a Literal: a task added there is a task)
                allowed = ", ".join(f"`{name}`" for name in tasks.names()) + " ([Tasks](tasks.md))"
            about = _cell(field.description or "")
            if _section_of(field.annotation) is not None:  # a section: its own table below
                about = f"{about}{'; ' if about else ''}[its keys](#{slugify(f'`{key}`', '-')})"
            lines.append(f"| `{key}` | {_cell(_type_name(field.annotation))} | {_default(field)} | "
                         f"{allowed} | {about} |")
        lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- tasks

@page("reference/tasks.md")
def tasks_page() -> str:
    from hftoolkit.config import tasks

    lines = ["# Tasks", "",
             "Every task, generated from the task table (`hftoolkit/config/tasks.py`, `TASKS`) when the site is "
             "built: the families that do it and the transformers head each loads, the columns a data set gives, "
             "how it is scored and its metrics (the main metric first). How to use them: [Tasks](../tasks.md).",
             "", "| task | families: head | columns | scoring | main metric | evaluate modules | recommended |",
             "|---|---|---|---|---|---|---|"]
    for t in tasks.TASKS:
        heads = "<br>".join(f"{family}: `{head}`" for family, head in t.heads.items())
        modules = ", ".join(f"`{m}`" for m in t.metrics) or "-"
        lines.append(f"| `{t.name}` | {heads} | {', '.join(f'`{c}`' for c in t.columns)} | {t.scoring} | "
                     f"`{t.main_metric}` | {modules} | {t.recommended}: {_cell(t.why)} |")
    lines += ["", "The evaluate modules are the shipped metrics a task scores with when `eval.metrics` is `auto`; "
              "the main metric is what reports, sweeps and `eval.early_stopping` rank by."]
    for t in tasks.TASKS:
        lines += ["", f"## `{t.name}`", "",
                  f"- families and heads: {', '.join(f'{f} (`{h}`)' for f, h in t.heads.items())}",
                  f"- the course recommends: {t.recommended} ({t.why})",
                  f"- columns: {', '.join(f'`{c}` (`data.{tasks.COLUMN_KEYS[c]}`)' for c in t.columns)}"
                  + (", and a second text (`data.text_pair_column`)" if t.text_pairs else ""),
                  f"- scoring: {t.scoring}; main metric `{t.main_metric}` "
                  f"({'higher' if t.greater_is_better else 'lower'} is better)"
                  + (f"; metrics {', '.join(f'`{m}`' for m in t.metrics)}" if t.metrics else ""),
                  f"- packs examples into rows on a decoder: {'yes' if t.packs else 'no'}",
                  f"- Hub pipeline tag (model cards): `{t.pipeline_tag}`"]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------- commands

def cli_commands():
    """The Typer app as click builds it: (group, [(name, command)...]) in the order --help lists them."""
    import typer

    from hftoolkit.cli.app import app

    group = typer.main.get_command(app)
    return group, list(group.commands.items())


def _context(command, name: str, parent=None):
    return type(command).context_class(command, info_name=name, parent=parent)


def _options_table(command, ctx) -> list[str]:
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, about = record
        rows.append(f"| `{_code(names)}` | {_cell(about)} |")
    if not rows:
        return ["No options."]
    return ["| argument or option | what it does |", "|---|---|", *rows]


@page("reference/commands.md")
def commands_page() -> str:
    group, commands = cli_commands()
    root = _context(group, "hftoolkit")
    lines = ["# Commands", "",
             "Every command and its options, generated from the command line itself (the Typer app of "
             "`hftoolkit/cli/app.py`, read through click) when the site is built: the same text as "
             "`hftoolkit COMMAND --help`. What the commands are for: [Getting started](../getting-started.md).",
             "", "## `hftoolkit`", "", (group.help or "").strip(), "", *_options_table(group, root), ""]
    for name, command in commands:
        ctx = _context(command, name, parent=root)
        usage = " ".join(command.collect_usage_pieces(ctx))
        lines += [f"## `hftoolkit {name}`", "", (command.help or "").strip(), "", "```text",
                  f"hftoolkit {name} {usage}", "```", "", *_options_table(command, ctx), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ README and CONTRIBUTING

def _for_the_site(text: str) -> str:
    """A root Markdown file's relative links made the site's: docs/X -> X, README.md -> index.md."""
    text = re.sub(r"\]\(docs/", "](", text)
    text = re.sub(r"\]\(README\.md(#[^)]*)?\)", r"](index.md\1)", text)
    return re.sub(r"\]\(CONTRIBUTING\.md(#[^)]*)?\)", r"](contributing.md\1)", text)


@page("index.md")
def index_page() -> str:
    return _for_the_site((ROOT / "README.md").read_text(encoding="utf-8"))


@page("contributing.md")
def contributing_page() -> str:
    return _for_the_site((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------ mkdocs hook

def unescaped_table_code(markdown: str) -> str:
    """`a\\|b` in a table row is GitHub's way to keep a pipe in a code span; Python-Markdown needs no escape there
    and would show the backslash, so the site's copy drops it."""
    def row(line: str) -> str:
        if not line.lstrip().startswith("|"):
            return line
        return re.sub(r"`[^`]*`", lambda span: span.group(0).replace("\\|", "|"), line)
    return "\n".join(row(line) for line in markdown.split("\n"))


def on_page_markdown(markdown, page, config, files):
    """mkdocs: every page's tables as Python-Markdown reads them."""
    return unescaped_table_code(markdown)


def stale_pages(docs: Path = ROOT / "docs") -> list[str]:
    """The committed pages (COMMITTED, under `docs`) that differ from what the code makes now, or are missing."""
    return [path for path in COMMITTED
            if not (docs / path).is_file() or (docs / path).read_text(encoding="utf-8") != PAGES[path]()]


def write_pages(docs: Path = ROOT / "docs") -> list[str]:
    """Write the committed pages (COMMITTED) afresh under `docs`; returns those that changed."""
    changed = stale_pages(docs)
    for path in changed:
        (docs / path).parent.mkdir(parents=True, exist_ok=True)
        (docs / path).write_text(PAGES[path](), encoding="utf-8")
    return changed


def on_files(files, config):
    """mkdocs: add the generated pages to the site, made afresh in memory (a committed copy is replaced, and nothing
    is written into docs/)."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=make()))
    return files


if __name__ == "__main__":
    written = write_pages()
    print("\n".join(f"wrote docs/{path}" for path in written) or "docs/reference/ is up to date")
