"""Figures for the "Beyond one head" page: matrices drawn as heatmaps, wide and stacked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import plotting


def matrix_panel(
    ax: Any, w: np.ndarray, title: str, *, labels: Sequence[str], vmax: float | None = None
) -> None:
    """One weight matrix as an image, tokens on both axes."""
    ax.imshow(w, cmap="viridis", vmin=0, vmax=vmax)
    ax.set_title(title)
    ax.set_xticks(range(w.shape[1]), labels[: w.shape[1]], rotation=90)
    ax.set_yticks(range(w.shape[0]), labels[-w.shape[0] :] if len(labels) >= w.shape[0] else labels)
    for side in ("top", "right"):
        ax.spines[side].set_visible(True)


def grid(n: int, narrow: bool, *, wide_h: float = 3.4, cols_narrow: int = 2) -> tuple[Any, Any]:
    """``n`` panels in a row on screens, ``cols_narrow`` per row on phones; flat list of axes."""
    import matplotlib.pyplot as plt

    cols = cols_narrow if narrow else n
    rows = -(-n // cols)
    height = (plotting.NARROW_IN / cols) * rows * 1.25 + 0.6 if narrow else wide_h
    fig, axes = plt.subplots(rows, cols, figsize=(plotting.width(narrow), height), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def figure(draw: Any, *, label: str, caption: str, name: str) -> str:
    """See :func:`sitegen.plotting.figure`."""
    return plotting.figure(draw, label=label, caption=caption, name=name)
