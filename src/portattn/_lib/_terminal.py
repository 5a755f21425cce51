"""Attention weights drawn in a terminal, for the CLI and its subcommands."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["heatmap"]

# viridis, 8 steps, as 256-colour ANSI codes (dark purple -> yellow)
_VIRIDIS_256 = (53, 54, 61, 24, 30, 35, 77, 190)


def heatmap(tokens: Sequence[str], weights: np.ndarray, *, color: bool) -> str:
    """Weights as a grid of percentages, one row per query token, optionally viridis-shaded."""
    width = max(4, *(len(t) for t in tokens)) + 1
    lines = [" " * width + "".join(f"{t:>{width}}" for t in tokens)]
    for tok, row in zip(tokens, weights, strict=True):
        cells = []
        for p in row:
            text = f"{round(100 * float(p)):>{width - 1}d}%"
            if color:
                shade = _VIRIDIS_256[min(7, int(float(p) * 8))]
                fg = 16 if shade == 190 else 231
                text = f"\x1b[48;5;{shade}m\x1b[38;5;{fg}m{text}\x1b[0m"
            cells.append(text)
        lines.append(f"{tok:>{width}}" + "".join(cells))
    return "\n".join(lines)
