"""The shared attention heatmap (docs/_gen/sitegen/attnmap.py), checked on its SVG (no browser)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from sitegen import attnmap
from sitegen.i18n import t

CSS = Path(__file__).resolve().parents[2] / "docs" / "assets" / "portattn.css"


def _causal(n: int) -> np.ndarray:
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def _weights(n: int, masked: np.ndarray) -> np.ndarray:
    w = np.random.default_rng(0).random((n, n))
    w[masked] = 0.0
    return w / w.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_masked_cells_are_hatched_and_keyed(lang: str) -> None:
    n = 5
    m = _causal(n)
    w = _weights(n, m)
    html = attnmap.figure(
        [attnmap.Panel(w, masked=m, title="a"), attnmap.Panel(w, masked=m)],
        lang=lang,
        name="t",
        label="x",
        caption="c",
    )
    assert 'class="pa-plot pa-attn"' in html
    wide = html[: html.index('<div class="pa-fig-narrow">')]
    for panel in (0, 1):
        group = re.search(rf'<g id="t-wide-{attnmap.MASKED_GID}-{panel}">(.*?)</g>', wide, re.S)
        assert group is not None, f"panel {panel} has no masked group"
        # One rectangle per row run of hidden keys: rows 0 .. n-2 each have one.
        paths = re.findall(r'style="fill: url\(#([^)]+)\)"', group.group(1))
        assert len(paths) == n - 1
        pattern = re.search(rf'<pattern id="{paths[0]}".*?</pattern>', wide, re.S)
        assert pattern is not None
        assert "var(--pa-mask-bg)" in pattern.group(0)
        assert "var(--pa-mask-line)" in pattern.group(0)
    # The colour bar names the weights and keys the hatch, in the page's language.
    assert t("scale_title", lang) in wide and t("masked", lang) in wide
    assert t("key_axis", lang) in wide and t("query_axis", lang) in wide
    ids = re.findall(r'id="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "ids repeat inside one figure"


def test_no_mask_no_hatch_key() -> None:
    w = np.full((3, 4), 0.25)
    html = attnmap.figure([attnmap.Panel(w)], lang="en", name="u", label="x", caption="c")
    assert attnmap.MASKED_GID not in html
    assert t("masked", "en") not in html


def test_mask_colours_differ_from_zero_weight_in_both_schemes() -> None:
    import matplotlib as mpl

    zero = mpl.colormaps[attnmap.CMAP](0.0)[:3]
    css = CSS.read_text(encoding="utf-8")
    blocks = re.findall(r"\{([^}]*--pa-mask-bg:[^}]*)\}", css)
    assert len(blocks) == 2, "one definition per colour scheme"
    for block in blocks:
        for var in ("--pa-mask-bg", "--pa-mask-line"):
            hexa = re.search(rf"{var}: (#[0-9a-fA-F]{{6}})", block)
            assert hexa is not None, var
            rgb = [int(hexa.group(1)[i : i + 2], 16) / 255 for i in (1, 3, 5)]
            assert max(abs(a - b) for a, b in zip(rgb, zero, strict=True)) > 0.2, (var, rgb)


def test_bad_shapes_are_refused() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        with pytest.raises(ValueError, match=r"masked of shape \(2, 3\).*got \(3, 2\)"):
            attnmap.draw(ax, np.zeros((2, 3)), masked=np.zeros((3, 2), bool), lang="en")
        with pytest.raises(ValueError, match=r"2-D \(Lq, Lk\).*got shape \(3,\)"):
            attnmap.draw(ax, np.zeros(3), lang="en")
    finally:
        plt.close(fig)


def test_an_outlined_row_is_drawn_around_that_row() -> None:
    svg = attnmap.figure(
        [attnmap.Panel(np.full((4, 4), 0.25), outline=2)],
        lang="en",
        name="outline",
        label="l",
        caption="c",
    )
    assert svg.count(attnmap.OUTLINE.lower()) == 2  # wide and narrow drawings
    bare = attnmap.figure(
        [attnmap.Panel(np.full((4, 4), 0.25))], lang="en", name="o", label="l", caption="c"
    )
    assert attnmap.OUTLINE.lower() not in bare


# The heatmaps of these pages, each drawn by attnmap (a ``pa-attn`` figure with
# the colour bar's title), none by a page's own imshow.
HEATMAP_PAGES = {"beyond": 4, "huggingface": 1}


@pytest.mark.parametrize("lang", ["en", "ja"])
@pytest.mark.parametrize("name", sorted(HEATMAP_PAGES))
def test_every_heatmap_on_the_page_is_drawn_by_attnmap(
    site_dir: Path, name: str, lang: str
) -> None:
    prefix = "ja/" if lang == "ja" else ""
    page = (site_dir / prefix / name / "index.html").read_text(encoding="utf-8")
    figures = re.findall(r"<figure class=\"([^\"]*)\">(.*?)</figure>", page, re.S)
    heatmaps = [body for css, body in figures if "<image" in body]
    drawn = [body for css, body in figures if "pa-attn" in css.split()]
    assert len(drawn) == HEATMAP_PAGES[name], [css for css, _ in figures]
    assert len(heatmaps) == len(drawn)
    for body in drawn:
        assert t("scale_title", lang) in body
