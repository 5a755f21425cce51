"""The built site in a real browser: offline, error-free, readable on phones and in both schemes.

Page-wide checks run on every page found in the built site (``page_path`` is
parametrized from it in conftest.py), so a page added later is covered
without editing this file. Chapter-specific checks follow.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browsing import DESKTOP, PHONE, Visit, readable, table
from browsing import open_page as _open

from portattn import chapter
from portattn.testing import to_numpy

_table = table


@pytest.fixture(scope="module")
def _chapter_once(shared_pages: Any) -> tuple[Any, Visit]:
    """The page the page-wide checks read at 1400 px in light (browsing.KEPT)."""
    return shared_pages.open("chapter/", DESKTOP, "light")


@pytest.fixture
def chapter_page(_chapter_once: tuple[Any, Visit], shared_pages: Any) -> tuple[Any, Visit]:
    """The chapter, opened once for all its tests; each starts in light, with the causal mask on.

    The tests click the widget, never reload: what one leaves behind (a
    selected row, the mask off, the dark scheme a scheme test switched to)
    is set back here, or read by none.
    """
    page, _ = shared_pages.open("chapter/", DESKTOP, "light")  # back from dark
    toggle = page.locator(".pa-heatmap .pa-hm-toggle")
    if toggle.get_attribute("aria-checked") != "true":
        toggle.click()
    return _chapter_once


FIGURES = "article figure, article svg, article img, article math"

# For each figure-like element: whether it is meant to be seen now (not in an
# inactive content tab, a closed <details>, or a layout for the other width),
# and its laid-out size.
_MEASURE = """els => els.map(e => {
  const tab = e.closest('.tabbed-block');
  const details = e.closest('details');
  const away = (tab && getComputedStyle(tab).display === 'none')
    || (details && !details.open && !e.closest('summary'))
    || e.closest('.md-clipboard, .headerlink, button, noscript') !== null
    || e.closest('.pa-fig-wide, .pa-fig-narrow') !== null
       && getComputedStyle(e.closest('.pa-fig-wide, .pa-fig-narrow')).display === 'none';
  const r = e.getBoundingClientRect();
  return {away, w: r.width, h: r.height, what: e.outerHTML.slice(0, 100)};
})"""


def assert_figures_drawn(page: Any) -> int:
    """Every figure, SVG, image and formula that should be visible has a non-zero size."""
    shown = [m for m in page.locator(FIGURES).evaluate_all(_MEASURE) if not m["away"]]
    empty = [m["what"] for m in shown if not (m["w"] > 0 and m["h"] > 0)]
    assert empty == [], f"drawn with zero size: {empty}"
    return len(shown)


# Elements that stick out to the right of the viewport, for the failure message.
_WIDE = """w => [...document.querySelectorAll('body *')]
  .filter(e => { const r = e.getBoundingClientRect(); return r.right > w + 1 && r.width > 0; })
  .filter(e => !e.closest('.md-sidebar, .md-search, .md-nav, [hidden]'))
  .slice(0, 5)
  .map(e => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)} `
       + (e.closest('math') ? e.closest('math').getAttribute('alttext') : ''))"""

# Colours of figure text and the background behind it, for a contrast check.
_TEXT_COLOURS = """() => {
  const parse = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const bg = e => {
    for (let p = e; p; p = p.parentElement) {
      if (p instanceof SVGElement) continue;
      const c = parse(getComputedStyle(p).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return parse(getComputedStyle(document.body).backgroundColor).slice(0, 3);
  };
  return [...document.querySelectorAll('article svg.pa-figure text')]
    .filter(t => t.textContent.trim() && t.getBoundingClientRect().width > 0)
    .filter(t => !t.classList.contains('pa-cell'))
    .map(t => ({fg: parse(getComputedStyle(t).fill).slice(0, 3), bg: bg(t),
                text: t.textContent.trim().slice(0, 30)}));
}"""


def _luminance(rgb: list[float]) -> float:
    def lin(c: float) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: list[float], b: list[float]) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def _size(locator: Any) -> tuple[float, float]:
    box = locator.bounding_box()
    return (0.0, 0.0) if box is None else (box["width"], box["height"])


def _shot_name(page_path: str) -> str:
    return page_path.strip("/").replace("/", "-") or "home"


# -- every page -----------------------------------------------------------------


# Each page is loaded once per width (1400 and 390 px), in a browser context
# shared across pages (conftest.py ``layouts``), read in light, then switched
# to dark and read again (browsing.SharedPages): every check runs in both
# schemes, on half the loads.

_CLIPPED_MATH = """() => [...document.querySelectorAll('.pa-math-block')]
    .filter(b => b.getBoundingClientRect().width > 0)
    .filter(b => b.scrollWidth > b.clientWidth + 1)
    .map(b => b.querySelector('math').getAttribute('alttext').slice(0, 60))"""


def _assert_contrast(page: Any, scheme: str) -> None:
    """Figure text reads on this scheme's background (WCAG large-text 3:1)."""
    poor = [
        (c["text"], c["fg"], c["bg"])
        for c in page.evaluate(_TEXT_COLOURS)
        if contrast(c["fg"], c["bg"]) < 3
    ]
    assert poor == [], f"figure text with contrast below 3:1 in {scheme}: {poor[:5]}"


def _screenshot(page: Any, screenshots: Path | None, name: str) -> None:
    if screenshots is not None:  # PORTATTN_SCREENSHOTS=1
        (screenshots / name).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshots / name), full_page=True)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_page_loads_offline_in_both_schemes(
    shared_pages: Any, screenshots: Path | None, page_path: str, scheme: str
) -> None:
    page, visit = shared_pages.open(page_path, DESKTOP, scheme)
    try:
        visit.assert_clean()
        assert page.locator("article h1").count() == 1
        assert_figures_drawn(page)
        want = "slate" if scheme == "dark" else "default"
        assert page.locator("body").get_attribute("data-md-color-scheme") == want
        # The toggle is there, in the header.
        assert page.locator("form[data-md-component=palette] label").count() >= 1
        _assert_contrast(page, scheme)
        # Display formulas fit their box at desktop width (none clipped or scrolling).
        clipped = page.evaluate(_CLIPPED_MATH)
        assert clipped == [], f"display formulas wider than the page at {DESKTOP} px: {clipped}"
        readable(page)
        if scheme == "light":  # the layout is the scheme's; checked once, not twice
            assert_code_titles_and_copy_buttons(page)
            if page_path.strip("/").split("/")[-1] in TEACHING:
                assert_exercises_fold(page)
        _screenshot(page, screenshots, f"{_shot_name(page_path)}-{scheme}.png")
    finally:
        shared_pages.done(page_path, DESKTOP, scheme)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_page_fits_a_phone(
    shared_pages: Any, screenshots: Path | None, page_path: str, scheme: str
) -> None:
    page, visit = shared_pages.open(page_path, PHONE, scheme)
    try:
        visit.assert_clean()
        want = "slate" if scheme == "dark" else "default"
        assert page.locator("body").get_attribute("data-md-color-scheme") == want
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE, (
            f"page is {width} px wide at {PHONE} px: {page.evaluate(_WIDE, PHONE)}"
        )
        readable(page)
        if scheme == "dark":  # the phone layout's own figures, on the dark background
            _assert_contrast(page, scheme)
        # Display formulas are scaled to the column (docs/assets/widgets.js), not cut.
        cut = page.evaluate(_CLIPPED_MATH)
        assert cut == [], f"display formulas wider than the column at {PHONE} px: {cut}"
        _screenshot(page, screenshots, f"390/{_shot_name(page_path)}-{scheme}.png")
    finally:
        shared_pages.done(page_path, PHONE, scheme)


# Pages that end with exercises (docs/_gen/sitegen/exercises.py), in both languages.
TEACHING = {"chapter", "beyond", "learned", "serving", "parallel"}

_EXERCISES = """() => [...document.querySelectorAll('article details.question')].map(d => {
  const summary = d.querySelector('summary');
  const body = [...d.children].filter(c => c !== summary);
  return {open: d.open, answer: body.map(c => c.textContent).join(' ').trim(),
          shown: body.some(c => c.checkVisibility())};
})"""


def assert_exercises_fold(page: Any) -> None:
    """Two or three exercises, each answer present but folded away until its summary is clicked."""
    folded = page.evaluate(_EXERCISES)
    assert 2 <= len(folded) <= 3, folded
    for answer in folded:
        assert not answer["open"] and not answer["shown"] and answer["answer"], answer
    summary = page.locator("article details.question summary").first
    summary.click()
    opened = page.evaluate(_EXERCISES)[0]
    assert opened["open"] and opened["shown"], opened
    summary.click()  # folded again: the page is read next in the dark scheme
    assert not page.evaluate(_EXERCISES)[0]["open"]


def assert_code_titles_and_copy_buttons(page: Any) -> None:
    """Quoted source is titled with its repository path, and no copy button sits on code."""
    titles = page.locator("article .highlight .filename").all_inner_texts()
    for title in titles:
        assert "site-packages" not in title, title
        if title.endswith(".py") or ".py," in title:
            assert re.match(r"src/portattn/\S+\.py, (line \d+|lines \d+ to \d+)$", title), title
    overlaps = page.evaluate(
        """() => {
          const bad = [];
          for (const pre of document.querySelectorAll('article pre')) {
            const button = pre.querySelector('.md-clipboard, .md-code__button');
            const code = pre.querySelector('code');
            if (!button || !code || button.getBoundingClientRect().width === 0) continue;
            const b = button.getBoundingClientRect();
            const range = document.createRange();
            range.selectNodeContents(code);
            for (const r of range.getClientRects()) {
              if (r.width === 0) continue;
              const across = r.left < b.right && r.right > b.left;
              if (across && r.top < b.bottom && r.bottom > b.top) {
                bad.push(code.textContent.slice(0, 40));
                break;
              }
            }
          }
          return bad;
        }"""
    )
    assert overlaps == [], f"copy button over code text: {overlaps}"


# -- the chapter ----------------------------------------------------------------


def test_chapter_math_is_rendered(chapter_page: tuple[Any, Visit]) -> None:
    page, visit = chapter_page
    visit.assert_clean()
    maths = page.locator("article math")
    assert maths.count() > 10
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


def test_parentheses_stretch_around_fractions(chapter_page: tuple[Any, Visit]) -> None:
    page, _ = chapter_page
    pairs = page.evaluate(
        """() => [...document.querySelectorAll('article math mo')]
            .filter(mo => mo.textContent.trim() === '('
                    && mo.nextElementSibling && mo.nextElementSibling.tagName === 'mfrac')
            .map(mo => ({paren: mo.getBoundingClientRect().height,
                         frac: mo.nextElementSibling.getBoundingClientRect().height}))
            .filter(p => p.frac > 0)"""
    )
    assert pairs, "no parenthesised fraction found on the chapter"
    for p in pairs:
        assert p["paren"] >= 0.8 * p["frac"], f"parenthesis does not stretch: {p}"


def _grid(page: Any, root: str = ".pa-heatmap") -> tuple[np.ndarray, list[list[str]]]:
    cells = page.locator(f"{root} .pa-hm-cell")
    n = len(chapter.DEMO_TOKENS)
    assert cells.count() == n * n
    weights = np.zeros((n, n))
    texts = [["" for _ in range(n)] for _ in range(n)]
    for c in cells.all():
        i, j = int(c.get_attribute("data-row")), int(c.get_attribute("data-col"))
        weights[i, j] = float(c.get_attribute("data-weight"))
        texts[i][j] = c.inner_text().strip()
    return weights, texts


_CELL_STYLE = """cells => cells.map(c => ({
  row: +c.dataset.row, col: +c.dataset.col,
  image: getComputedStyle(c).backgroundImage, colour: getComputedStyle(c).backgroundColor}))"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_masked_cells_are_distinguishable(
    chapter_page: tuple[Any, Visit], shared_pages: Any, scheme: str
) -> None:
    """Hatched by computed style, with a colour no weight can have, and no number."""
    page, visit = (
        chapter_page if scheme == "light" else shared_pages.open("chapter/", DESKTOP, scheme)
    )
    styles = page.locator(".pa-heatmap .pa-hm-cell").evaluate_all(_CELL_STYLE)
    masked = [s for s in styles if s["col"] > s["row"]]
    seen = [s for s in styles if s["col"] <= s["row"]]
    assert len(masked) == 10
    assert all("repeating-linear-gradient" in s["image"] for s in masked), masked[:2]
    assert all(s["image"] == "none" for s in seen), seen[:2]
    assert {s["colour"] for s in masked}.isdisjoint({s["colour"] for s in seen})
    _, texts = _grid(page)
    assert all(texts[s["row"]][s["col"]] == "—" for s in masked)
    # A colour scale is shown with the widget.
    scale = page.locator(".pa-heatmap .pa-hm-scale")
    assert scale.is_visible() and "100%" in scale.inner_text()
    # Shown once: no second copy of the same heatmap outside the widget.
    assert page.locator("article svg.pa-heatmap-static:visible").count() == 0
    visit.assert_clean()


def test_widget_mask_toggle_zeroes_upper_triangle(chapter_page: tuple[Any, Visit]) -> None:
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
    assert all(texts[i][j] == "—" for i, j in zip(*upper, strict=True))
    np.testing.assert_allclose(on, to_numpy(chapter.demo_weights(causal=True)), rtol=1e-6)
    visit.assert_clean()


def _percentages(sentence: str) -> dict[str, int]:
    return {tok: int(p) for tok, p in re.findall(r"(\w+) (\d+)%", sentence)}


@pytest.mark.parametrize("causal", [True, False])
def test_clicking_sat_reads_its_row(chapter_page: tuple[Any, Visit], causal: bool) -> None:
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


def test_static_fallback_without_javascript(browser: Any, base_url: str) -> None:
    page, visit = _open(browser, f"{base_url}/chapter/", javascript=False)
    try:
        assert visit.outside == []
        stills = page.locator(".pa-heatmap noscript svg, .pa-heatmap svg.pa-heatmap-static")
        assert stills.count() == 2  # mask on and mask off
        w, h = _size(stills.first)
        assert w > 10 and h > 10
        # The mask-on still hatches exactly the upper triangle, and says so in its scale.
        hatched = stills.first.locator("rect.pa-masked-cell")
        assert hatched.count() == 10
        assert all(
            f.startswith("url(#")
            for f in hatched.evaluate_all("r => r.map(x => x.getAttribute('fill'))")
        )
        assert stills.nth(1).locator("rect.pa-masked-cell").count() == 0
        assert stills.first.locator("linearGradient").count() == 1
        assert page.locator(".pa-heatmap .pa-hm-cell").count() == 0
        assert page.locator(".pa-playground noscript table").count() == 1
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


def test_sqrt_d_tables_are_captioned_and_distinct(chapter_page: tuple[Any, Visit]) -> None:
    page, _ = chapter_page
    captions = page.locator("table[data-pa-table^=scaling] caption").all_inner_texts()
    assert len(captions) == 2 and captions[0] != captions[1]
    assert captions[0].startswith("Table 1") and captions[1].startswith("Table 2")
    constant, scaled = _table(page, "scaling-constant"), _table(page, "scaling-scaled")
    assert [r[0] for r in constant] == ["8", "32", "64", "256"]
    assert constant != scaled
    # No column repeats one value in every row (the old "uniform" column).
    for col in zip(*constant, strict=True):
        assert len(set(col)) > 1, col
    from sitegen import figures

    want = [[str(r.d), f"{r.unscaled:.3f}", f"{r.scaled:.3f}"] for r in figures.scaling("constant")]
    assert [row[:3] for row in constant] == want


def test_japanese_chapter_has_the_same_numbers(
    chapter_page: tuple[Any, Visit], shared_pages: Any
) -> None:
    en, _ = chapter_page
    ja, visit = shared_pages.open("ja/chapter/", DESKTOP, "light")
    visit.assert_clean()
    assert ja.locator("html").get_attribute("lang") == "ja"
    assert re.search(r"[\u3040-\u30ff]", ja.locator("article").inner_text())
    for name in ("scaling-constant", "scaling-scaled"):
        ours = _table(ja, name)
        assert ours, f"no computed √d table {name} on the Japanese chapter"
        assert ours == _table(en, name)
    # The language switcher on the English page leads to the Japanese one.
    assert en.locator('a[hreflang="ja"]').count() >= 1
    # Figures carry Japanese text.
    svg_text = ja.evaluate(
        "[...document.querySelectorAll('article svg text')].map(t => t.textContent).join(' ')"
    )
    assert re.search(r"[\u3040-\u30ff]", svg_text)


def test_playground_follows_the_controls(chapter_page: tuple[Any, Visit]) -> None:
    """No other test on the shared chapter page moves the playground: it starts as loaded."""
    from sitegen.playground import DIMS, state

    page, visit = chapter_page
    root = page.locator(".pa-playground")
    assert root.get_attribute("data-state") == "constant/64/unscaled"
    # The grid has the chapter widget's colour scale, without a mask swatch (nothing is masked).
    scale = root.locator(".pa-hm-scale")
    assert scale.is_visible() and "100%" in scale.inner_text()
    assert scale.locator(".pa-hm-scale-mask").count() == 0
    # Keyboard only: the slider to its largest width.
    page.locator(".pa-playground input[type=range]").focus()
    page.keyboard.press("End")
    assert root.get_attribute("data-state") == f"constant/{DIMS[-1]}/unscaled"
    w, _ = _grid(page, ".pa-playground")
    np.testing.assert_allclose(w, state("constant", DIMS[-1], scaled=False)["weights"])
    # Arrow keys move through a radio group: unscaled -> scaled.
    page.locator(".pa-playground input[value=unscaled]").focus()
    page.keyboard.press("ArrowRight")
    assert root.get_attribute("data-state") == f"constant/{DIMS[-1]}/scaled"
    assert root.locator("polyline.pa-pg-scaled.pa-pg-chosen").count() == 1
    page.locator(".pa-playground label", has_text="1/d").click()
    assert root.get_attribute("data-state") == f"scaled/{DIMS[-1]}/scaled"
    w, _ = _grid(page, ".pa-playground")
    np.testing.assert_allclose(w, state("scaled", DIMS[-1], scaled=True)["weights"])
    visit.assert_clean()


def test_live_head_equals_portattn(chapter_page: tuple[Any, Visit]) -> None:
    """The page's forward pass (docs/assets/live.js) is portattn's, on 20 random sentences."""
    from sitegen import live

    page, visit = chapter_page
    rng = np.random.default_rng(30)
    worst = 0.0
    for k in range(20):
        n = int(rng.integers(1, 10))
        tokens = [live.VOCABULARY[int(i)] for i in rng.integers(0, len(live.VOCABULARY), n)]
        causal = k % 2 == 0
        got = page.evaluate("([t, c]) => window.portattnLive.forward(t, c)", [tokens, causal])
        weights, out = live.forward(tokens, causal=causal)
        for name, ours in (("weights", weights), ("out", out)):
            err = float(np.max(np.abs(np.asarray(got[name]) - ours)))
            assert err <= 1e-6, (tokens, causal, name, err)
            worst = max(worst, err)
    print(f"live head: largest |page - portattn| over 20 sentences = {worst:.1e}")
    # Typing redraws the grid with those numbers; a word outside the vocabulary is named.
    box = page.locator(".pa-live-input")
    box.fill("the bird saw a big red ball")
    cells = page.locator(".pa-live .pa-hm-cell").evaluate_all(
        "cs => cs.map(c => [+c.dataset.row, +c.dataset.col, +c.dataset.weight])"
    )
    weights, _ = live.forward(["the", "bird", "saw", "a", "big", "red", "ball"], causal=True)
    assert len(cells) == weights.size
    for i, j, w in cells:
        assert abs(w - weights[i, j]) <= 1e-6
    assert page.locator(".pa-live .pa-hm-cell.pa-hm-hidden").count() == 21
    box.fill("the unicorn sat")
    assert "unicorn" in page.locator(".pa-live-said").inner_text()
    assert page.locator(".pa-live .pa-hm-cell").count() == 0
    visit.assert_clean()


def test_dataflow_shows_the_example_shapes(chapter_page: tuple[Any, Visit]) -> None:
    from sitegen.dataflow import shapes

    page, _ = chapter_page
    text = page.locator("article svg.pa-dataflow").text_content() or ""
    sh = shapes()
    for key in ("x", "s", "out"):
        assert " × ".join(map(str, sh[key])) in text, key  # noqa: RUF001


def test_beyond_floor_division_reads_as_math(shared_pages: Any) -> None:
    page, _ = shared_pages.open("beyond/", DESKTOP, "light")
    assert "/ /" not in page.locator("article").inner_text()
    assert page.locator("article math mo", has_text="⌊").count() >= 1


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_mask_gallery_reads_the_cell_under_the_pointer(shared_pages: Any, lang: str) -> None:
    """Hovering a mask picture names the query, the key, and the tile with its kind."""
    from sitegen import programmable

    import portattn as pa

    prefix = "ja/" if lang == "ja" else ""
    page, visit = shared_pages.open(f"{prefix}programmable/", DESKTOP, "light")
    panels = programmable.panels()
    for k, (q, kv) in ((0, (100, 40)), (2, (130, 45)), (5, (200, 3))):
        panel = panels[k]
        assert panel.allowed is not None and panel.block_mask is not None
        image = page.locator(f'.pa-fig-wide image[id$="-pa-gallery-{k}"]')
        box = image.bounding_box()
        assert box is not None
        n = programmable.N
        image.hover(
            position={"x": (kv + 0.5) * box["width"] / n, "y": (q + 0.5) * box["height"] / n}
        )
        said = page.locator(".pa-gallery-readout").inner_text()
        kind = panel.block_mask.tile_kind(q // programmable.BLOCK, kv // programmable.BLOCK)
        names = {
            "en": {
                pa.BlockMask.EMPTY: "empty",
                pa.BlockMask.PARTIAL: "partial",
                pa.BlockMask.FULL: "full",
            },
            "ja": {
                pa.BlockMask.EMPTY: "空",
                pa.BlockMask.PARTIAL: "一部",
                pa.BlockMask.FULL: "満杯",
            },
        }[lang]
        assert f"q_idx {q}" in said and f"kv_idx {kv}" in said, said
        seen = bool(panel.allowed[q, kv])
        if lang == "en":
            assert ("does not see" not in said) == seen, said
            assert said.endswith(f"is {names[kind]}."), said
        else:
            assert ("を見ない" not in said) == seen, said
            assert said.endswith(f"は{names[kind]}。"), said
    visit.assert_clean()
