"""Headless Chromium for tests: open a local HTML file and record what the page did.

Uses playwright's Python package driving the system Chromium (Debian `chromium`), never
playwright's downloaded browsers, so it works offline: `apt-get install chromium` and
`pip install playwright` (no `playwright install`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
INSTALL_HINT = "apt-get install -y chromium && pip install playwright (no `playwright install` needed)"


def find_chromium() -> str | None:
    """Path of a system Chromium, or None."""
    for candidate in CHROMIUM_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def missing_reason() -> str | None:
    """Why the browser tests cannot run here (with how to install), or None when they can."""
    if find_chromium() is None:
        return f"no Chromium found ({', '.join(CHROMIUM_CANDIDATES)}); install it: {INSTALL_HINT}"
    if importlib.util.find_spec("playwright") is None:
        return f"the playwright Python package is not installed; install it: {INSTALL_HINT}"
    return None


@dataclass
class PageRecord:
    """Console errors, uncaught page errors, and every URL the page requested."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@contextlib.contextmanager
def open_page(html_path: Path, profile_dir: Path, width: int = 1400, height: int = 900):
    """Yield (page, record) for html_path loaded in headless Chromium with a fresh profile."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile_dir), executable_path=find_chromium(), headless=True,
            args=list(CHROMIUM_FLAGS), viewport={"width": width, "height": height})
        try:
            record = PageRecord()
            page = context.new_page()
            page.on("console", lambda m: record.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: record.page_errors.append(str(e)))
            page.on("request", lambda r: record.requests.append(r.url))
            page.goto(Path(html_path).resolve().as_uri(), wait_until="load")
            yield page, record
        finally:
            context.close()
