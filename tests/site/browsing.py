"""Opening a page of the built site in Chromium, and reading what it shows.

Shared by the browser tests (conftest.py puts this folder on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

PHONE = 390
DESKTOP = 1400
MIN_FIGURE_PX = 9.0


@dataclass
class Visit:
    """What a page did while it loaded: console errors, uncaught exceptions, requests."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.console_errors == [], self.console_errors
        assert self.page_errors == [], self.page_errors
        assert self.outside == [], f"requests left 127.0.0.1: {self.outside}"
        assert self.requests, "the page made no request at all"


def open_page(
    browser: Any,
    url: str,
    *,
    javascript: bool = True,
    width: int = 1280,
    scheme: str = "light",
) -> tuple[Any, Visit]:
    context = browser.new_context(
        java_script_enabled=javascript,
        viewport={"width": width, "height": 900},
        color_scheme=scheme,
    )
    page = context.new_page()
    visit = Visit()

    def on_request(route: Any) -> None:
        target = route.request.url
        visit.requests.append(target)
        if urlsplit(target).hostname != "127.0.0.1":
            visit.outside.append(target)
            route.abort()
        else:
            route.continue_()

    context.route("**/*", on_request)
    page.on("console", lambda m: m.type == "error" and visit.console_errors.append(m.text))
    page.on("pageerror", lambda e: visit.page_errors.append(str(e)))
    # "load" first: on a busy machine the network can go idle while a long page
    # is still being parsed, and the scripts have not run yet.
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    page.evaluate("document.fonts.ready.then(() => true)")
    return page, visit


def table(page: Any, name: str) -> list[list[str]]:
    return page.locator(f'table[data-pa-table="{name}"] tbody tr').evaluate_all(
        "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))"
    )
