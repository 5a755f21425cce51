"""Shared figure machinery: matplotlib to inline SVG that follows the colour scheme and fits phones.

Every page's generator draws with :func:`style` and emits with :func:`figure`:

- **Both colour schemes.** Ink is drawn in sentinel colours that are then
  replaced by CSS variables (``--pa-fig-fg`` and friends, set per scheme in
  ``docs/assets/portattn.css``), and backgrounds are transparent, so one SVG
  reads on the light and on the dark page.
- **Phones.** :func:`figure` takes a function of ``narrow`` and draws the
  figure twice: a wide layout for screens and a narrow one (panels stacked,
  about 4.2 inches wide) that CSS shows below 45em. Text is never smaller
  than :data:`MIN_FONT_PT` points in either; drawn 8 inches wide on a
  ~690 px column (1400 px screens) and 4.2 inches on a ~358 px one (390 px
  phones), that is at least 11 CSS px, which the browser tests check.
- **Colour-blind-safe series.** :data:`SERIES` is the Okabe-Ito palette.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Sentinel ink colours (never used by a real series) and their CSS variables.
_INK = {
    "#0a0b0c": "var(--pa-fig-fg)",
    "#0d0e0f": "var(--pa-fig-muted)",
    "#101112": "var(--pa-fig-grid)",
    # Masked cells of attention heatmaps (sitegen.attnmap): a grey hatch per scheme.
    "#131415": "var(--pa-mask-bg)",
    "#161718": "var(--pa-mask-line)",
}
FG, MUTED, GRID, MASK_BG, MASK_LINE = _INK

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every
# common colour-vision deficiency. Black is left out (it would vanish on the
# dark scheme); the foreground ink takes its place where needed.
SERIES = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":")

MIN_FONT_PT = 10
WIDE_IN = 8.0
NARROW_IN = 4.2

# Japanese figure text needs a CJK face for matplotlib's text measurement;
# the browser draws the text with the page's own (system) fonts.
_CJK_FACES = ("Noto Sans CJK JP", "IPAexGothic", "IPAGothic", "Hiragino Sans", "Yu Gothic")


def _families() -> list[str]:
    from matplotlib import font_manager

    have = {f.name for f in font_manager.fontManager.ttflist}
    return ["DejaVu Sans", *(f for f in _CJK_FACES if f in have)]


@contextmanager
def style(**extra: Any) -> Iterator[None]:
    """matplotlib settings for site figures: text left as text, sentinel inks, no backgrounds."""
    import matplotlib as mpl

    rc = {
        "svg.fonttype": "none",
        "svg.hashsalt": "portattn",
        "font.family": _families(),
        "font.size": 11,
        "axes.titlesize": 11,
        "axes.labelsize": 11,
        "xtick.labelsize": MIN_FONT_PT,
        "ytick.labelsize": MIN_FONT_PT,
        "legend.fontsize": MIN_FONT_PT,
        "legend.frameon": False,
        "text.color": FG,
        "axes.labelcolor": FG,
        "axes.edgecolor": FG,
        "axes.titlecolor": FG,
        "xtick.color": FG,
        "ytick.color": FG,
        "grid.color": GRID,
        "axes.facecolor": "none",
        "figure.facecolor": "none",
        "savefig.transparent": True,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.prop_cycle": mpl.cycler(color=SERIES),
    }
    rc.update(extra)
    with mpl.rc_context(rc):
        yield


def _svg(fig: Any, *, label: str, salt: str) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    # Responsive: the viewBox stays, the fixed size goes.
    svg = re.sub(r'<svg ([^>]*?)width="[^"]*" height="[^"]*"', r"<svg \1", svg, count=1)
    for sentinel, var in _INK.items():
        svg = svg.replace(sentinel, var)
    # Fonts come from the page's CSS, so Japanese text uses the reader's system CJK font.
    svg = re.sub(r"font-family: [^;\"]*;? ?", "", svg)
    # Two SVGs on one page must not share clip-path ids.
    svg = re.sub(r'id="([^"]+)"', rf'id="{salt}-\1"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{salt}-\1)", svg)
    svg = re.sub(r'xlink:href="#([^"]+)"', rf'xlink:href="#{salt}-\1"', svg)
    return svg.replace(
        "<svg ", f'<svg class="pa-figure" role="img" aria-label="{html.escape(label)}" ', 1
    )


def svg(fig: Any, *, label: str, salt: str = "fig") -> str:
    """One matplotlib figure as inline, theme-aware SVG (for figures that are narrow already)."""
    return _svg(fig, label=label, salt=salt)


def figures_only(draw: Callable[[bool], Any], *, label: str, name: str) -> str:
    """The wide and the narrow drawing, without a <figure> around them.

    ``draw(narrow)`` returns a matplotlib figure; it runs inside :func:`style`.
    ``name`` keeps the two SVGs' ids apart. CSS shows one of the two.
    """
    parts = []
    for narrow in (False, True):
        with style():
            fig = draw(narrow)
        which = "narrow" if narrow else "wide"
        # The phone layout says so, so the label names one drawing on the page.
        text = f"{label} (phone layout)" if narrow else label
        parts.append(
            f'<div class="pa-fig-{which}">{_svg(fig, label=text, salt=f"{name}-{which}")}</div>'
        )
    return "".join(parts)


def figure(
    draw: Callable[[bool], Any], *, label: str, caption: str, name: str, css: str = "pa-plot"
) -> str:
    """A captioned figure drawn twice, wide for screens and narrow for phones."""
    both = figures_only(draw, label=label, name=name)
    return f'<figure class="{css}">{both}<figcaption>{caption}</figcaption></figure>'


def width(narrow: bool) -> float:
    """Figure width in inches for the layout."""
    return NARROW_IN if narrow else WIDE_IN
