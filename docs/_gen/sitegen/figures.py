"""Tables and figures for the chapter, computed by :mod:`portattn.chapter` while the site builds."""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence
from functools import cache

import numpy as np

from portattn import chapter
from portattn.testing import to_numpy

# The table's widths, as in the chapter, and a finer grid for the plot: half
# octaves from 2 to 512, which contains the table's widths (wider heads cost
# seconds of build time each and add nothing the curves have not shown).
TABLE_DIMS = (8, 32, 64, 256)
PLOT_DIMS = tuple(sorted({round(2 ** (k / 2)) for k in range(2, 19)}))
SEQ_LEN = 6


@cache
def scaling(init: str, dims: tuple[int, ...] = TABLE_DIMS) -> tuple[chapter.ScalingRow, ...]:
    """``chapter.scaling_table`` once per build for each (init, dims)."""
    return tuple(chapter.scaling_table(dims, seq_len=SEQ_LEN, init=init))  # type: ignore[arg-type]


def _f(x: float) -> str:
    return f"{x:.3f}"


def scaling_markdown(init: str = "constant") -> str:
    """The √d table: per width, the mean largest weight without and with ÷√d, and uniform."""
    uniform = 1 / SEQ_LEN
    lines = [
        f"| d | without ÷√d | with ÷√d | uniform (1/{SEQ_LEN}) |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.d} | {_f(r.unscaled)} | {_f(r.scaled)} | {_f(uniform)} |" for r in scaling(init)
    ]
    return "\n".join(lines) + "\n"


def scaling_numbers(init: str = "constant") -> dict[str, str]:
    """Values the prose quotes, so no sentence types a number the library computed."""
    rows = {r.d: r for r in scaling(init)}
    lo, hi = rows[min(rows)], rows[max(rows)]
    return {
        "d_lo": str(lo.d),
        "d_hi": str(hi.d),
        "unscaled_lo": _f(lo.unscaled),
        "unscaled_hi": _f(hi.unscaled),
        "scaled_lo": _f(lo.scaled),
        "scaled_hi": _f(hi.scaled),
        "uniform": _f(1 / SEQ_LEN),
    }


def _svg(fig: object, *, label: str) -> str:
    """A matplotlib figure as inline, responsive SVG with text left as text."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r'<svg ([^>]*?)width="[^"]*" height="[^"]*"', r"<svg \1", svg, count=1)
    return svg.replace(
        "<svg ", f'<svg class="pa-figure" role="img" aria-label="{html.escape(label)}" ', 1
    )


def scaling_plot() -> str:
    """Both initialisations side by side: largest weight against d, with and without ÷√d."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    colours = mpl.colormaps["viridis"]
    with mpl.rc_context(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "portattn-scaling",
            "font.size": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
        panels = (
            ("constant", f"weights N(0, {chapter.CHAPTER_STD}²) for every d"),
            ("scaled", "weights N(0, 1/d)"),
        )
        for ax, (init, title) in zip(axes, panels, strict=True):
            rows = scaling(init, PLOT_DIMS)
            d = [r.d for r in rows]
            ax.plot(
                d, [r.unscaled for r in rows], "o-", ms=3, color=colours(0.15), label="without ÷√d"
            )
            ax.plot(d, [r.scaled for r in rows], "s-", ms=3, color=colours(0.6), label="with ÷√d")
            ax.axhline(1 / SEQ_LEN, ls="--", color="0.45", lw=1, label=f"uniform, 1/{SEQ_LEN}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("head width d (log scale)")
            ax.set_title(title, fontsize=10)
            ax.set_ylim(0, 1.05)
            ax.grid(True, which="major", color="0.9", lw=0.6)
        axes[0].set_ylabel("mean largest attention weight")
        axes[0].legend(frameon=False, loc="upper left")
    return _svg(fig, label="Largest attention weight against head width, two initialisations")


# -- heatmaps -----------------------------------------------------------------


@cache
def viridis(n: int = 64) -> tuple[str, ...]:
    """``n`` evenly spaced viridis colours as hex, from matplotlib's table."""
    import matplotlib as mpl

    rgba = mpl.colormaps["viridis"](np.linspace(0.0, 1.0, n))
    return tuple("#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in px[:3])) for px in rgba)


def colour(w: float) -> tuple[str, str]:
    """Fill for weight ``w`` in [0, 1], and a text colour that stays readable on it."""
    stops = viridis()
    fill = stops[min(len(stops) - 1, max(0, round(w * (len(stops) - 1))))]
    r, g, b = (int(fill[i : i + 2], 16) / 255 for i in (1, 3, 5))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return fill, "#000000" if luminance > 0.45 else "#ffffff"


def percentages(weights: object) -> list[list[int]]:
    """``round(100 w)`` per cell, the rounding ``chapter.describe_row`` uses."""
    return [[round(100 * float(w)) for w in row] for row in to_numpy(weights)]


def heatmap_svg(tokens: Sequence[str], weights: object, *, label: str) -> str:
    """A static heatmap: rows are queries, columns keys, each cell its percentage."""
    w = to_numpy(weights).astype(np.float64)
    pct = percentages(w)
    n = len(tokens)
    cell, left, top = 46, 56, 40
    width, height = left + n * cell + 8, top + n * cell + 8
    parts = [
        f'<svg class="pa-figure pa-heatmap-static" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{html.escape(label)}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{left + n * cell / 2}" y="12" text-anchor="middle" class="pa-axis">'
        "key (attended to) →</text>",
    ]
    for j, tok in enumerate(tokens):
        parts.append(
            f'<text x="{left + j * cell + cell / 2}" y="{top - 8}" text-anchor="middle">'
            f"{html.escape(tok)}</text>"
        )
    for i, tok in enumerate(tokens):
        y = top + i * cell
        parts.append(
            f'<text x="{left - 8}" y="{y + cell / 2 + 4}" text-anchor="end">'
            f"{html.escape(tok)}</text>"
        )
        for j in range(n):
            fill, ink = colour(float(w[i, j]))
            x = left + j * cell
            parts.append(
                f'<rect x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" fill="{fill}">'
                f"<title>{html.escape(tokens[i])} → {html.escape(tokens[j])}: {pct[i][j]}%</title>"
                "</rect>"
            )
            parts.append(
                f'<text x="{x + (cell - 2) / 2}" y="{y + cell / 2 + 3}" text-anchor="middle" '
                f'fill="{ink}" class="pa-cell">{pct[i][j]}%</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def demo_heatmap(*, causal: bool) -> str:
    """The "The cat sat on mat" heatmap as a captioned static figure."""
    tokens = chapter.DEMO_TOKENS
    state = "on" if causal else "off"
    svg = heatmap_svg(
        tokens,
        chapter.demo_weights(tokens, causal=causal),
        label=f"Attention weights, causal mask {state}",
    )
    caption = (
        f"Causal mask {state}. Rows are the tokens that look (queries), columns the tokens "
        "looked at (keys); every row adds up to 100%."
    )
    return f'<figure class="pa-heatmap-figure">{svg}<figcaption>{caption}</figcaption></figure>'


# -- order and causality ------------------------------------------------------


def permutation_markdown() -> str:
    """The permutation experiment on float32 and float64, in absolute terms and in ULPs."""
    import numpy

    lines = [
        "| dtype | permutation | largest difference | in ULPs |",
        "|---|---|---:|---:|",
    ]
    for dtype in (numpy.float32, numpy.float64):
        rep = chapter.permutation_check(dtype=dtype)
        lines.append(
            f"| {numpy.dtype(dtype).name} | {rep.perm} | {rep.max_abs_diff:.3g} | {rep.max_ulp:g} |"
        )
    return "\n".join(lines) + "\n"


CAUSALITY = {"seq_len": 4, "d_model": 8}


@cache
def causality() -> chapter.CausalityReport:
    """The rewrite-the-last-token experiment, float32 on NumPy, run once per build."""
    return chapter.causality_check(**CAUSALITY)


def causality_markdown(*, causal: bool) -> str:
    """Changed bits per earlier output row after the last token is rewritten."""
    rep = causality()
    bits = rep.changed_bits_masked if causal else rep.changed_bits_unmasked
    row_bits = CAUSALITY["d_model"] * 32  # one float32 output row
    lines = [
        "| earlier output row (token) | bits changed | bits in the row |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {i} | {b} | {row_bits} |" for i, b in enumerate(bits)]
    return "\n".join(lines) + "\n"
