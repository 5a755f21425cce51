"""The built site in a real browser: offline, error-free, math and figures drawn, widget honest."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

from portattn import chapter
from portattn.testing import to_numpy

PAGES = ["", "chapter/", "beyond/", "performance/", "backends/", "huggingface/", "api/"]


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


def _open(browser: Any, url: str, *, javascript: bool = True) -> tuple[Any, Visit]:
    context = browser.new_context(
        java_script_enabled=javascript, viewport={"width": 1280, "height": 900}
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
    page.goto(url, wait_until="networkidle")
    return page, visit


@pytest.fixture
def chapter_page(browser: Any, base_url: str) -> Iterator[tuple[Any, Visit]]:
    page, visit = _open(browser, f"{base_url}/chapter/")
    yield page, visit
    page.context.close()


FIGURES = "article figure, article svg, article img, article math"

# For each figure-like element: whether it is meant to be seen now (not in an
# inactive content tab or a closed <details>), and its laid-out size.
_MEASURE = """els => els.map(e => {
  const tab = e.closest('.tabbed-block');
  const details = e.closest('details');
  const away = (tab && getComputedStyle(tab).display === 'none')
    || (details && !details.open && !e.closest('summary'))
    || e.closest('.md-clipboard, .headerlink, button') !== null;
  const r = e.getBoundingClientRect();
  return {away, w: r.width, h: r.height, what: e.outerHTML.slice(0, 100)};
})"""


def assert_figures_drawn(page: Any) -> int:
    """Every figure, SVG, image and formula that should be visible has a non-zero size."""
    shown = [m for m in page.locator(FIGURES).evaluate_all(_MEASURE) if not m["away"]]
    empty = [m["what"] for m in shown if not (m["w"] > 0 and m["h"] > 0)]
    assert empty == [], f"drawn with zero size: {empty}"
    return len(shown)


def _size(locator: Any) -> tuple[float, float]:
    box = locator.bounding_box()
    return (0.0, 0.0) if box is None else (box["width"], box["height"])


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_offline_without_errors(
    browser: Any, base_url: str, screenshots: Path, path: str
) -> None:
    page, visit = _open(browser, f"{base_url}/{path}")
    try:
        visit.assert_clean()
        assert page.locator("article h1").count() == 1
        assert_figures_drawn(page)
        name = path.strip("/") or "home"
        page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
    finally:
        page.context.close()


def test_chapter_math_is_rendered(chapter_page: tuple[Any, Visit]) -> None:
    page, visit = chapter_page
    visit.assert_clean()
    maths = page.locator("article math")
    assert maths.count() > 10
    for i in range(maths.count()):
        m = maths.nth(i)
        if m.is_visible():
            w, h = _size(m)
            assert w > 0 and h > 0, m.get_attribute("alttext")
    # Proof that MathML is laid out as math, not as inline text: in a fraction
    # the numerator sits above the denominator.
    frac = page.locator("article math mfrac").first
    num = frac.locator(":scope > *").nth(0).bounding_box()
    den = frac.locator(":scope > *").nth(1).bounding_box()
    assert num is not None and den is not None
    assert num["y"] + num["height"] <= den["y"] + 1, (num, den)
    text = page.locator("article").inner_text()
    for raw in ("\\(", "\\[", "$$", "\\frac", "\\sqrt"):
        assert raw not in text, f"unrendered math {raw!r} on the page"


def test_chapter_figures_have_size(chapter_page: tuple[Any, Visit]) -> None:
    page, _ = chapter_page
    # Figures in inactive tabs are hidden; choose each linked tab in turn.
    for label in ("Causal mask on", "Causal mask off"):
        page.locator(".tabbed-labels label", has_text=label).first.click()
        assert assert_figures_drawn(page) > 10
        heatmaps = [
            f for f in page.locator("article figure.pa-heatmap-figure").all() if f.is_visible()
        ]
        assert len(heatmaps) == 1
        assert label.lower() in heatmaps[0].inner_text().lower()
        w, h = _size(heatmaps[0])
        assert w > 100 and h > 100
    plot = page.locator("article figure.pa-plot svg")
    assert _size(plot)[0] > 300


def _grid(page: Any) -> tuple[np.ndarray, list[list[str]]]:
    cells = page.locator(".pa-heatmap .pa-hm-cell")
    n = len(chapter.DEMO_TOKENS)
    assert cells.count() == n * n
    weights = np.zeros((n, n))
    texts = [["" for _ in range(n)] for _ in range(n)]
    for c in cells.all():
        i, j = int(c.get_attribute("data-row")), int(c.get_attribute("data-col"))
        weights[i, j] = float(c.get_attribute("data-weight"))
        texts[i][j] = c.inner_text().strip()
    return weights, texts


def test_widget_mask_toggle_zeroes_upper_triangle(
    chapter_page: tuple[Any, Visit], screenshots: Path
) -> None:
    page, visit = chapter_page
    toggle = page.locator(".pa-heatmap .pa-hm-toggle")
    upper = np.triu_indices(len(chapter.DEMO_TOKENS), k=1)

    assert toggle.get_attribute("aria-checked") == "true"
    toggle.click()
    assert toggle.get_attribute("aria-checked") == "false"
    off, _ = _grid(page)
    assert np.all(off[upper] > 0), "with the mask off every token should see the future"
    np.testing.assert_allclose(off, to_numpy(chapter.demo_weights(causal=False)), rtol=1e-6)

    toggle.click()
    assert toggle.get_attribute("aria-checked") == "true"
    on, texts = _grid(page)
    assert np.all(on[upper] == 0)
    assert all(texts[i][j] == "0%" for i, j in zip(*upper, strict=True))
    np.testing.assert_allclose(on, to_numpy(chapter.demo_weights(causal=True)), rtol=1e-6)
    visit.assert_clean()
    page.locator(".pa-heatmap").screenshot(path=str(screenshots / "widget-causal.png"))


def _percentages(sentence: str) -> dict[str, int]:
    return {tok: int(p) for tok, p in re.findall(r"(\w+) (\d+)%", sentence)}


@pytest.mark.parametrize("causal", [True, False])
def test_clicking_sat_reads_its_row(
    chapter_page: tuple[Any, Visit], screenshots: Path, causal: bool
) -> None:
    page, visit = chapter_page
    tokens = chapter.DEMO_TOKENS
    if not causal:
        page.locator(".pa-heatmap .pa-hm-toggle").click()
    page.locator(".pa-heatmap .pa-hm-query", has_text="sat").click()
    said = page.locator(".pa-heatmap .pa-hm-said").inner_text()

    w = to_numpy(chapter.demo_weights(causal=causal)).astype(np.float64)
    i = tokens.index("sat")
    expected = {t: round(100 * float(w[i, j])) for j, t in enumerate(tokens) if w[i, j] != 0}
    assert said.startswith("sat attends to ")
    assert _percentages(said) == expected
    assert said == chapter.describe_row(tokens, w, i)
    row = page.locator(".pa-heatmap tr.pa-hm-active")
    assert row.get_attribute("data-row") == str(i)
    visit.assert_clean()
    name = "on" if causal else "off"
    page.locator(".pa-heatmap").screenshot(path=str(screenshots / f"widget-sat-mask-{name}.png"))


def test_widget_is_keyboard_accessible(chapter_page: tuple[Any, Visit]) -> None:
    page, _ = chapter_page
    tokens = chapter.DEMO_TOKENS
    page.locator(".pa-heatmap .pa-hm-query").first.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    focused = page.evaluate("document.activeElement.textContent")
    assert focused == tokens[2]
    said = page.locator(".pa-heatmap .pa-hm-said").inner_text()
    w = chapter.demo_weights(causal=True)
    assert said == chapter.describe_row(tokens, w, 2)
    # the switch is a real button: Space toggles it
    page.locator(".pa-heatmap .pa-hm-toggle").focus()
    page.keyboard.press("Space")
    assert page.locator(".pa-heatmap .pa-hm-toggle").get_attribute("aria-checked") == "false"


def test_static_fallback_without_javascript(browser: Any, base_url: str, screenshots: Path) -> None:
    page, visit = _open(browser, f"{base_url}/chapter/", javascript=False)
    try:
        assert visit.outside == []
        fallback = page.locator(".pa-heatmap noscript svg, .pa-heatmap svg.pa-heatmap-static")
        assert fallback.count() == 1
        w, h = _size(fallback.first)
        assert w > 10 and h > 10
        assert page.locator(".pa-heatmap .pa-hm-cell").count() == 0
        page.locator(".pa-heatmap").screenshot(path=str(screenshots / "widget-no-js.png"))
    finally:
        page.context.close()


def test_widget_switch_and_tabs_move_together(chapter_page: tuple[Any, Visit]) -> None:
    page, visit = chapter_page
    toggle = page.locator(".pa-heatmap .pa-hm-toggle")

    def checked_titles() -> list[str]:
        return page.evaluate(
            """() => [...document.querySelectorAll('.tabbed-set > input:checked')]
                .map(i => document.querySelector(`label[for="${i.id}"]`).textContent.trim())"""
        )

    assert set(checked_titles()) == {"Causal mask on"}
    toggle.click()
    assert set(checked_titles()) == {"Causal mask off"}
    page.locator(".tabbed-labels label", has_text="Causal mask on").first.click()
    assert toggle.get_attribute("aria-checked") == "true"
    assert set(checked_titles()) == {"Causal mask on"}
    visit.assert_clean()
