"""The docs read the same in the repository as on the site: every relative link of README.md, CONTRIBUTING.md and
docs/**/*.md names a file of the repository, and the generated reference pages committed in docs/reference/ are what
the code makes now (docs/hooks/reference.py makes them again for the site)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from tests.helpers import ROOT
from tests.helpers.doc_blocks import reference_hook, relative_links

PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_link_reader_takes_links_and_images_and_leaves_code_and_addresses_alone():
    text = ("See [Data](data.md#labels), ![plot](images/a.png \"a plot\") and [the [nested] one](<b c.md>).\n"
            "`[not](code.md)` [site](https://example.org/x.md) [mail](mailto:a@b.c) [here](#top)\n"
            "```text\n[in a block](block.md)\n```\n[ref]: reference/recipe.md?x=1\n")
    assert relative_links(text) == [(1, "data.md"), (1, "images/a.png"), (1, "b c.md"), (6, "reference/recipe.md")]


def test_every_relative_link_in_the_docs_names_a_file_of_the_repository():
    broken = []
    for page in PAGES:
        for line, target in relative_links(page.read_text(encoding="utf-8")):
            path = (page.parent / unquote(target)).resolve()
            if not path.is_file() or not path.is_relative_to(ROOT):
                broken.append(f"{page.relative_to(ROOT)}:{line}: {target}")
    assert len(PAGES) > 10 and not broken, "links to no file of the repository:\n" + "\n".join(broken)


def test_the_committed_reference_pages_are_what_the_code_makes_now(tmp_path: Path):
    reference = reference_hook()
    stale = reference.stale_pages()
    assert not stale, (f"docs/{', docs/'.join(stale)}: not what the code makes now (a recipe key, task or option "
                       f"changed): write them again with `{reference.REFRESH}` and commit them")
    # the refresh command writes exactly those pages, and only when they changed
    assert reference.write_pages(tmp_path) == list(reference.COMMITTED) and reference.write_pages(tmp_path) == []
    (tmp_path / "reference" / "tasks.md").write_text("# Tasks\n")
    assert reference.stale_pages(tmp_path) == ["reference/tasks.md"]
