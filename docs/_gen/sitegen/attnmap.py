"""One way to draw attention: every heatmap of weights, scores or masks on the site comes from here.

The conventions, the same on every page and in both colour schemes:

- rows are queries, read downwards ("query ↓", 見る側), columns are keys, read
  rightwards ("key →", 見られる側), with the key labels along the top;
- one palette, viridis from 0 (dark purple) to ``vmax`` (yellow), identical in
  the light and the dark scheme;
- a colour bar under the panels, titled "attention weight" (注目の重み) unless
  the page says what else the colours mean;
- cells the mask hides are hatched grey (``--pa-mask-bg`` / ``--pa-mask-line``
  in ``portattn.css``), a colour no weight can take, so a hidden cell is never
  mistaken for a weight of 0; the colour bar shows the hatch as "masked";
- NaN cells (nothing computed there yet, e.g. keys a decoder has not
  generated) are left blank.

A page with one or more panels of the same kind calls :func:`figure`::

    from sitegen import attnmap

    panels = [attnmap.Panel(w[h], masked=~allowed, title=f"head {h}") for h in range(4)]
    print(attnmap.figure(panels, lang="en", name="heads", label="...", caption="..."))

``w[h]`` is an (Lq, Lk) array; ``masked`` is a boolean array of the same shape,
True where the mask hides the key (pass ``None`` when nothing is masked);
``queries``/``keys`` label the axes (tokens, or leave them out for indices).
The figure is drawn wide (panels in a row) and narrow (``cols_narrow`` per row)
by :func:`sitegen.plotting.figure`, and is tagged ``pa-attn`` so the browser
tests can find it. A page that lays out its own matplotlib figure calls
:func:`draw` on each axes and :func:`colour_bar` once, and wraps the result in
:func:`sitegen.plotting.figure` with ``css="pa-plot pa-attn"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import plotting
from .i18n import t

CMAP = "viridis"
#: The gid the masked cells' hatch carries in the SVG (the ids are salted per
#: figure, so the tests match it with ``[id*=...]``).
MASKED_GID = "pa-attn-masked"
WEIGHTS_GID = "pa-attn-weights"
HATCH = "////"
#: The outline of a row a panel points at (vermilion: apart from viridis and the hatch).
OUTLINE = "#D55E00"


@dataclass(frozen=True)
class Panel:
    """One heatmap: an (Lq, Lk) array, what the mask hides, a title and axis labels."""

    weights: Any
    masked: Any = None
    title: str = ""
    queries: Sequence[str] | None = None
    keys: Sequence[str] | None = None
    #: A row to outline, such as the query a decoding step has just added.
    outline: int | None = None


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True in one row, so a triangle is Lq rectangles, not Lq²/2."""
    out, j, n = [], 0, len(row)
    while j < n:
        if row[j]:
            k = j
            while k < n and row[k]:
                k += 1
            out.append((j, k - j))
            j = k
        else:
            j += 1
    return out


def _ticks(ax: Any, labels: Sequence[str] | None, n: int, axis: str) -> None:
    # Token labels when given; otherwise a few indices, never so many they collide.
    if labels is not None:
        pos, text = list(range(n)), list(labels)
    else:
        step = max(1, -(-n // 8))
        pos = list(range(0, n, step))
        text = [str(p) for p in pos]
    if axis == "x":
        ax.set_xticks(pos, text, rotation=90 if labels is not None and n > 4 else 0)
    else:
        ax.set_yticks(pos, text)


def draw(
    ax: Any,
    weights: Any,
    *,
    masked: Any = None,
    lang: str,
    title: str = "",
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
    axis_titles: bool = True,
    outline: int | None = None,
) -> Any:
    """Draw one heatmap on ``ax`` the site's way; returns the image, for :func:`colour_bar`."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        msg = f"expected a 2-D (Lq, Lk) array of weights, got shape {w.shape}"
        raise ValueError(msg)
    hidden = np.zeros(w.shape, dtype=bool) if masked is None else np.asarray(masked, dtype=bool)
    if hidden.shape != w.shape:
        msg = f"expected masked of shape {w.shape} (the weights' shape), got {hidden.shape}"
        raise ValueError(msg)
    shown = np.where(hidden, np.nan, w)
    image = ax.imshow(
        shown, cmap=CMAP, vmin=vmin, vmax=vmax, interpolation="nearest", aspect="equal"
    )
    # One id per panel: SVG ids must be unique within the page.
    k = ax.figure.axes.index(ax)
    image.set_gid(f"{WEIGHTS_GID}-{k}")
    rects = [
        Rectangle((j - 0.5, i - 0.5), length, 1.0)
        for i in range(w.shape[0])
        for j, length in _runs(hidden[i])
    ]
    if rects:
        coll = PatchCollection(
            rects,
            facecolor=plotting.MASK_BG,
            edgecolor=plotting.MASK_LINE,
            linewidth=0,
            hatch=HATCH,
        )
        coll.set_gid(f"{MASKED_GID}-{k}")
        ax.add_collection(coll)
    if outline is not None:
        ax.add_patch(
            Rectangle(
                (-0.5, outline - 0.5), w.shape[1], 1.0, fill=False, edgecolor=OUTLINE, linewidth=2.5
            )
        )
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    _ticks(ax, keys, w.shape[1], "x")
    _ticks(ax, queries, w.shape[0], "y")
    ax.tick_params(length=0)
    if axis_titles:
        ax.set_xlabel(t("key_axis", lang))
        ax.set_ylabel(t("query_axis", lang))
    if title:
        # The title goes below: the key labels and their axis title are on top.
        ax.set_title(title, y=-0.02, va="top", pad=4)
    for side in ax.spines.values():
        side.set_visible(False)
    return image


def colour_bar(
    fig: Any,
    axes: Any,
    image: Any,
    *,
    lang: str,
    masked: bool,
    label: str | None = None,
) -> None:
    """One horizontal colour bar under ``axes``; a hatched "masked" swatch if cells are hidden."""
    from matplotlib.patches import Rectangle

    bar = fig.colorbar(image, ax=axes, orientation="horizontal", fraction=0.05, pad=0.08, aspect=40)
    bar.set_label(label if label is not None else t("scale_title", lang))
    bar.outline.set_visible(False)
    if masked:
        # The swatch sits just right of the bar, in the bar's own coordinates.
        bar.ax.add_patch(
            Rectangle(
                (1.03, 0.0),
                0.06,
                1.0,
                transform=bar.ax.transAxes,
                clip_on=False,
                facecolor=plotting.MASK_BG,
                edgecolor=plotting.MASK_LINE,
                linewidth=0,
                hatch=HATCH,
                gid=MASKED_GID + "-key",
            )
        )
        bar.ax.text(
            1.12, 0.5, t("masked", lang), transform=bar.ax.transAxes, va="center", ha="left"
        )


def figure(
    panels: Sequence[Panel],
    *,
    lang: str,
    name: str,
    label: str,
    caption: str,
    cols_narrow: int = 2,
    vmin: float = 0.0,
    vmax: float = 1.0,
    scale_label: str | None = None,
    panel_in: float = 2.2,
) -> str:
    """A captioned figure of heatmap panels in a row (wide) or ``cols_narrow`` per row (phones)."""
    import matplotlib.pyplot as plt

    any_masked = any(p.masked is not None and np.asarray(p.masked).any() for p in panels)

    def draw_all(narrow: bool) -> Any:
        n = len(panels)
        cols = min(n, cols_narrow) if narrow else n
        rows = -(-n // cols)
        width = plotting.width(narrow)
        each = min(panel_in, width / cols)
        fig, axes = plt.subplots(
            rows, cols, figsize=(width, each * rows + 0.9), squeeze=False, layout="constrained"
        )
        flat = list(axes.flat)
        image = None
        for k, (ax, p) in enumerate(zip(flat, panels, strict=False)):
            image = draw(
                ax,
                p.weights,
                masked=p.masked,
                lang=lang,
                title=p.title,
                queries=p.queries,
                keys=p.keys,
                vmin=vmin,
                vmax=vmax,
                # Axis titles once per row and column, not on every panel.
                axis_titles=k == 0,
                outline=p.outline,
            )
        for ax in flat[n:]:
            ax.set_visible(False)
        colour_bar(fig, flat[:n], image, lang=lang, masked=any_masked, label=scale_label)
        return fig

    return plotting.figure(draw_all, label=label, caption=caption, name=name, css="pa-plot pa-attn")
