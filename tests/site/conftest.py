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


class _SiteHandler(SimpleHTTPRequestHandler):
    """The built site, cacheable for an hour, with the empty search index unless asked.

    Nothing changes under a test run, so a browser context fetches each
    stylesheet and script once. The search index is the exception
    (browsing.SEARCH_INDEX): the real one only for a request carrying the
    search cookie, and never cached.
    """

    def do_GET(self) -> None:
        from browsing import SEARCH_COOKIE, SEARCH_INDEX

        index = Path(self.translate_path(self.path))
        if (
            self.path.split("?")[0].endswith(SEARCH_INDEX)
            and index.is_file()
            and f"{SEARCH_COOKIE}=1" not in (self.headers.get("Cookie") or "")
        ):
            body = _empty_index(index)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def end_headers(self) -> None:
        from browsing import SEARCH_INDEX

        if not self.path.split("?")[0].endswith(SEARCH_INDEX):
            self.send_header("Cache-Control", "max-age=3600")
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@functools.cache
def _empty_index(path: Path) -> bytes:
    """The site's search index with its configuration and no documents."""
    import json

    config = json.loads(path.read_text(encoding="utf-8")).get("config", {})
    return json.dumps({"config": config, "docs": []}).encode()


@pytest.fixture(scope="session")
def base_url(site_dir: Path) -> Iterator[str]:
    handler = functools.partial(_SiteHandler, directory=str(site_dir))
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
        from browsing import OFFLINE_ARGS

        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + OFFLINE_ARGS)
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
    scripts and fonts load once, not once per page: the test server marks
    them cacheable, and no request is routed, which would turn the cache
    off). Tests take their pages from ``shared_pages``, which opens each in
    the context of its layout.
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


@pytest.fixture(scope="session")
def shared_pages(layouts: Any, base_url: str) -> Iterator[Any]:
    """Pages opened once per layout and read by every test at that layout (browsing.KEPT)."""
    from browsing import SharedPages

    pages = SharedPages(layouts, base_url)
    yield pages
    pages.close()
