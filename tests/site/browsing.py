"""Opening a page of the built site in Chromium, and reading what it shows.

Shared by the browser tests (conftest.py puts this folder on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

PHONE = 390
DESKTOP = 1400
MIN_FIGURE_PX = 11.0

# Table cells holding a number (a measurement) that the reader cannot see
# without scrolling, and whose table does not say it scrolls: the cell lies
# right of the viewport or of a box that clips it, and the nearest scrolling
# box is not marked ``data-pa-scrolls`` with its visible cue
# (docs/assets/widgets.js adds both).
HIDDEN_MEASUREMENTS = """() => {
  const W = document.documentElement.clientWidth;
  const out = [];
  for (const td of document.querySelectorAll('article td')) {
    if (!/\\d/.test(td.textContent) || !td.checkVisibility()) continue;
    const r = td.getBoundingClientRect();
    if (r.width === 0) continue;
    let right = W, scroller = null;
    for (let p = td.parentElement; p && p !== document.body; p = p.parentElement) {
      const ox = getComputedStyle(p).overflowX;
      if (ox === 'visible') continue;
      right = Math.min(right, p.getBoundingClientRect().right);
      if (!scroller && p.scrollWidth > p.clientWidth + 1) scroller = p;
    }
    if (r.right <= right + 1) continue;
    const outer = '.md-typeset__scrollwrap, .pa-table-wrap';
    const wrap = scroller && (scroller.closest(outer) || scroller);
    const cue = wrap && wrap.previousElementSibling;
    const cued = scroller && scroller.hasAttribute('data-pa-scrolls') && cue
      && cue.classList.contains('pa-scroll-cue') && cue.checkVisibility();
    const out_by = Math.round(r.right - right);
    if (!cued) out.push(`${td.textContent.trim().slice(0, 24)} (${out_by} px out)`);
  }
  return out;
}"""

# The smallest rendered text in figures: SVG text scaled by its transform to
# the screen, and HTML text inside figures at its computed size.
SMALLEST_TEXT = """() => {
  const out = [];
  const visible = e => {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) return false;
    for (let p = e; p; p = p.parentElement) {
      const cs = getComputedStyle(p);
      if (cs.display === 'none' || cs.visibility === 'hidden') return false;
    }
    return true;
  };
  for (const t of document.querySelectorAll('article svg text, article svg tspan')) {
    if (!t.textContent.trim() || !visible(t)) continue;
    const m = t.getScreenCTM();
    const scale = Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
    out.push({px: parseFloat(getComputedStyle(t).fontSize) * scale,
              text: t.textContent.trim().slice(0, 30)});
  }
  for (const f of document.querySelectorAll('article figure')) {
    const walker = document.createTreeWalker(f, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const e = n.parentElement;
      if (!n.textContent.trim() || e.closest('svg, noscript, script') || !visible(e)) continue;
      out.push({px: parseFloat(getComputedStyle(e).fontSize),
                text: n.textContent.trim().slice(0, 30)});
    }
  }
  out.sort((a, b) => a.px - b.px);
  return out.slice(0, 5);
}"""


@dataclass
class Visit:
    """What a page did while it loaded and since: console errors, uncaught exceptions, requests.

    Lists fill as events arrive, so a request made after the page loaded (a
    timer, a click) is caught by the next :meth:`assert_clean`.
    """

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        # Outside requests first: the one refused also logs a console error
        # (net::ERR_NAME_NOT_RESOLVED), which names no address.
        assert self.outside == [], f"requests left 127.0.0.1: {self.outside}"
        assert self.console_errors == [], self.console_errors
        assert self.page_errors == [], self.page_errors
        assert self.requests, "the page made no request at all"


# Material fetches the whole search index (both editions, about 0.6 MB) on
# every page and indexes it in a worker, Japanese segmenter included: seconds
# of CPU per page that only the search test needs. The test server
# (conftest.py) answers other pages with an index that has the site's own
# configuration and no documents; a context opened with ``search=True``
# carries the cookie that asks it for the real one.
SEARCH_INDEX = "/search/search_index.json"
SEARCH_COOKIE = "pa-search"

# Chromium resolves no host name but 127.0.0.1's: a page that asks for
# anything outside fails to load it, whatever the listeners below see. The
# requests are watched, not routed: a routed context loses its HTTP cache, and
# every page would fetch Material's stylesheets and scripts again.
OFFLINE_ARGS = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


def _outside(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme not in {"data", "blob", "about"} and parts.hostname != "127.0.0.1"


def new_context(
    browser: Any,
    *,
    javascript: bool = True,
    width: int = 1280,
    scheme: str = "light",
    search: bool = False,
) -> Any:
    """A browser context with one layout; pages opened in it share its HTTP cache.

    Every request that leaves 127.0.0.1 from anything in the context (a page,
    its workers) is listed in :data:`_OUTSIDE`, which :func:`open_page` reads.
    """
    context = browser.new_context(
        java_script_enabled=javascript,
        viewport={"width": width, "height": 900},
        color_scheme=scheme,
    )
    if search:
        context.add_cookies([{"name": SEARCH_COOKIE, "value": "1", "url": "http://127.0.0.1"}])
    seen = _OUTSIDE.setdefault(id(context), [])
    context.on("request", lambda r: _outside(r.url) and seen.append(r.url))
    return context


_OUTSIDE: dict[int, list[str]] = {}


def open_page(
    browser: Any,
    url: str,
    *,
    javascript: bool = True,
    width: int = 1280,
    scheme: str = "light",
    context: Any = None,
    search: bool = False,
) -> tuple[Any, Visit]:
    """Open ``url`` and wait for it to load; what it requests is in the returned Visit.

    Without ``context`` the page gets a context of its own (close it with
    ``page.context.close()``); with one (from :func:`new_context`, laid out
    already) the page is opened in it and the caller closes only the page.
    ``search=True`` (own context only) serves the real search index (see
    :data:`SEARCH_INDEX`).
    """
    if context is None:
        context = new_context(
            browser, javascript=javascript, width=width, scheme=scheme, search=search
        )
    page = context.new_page()
    visit = Visit()
    # The context's list, shared: requests from the page's workers land there.
    visit.outside = _OUTSIDE.setdefault(id(context), [])

    page.on("request", lambda r: visit.requests.append(r.url))
    page.on("console", lambda m: m.type == "error" and visit.console_errors.append(m.text))
    page.on("pageerror", lambda e: visit.page_errors.append(str(e)))
    # "load": every stylesheet, script and image is in, and the scripts have
    # run (the pages' widgets fetch nothing later; Material's search worker
    # fetches its index, which the test server answers at once).
    page.goto(url, wait_until="load")
    page.evaluate("document.fonts.ready.then(() => true)")
    return page, visit


def table(page: Any, name: str) -> list[list[str]]:
    return page.locator(f'table[data-pa-table="{name}"] tbody tr').evaluate_all(
        "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))"
    )


# Cells the mask hides, on every heatmap of the page, that could be read as a
# weight of 0: the HTML grids (chapter widget, playground) must hatch them on
# a colour viridis never takes at 0 (#440154), and the SVG heatmaps drawn by
# docs/_gen/sitegen/attnmap.py must fill them with the hatch pattern.
MASKED_LIKE_ZERO = """() => {
  const zero = 'rgb(68, 1, 84)';
  const bad = [];
  for (const c of document.querySelectorAll('article .pa-hm-cell.pa-hm-hidden')) {
    const cs = getComputedStyle(c);
    if (!cs.backgroundImage.includes('repeating-linear-gradient') || cs.backgroundColor === zero)
      bad.push(`grid cell ${c.dataset.row},${c.dataset.col}: ${cs.backgroundColor}`);
  }
  for (const g of document.querySelectorAll('article svg [id*="pa-attn-masked"]')) {
    for (const p of g.querySelectorAll('path')) {
      const fill = getComputedStyle(p).fill;
      if (!fill.startsWith('url(')) bad.push(`${g.id}: fill ${fill}`);
    }
  }
  return {bad: bad.slice(0, 5),
          count: document.querySelectorAll(
            'article .pa-hm-cell.pa-hm-hidden, article svg [id*="pa-attn-masked"] path').length};
}"""


def readable(page: Any) -> None:
    """No hidden measurement, no figure text below MIN_FIGURE_PX, no masked cell read as 0."""
    hidden = page.evaluate(HIDDEN_MEASUREMENTS)
    assert hidden == [], f"measurements off-screen with no scroll cue: {hidden[:5]}"
    smallest = page.evaluate(SMALLEST_TEXT)
    if smallest:
        assert smallest[0]["px"] >= MIN_FIGURE_PX, (
            f"figure text below {MIN_FIGURE_PX} px: {smallest}"
        )
    masked = page.evaluate(MASKED_LIKE_ZERO)
    assert masked["bad"] == [], f"masked cells drawn like a 0 weight: {masked['bad']}"


# Pages that a later test reads at the same width as the page-wide checks of
# test_site.py: those checks open them first and leave them open, and the
# later test reads the same page instead of loading it again. A test run alone
# (``-k``) opens its page itself. (path, width)
KEPT = {
    ("chapter/", DESKTOP),
    ("ja/chapter/", DESKTOP),
    ("beyond/", DESKTOP),
    ("programmable/", DESKTOP),
    ("ja/programmable/", DESKTOP),
    ("learned/", PHONE),
    ("learned/", DESKTOP),
    ("ja/learned/", PHONE),
}


class SharedPages:
    """Each page loaded once per width, in the scheme each test asks for, lent to every test.

    ``open(path, width, scheme)`` returns the page and its :class:`Visit`,
    loading it only if no test has left it open, and switches its colour
    scheme the way a reader's system setting does (Material follows
    ``prefers-color-scheme`` while the page is open; the widgets draw with
    the scheme's CSS variables, read nothing at load). ``done`` closes the
    page once both schemes have been read, unless it is one of :data:`KEPT`.
    A test that clicks a kept page leaves it as it was, or is the last to
    read it.
    """

    def __init__(self, layouts: Any, base_url: str) -> None:
        self._layouts = layouts
        self._base_url = base_url
        self._open: dict[tuple[str, int], tuple[Any, Visit]] = {}
        self._scheme: dict[tuple[str, int], str] = {}
        self._read: dict[tuple[str, int], set[str]] = {}

    def open(self, path: str, width: int, scheme: str) -> tuple[Any, Visit]:
        key = (path, width)
        if key not in self._open:
            url = f"{self._base_url}/{path}"
            self._open[key] = open_page(None, url, context=self._layouts(width, scheme))
            self._scheme[key] = scheme
        page, visit = self._open[key]
        if self._scheme[key] != scheme:
            page.emulate_media(color_scheme=scheme)
            want = "slate" if scheme == "dark" else "default"
            page.wait_for_function(f"document.body.dataset.mdColorScheme === '{want}'")
            self._scheme[key] = scheme
        self._read.setdefault(key, set()).add(scheme)
        return page, visit

    def done(self, path: str, width: int, scheme: str) -> None:
        key = (path, width)
        if key in KEPT or key not in self._open or self._read[key] != {"light", "dark"}:
            return
        self._open.pop(key)[0].close()

    def close(self) -> None:
        for page, _ in self._open.values():
            page.close()
        self._open.clear()
