"""Build the docs site (or take a built one), serve it on 127.0.0.1, and open it in Chromium.

``PORTATTN_SITE_DIR=site`` reuses a site that ``mkdocs build --strict`` has
just built (the nox ``docs`` session does this); without it the site is built
here into a temporary folder. The browser is Debian's ``/usr/bin/chromium``
(``apt-get install -y chromium``), driven by Playwright; Playwright's own
browser downloads are never used.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("PORTATTN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "screenshots"

# The tests compare the pages with what docs/_gen/sitegen computes, and share
# the browser helpers of browsing.py (this folder is not a package: its name
# would shadow the standard library's site module).
# Appended, not put first: ``from conftest import ...`` in tests/ must still
# find tests/conftest.py, not this file.
for _path in (ROOT / "docs" / "_gen", Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))


@functools.cache
def built_site() -> Path:
    """The site under test: ``PORTATTN_SITE_DIR``, or one built now into a temporary folder.

    Called while tests are collected, because the pages to visit are read from
    the built site: a page added to the docs is tested without editing this file.
    """
    given = os.environ.get("PORTATTN_SITE_DIR")
    if given:
        path = (ROOT / given).resolve()
        if not (path / "chapter" / "index.html").is_file():
            pytest.fail(f"PORTATTN_SITE_DIR={given} has no built chapter page; run mkdocs build")
        return path
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip(
            "mkdocs is not installed (the docs group; `nox -s docs` builds and tests the site)"
        )
    out = Path(tempfile.mkdtemp(prefix="portattn-site-"))
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        check=True,
    )
    return out


def site_pages(site: Path) -> list[str]:
    """Every page of the built site as a URL path ("", "chapter/", "ja/chapter/", ...)."""
    pages = []
    for index in sorted(site.rglob("index.html")):
        rel = index.parent.relative_to(site).as_posix()
        if rel.split("/")[0] in {"assets", "search"}:
            continue
        pages.append("" if rel == "." else f"{rel}/")
    return pages


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "page_path" in metafunc.fixturenames:
        pages = site_pages(built_site())
        metafunc.parametrize("page_path", pages, ids=[p.strip("/") or "home" for p in pages])
    if "english_path" in metafunc.fixturenames:
        pages = [p for p in site_pages(built_site()) if not p.startswith("ja/")]
        metafunc.parametrize("english_path", pages, ids=[p.strip("/") or "home" for p in pages])


@pytest.fixture(scope="session")
def site_dir() -> Path:
    return built_site()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def base_url(site_dir: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: any free port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists() and shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} not found: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def screenshots() -> Path | None:
    """Where page screenshots go when ``PORTATTN_SCREENSHOTS=1``; None (none taken) otherwise.

    A full-page screenshot costs seconds per page and layout and checks
    nothing, so the docs session takes none unless asked.
    """
    if os.environ.get("PORTATTN_SCREENSHOTS") != "1":
        return None
    SCREENSHOTS.mkdir(exist_ok=True)
    return SCREENSHOTS


@pytest.fixture(scope="session")
def layouts(browser: Any) -> Iterator[Callable[[int, str], Any]]:
    """``layouts(width, scheme)``: one browser context per layout, shared by every test.

    Pages opened in the same context share its HTTP cache (the stylesheets,
    scripts and fonts load once, not once per page); each test opens and
    closes its own page in it.
    """
    from browsing import new_context

    made: dict[tuple[int, str], Any] = {}

    def get(width: int, scheme: str) -> Any:
        if (width, scheme) not in made:
            made[width, scheme] = new_context(browser, width=width, scheme=scheme)
        return made[width, scheme]

    yield get
    for context in made.values():
        context.close()
