"""Tables and figures for the chapter page, computed by :mod:`portattn.chapter` at build time.

Every generator takes ``lang`` ("en" or "ja"): the English and the Japanese
chapter show the same numbers, with the words of :mod:`sitegen.i18n`.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from functools import cache

import numpy as np

from portattn import chapter
from portattn.testing import to_numpy

from . import plotting
from .diskcache import cache_dir, code_key, write_atomic
from .i18n import t

# The table's widths, as in the chapter, and a finer grid for the plot: half
# octaves from 2 to 512, which contains the table's widths (wider heads cost
# seconds of build time each and add nothing the curves have not shown).
TABLE_DIMS = (8, 32, 64, 256)
PLOT_DIMS = tuple(sorted({round(2 ** (k / 2)) for k in range(2, 19)}))
SEQ_LEN = 6

#: The source chapter's printed √d table (six tokens): (without ÷√d, with ÷√d)
#: per width. A quotation, not a result: it is shown beside ours and compared
#: with what portattn computes in :mod:`sitegen.sqrtd`.
CHAPTER_PRINTED = {8: (0.347, 0.228), 32: (0.799, 0.343), 64: (0.984, 0.458), 256: (1.000, 0.847)}


def _svg(fig: object, *, label: str) -> str:
    """Kept for pages written against the first edition: see :func:`sitegen.plotting.svg`."""
    return plotting.svg(fig, label=label)


@cache
def scaling(init: str, dims: tuple[int, ...] = TABLE_DIMS) -> tuple[chapter.ScalingRow, ...]:
    """``chapter.scaling_table`` once per build for each (init, dims), kept on disk between builds.

    The key is this file, portattn's source (``chapter`` included) and the
    arguments (``sitegen.diskcache``): the 32 trials per width took 16 s of a
    cold profiled build, and the browser tests ask for the table again.
    """
    key = code_key(
        __file__, libraries=("numpy", "array-api-compat"), extra=f"{init} {dims} {SEQ_LEN}"
    )
    path = cache_dir("scaling") / f"{init}-{key}.json"
    if path.is_file():
        rows = json.loads(path.read_text(encoding="utf-8"))
        return tuple(chapter.ScalingRow(int(d), float(u), float(s)) for d, u, s in rows)
    got = tuple(chapter.scaling_table(dims, seq_len=SEQ_LEN, init=init))  # type: ignore[arg-type]
    rows = [[r.d, float(r.unscaled), float(r.scaled)] for r in got]
    write_atomic(path, json.dumps(rows).encode())
    return got


def _f(x: float) -> str:
    return f"{x:.3f}"


def scaling_table(init: str = "constant", *, lang: str = "en", caption: str = "") -> str:
    """The √d table as captioned HTML; the fixed-std table carries the source chapter's values.

    ``data-pa-table`` names the table for the browser test, which compares
    the English and Japanese pages cell by cell.
    """
    with_chapter = init == "constant"
    groups = [("", 1), (t("computed", lang), 2)]
    head = [t("d", lang), t("without", lang), t("with", lang)]
    if with_chapter:
        groups.append((t("chapter_printed", lang), 2))
        head += [t("without", lang), t("with", lang)]
    rows = []
    for r in scaling(init):
        cells = [str(r.d), _f(r.unscaled), _f(r.scaled)]
        if with_chapter:
            cells += [_f(v) for v in CHAPTER_PRINTED[r.d]]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    tops = "".join(f'<th colspan="{n}">{html.escape(g)}</th>' for g, n in groups)
    ths = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return (
        f'<table data-pa-table="scaling-{init}">'
        f"<caption>{caption}</caption><thead><tr>{tops}</tr><tr>{ths}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>\n"
    )


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


def scaling_plot(*, lang: str = "en", caption: str) -> str:
    """Both initialisations, largest weight against d with and without ÷√d; stacked on phones."""
    import matplotlib.pyplot as plt

    panels = (
        ("constant", t("init_constant", lang, std=chapter.CHAPTER_STD)),
        ("scaled", t("init_scaled", lang)),
    )

    def draw(narrow: bool) -> object:
        shape = (2, 1) if narrow else (1, 2)
        size = (plotting.width(narrow), 6.4 if narrow else 3.6)
        fig, axes = plt.subplots(*shape, figsize=size, sharey=True)
        for ax, (init, title) in zip(axes, panels, strict=True):
            rows = scaling(init, PLOT_DIMS)
            d = [r.d for r in rows]
            ax.plot(d, [r.unscaled for r in rows], "o-", ms=3, label=t("without", lang))
            ax.plot(d, [r.scaled for r in rows], "s--", ms=3, label=t("with", lang))
            ax.axhline(1 / SEQ_LEN, ls=":", color=plotting.MUTED, lw=1.2)
            ax.text(
                PLOT_DIMS[-1],
                1 / SEQ_LEN - 0.025,
                t("uniform", lang, n=SEQ_LEN),
                color=plotting.MUTED,
                ha="right",
                va="top",
            )
            ax.set_xscale("log", base=2)
            ax.set_xlabel(t("width_log", lang))
            ax.set_title(title)
            ax.set_ylim(0, 1.05)
            ax.set_ylabel(t("mean_max", lang))
            ax.grid(True, which="major", lw=0.6)
        axes[0].legend(loc="upper left")
        fig.tight_layout()
        return fig

    return plotting.figure(draw, label=t("mean_max", lang), caption=caption, name=f"scaling-{lang}")


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


def heatmap_svg(
    tokens: Sequence[str],
    weights: object,
    *,
    label: str,
    masked: np.ndarray | None = None,
    lang: str = "en",
    salt: str = "hm",
) -> str:
    """A static heatmap with its colour scale: rows are queries, columns keys.

    Cells the mask hides are hatched and carry no number, so they cannot be
    mistaken for weights that round to 0%.
    """
    w = to_numpy(weights).astype(np.float64)
    pct = percentages(w)
    n = len(tokens)
    hidden = np.zeros((n, n), dtype=bool) if masked is None else np.asarray(masked, dtype=bool)
    cell, left, top = 46, 56, 40
    grid_w = n * cell
    scale_y = top + grid_w + 14
    width, height = left + grid_w + 8, scale_y + 46
    hatch, grad = f"{salt}-hatch", f"{salt}-scale"
    stops = viridis(9)
    parts = [
        f'<svg class="pa-figure pa-heatmap-static" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{html.escape(label)}" xmlns="http://www.w3.org/2000/svg">',
        "<defs>",
        f'<pattern id="{hatch}" width="7" height="7" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)">'
        '<rect width="7" height="7" class="pa-mask-bg"/>'
        '<rect width="2.5" height="7" class="pa-mask-line"/></pattern>',
        f'<linearGradient id="{grad}">'
        + "".join(
            f'<stop offset="{k / (len(stops) - 1):.3f}" stop-color="{c}"/>'
            for k, c in enumerate(stops)
        )
        + "</linearGradient></defs>",
        f'<text x="{left + grid_w / 2}" y="12" text-anchor="middle" class="pa-axis">'
        f"{html.escape(t('key_axis', lang))}</text>",
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
            x = left + j * cell
            pair = f"{html.escape(tokens[i])} → {html.escape(tokens[j])}"
            if hidden[i, j]:
                parts.append(
                    f'<rect x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" '
                    f'fill="url(#{hatch})" class="pa-masked-cell">'
                    f"<title>{pair}: {t('masked', lang)}</title></rect>"
                )
                continue
            fill, ink = colour(float(w[i, j]))
            parts.append(
                f'<rect x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" fill="{fill}">'
                f"<title>{pair}: {pct[i][j]}%</title></rect>"
                f'<text x="{x + (cell - 2) / 2}" y="{y + cell / 2 + 3}" text-anchor="middle" '
                f'fill="{ink}" class="pa-cell">{pct[i][j]}%</text>'
            )
    # The colour scale, and the hatch's meaning.
    bar_w = grid_w - 70 if hidden.any() else grid_w
    parts.append(
        f'<rect x="{left}" y="{scale_y}" width="{bar_w}" height="12" fill="url(#{grad})"/>'
        f'<text x="{left}" y="{scale_y + 28}" class="pa-axis">0%</text>'
        f'<text x="{left + bar_w}" y="{scale_y + 28}" text-anchor="end" class="pa-axis">100%</text>'
        f'<text x="{left + bar_w / 2}" y="{scale_y + 28}" text-anchor="middle" class="pa-axis">'
        f"{html.escape(t('scale_title', lang))}</text>"
    )
    if hidden.any():
        sx = left + bar_w + 12
        parts.append(
            f'<rect x="{sx}" y="{scale_y}" width="18" height="12" fill="url(#{hatch})"/>'
            f'<text x="{sx}" y="{scale_y + 28}" class="pa-axis">{t("masked", lang)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def demo_heatmap(*, causal: bool, lang: str = "en") -> str:
    """The "The cat sat on mat" heatmap as a static SVG, hatched where the mask hides keys."""
    tokens = chapter.DEMO_TOKENS
    n = len(tokens)
    masked = np.triu(np.ones((n, n), dtype=bool), k=1) if causal else None
    state = t("mask_on" if causal else "mask_off", lang)
    return heatmap_svg(
        tokens,
        chapter.demo_weights(tokens, causal=causal),
        label=state,
        masked=masked,
        lang=lang,
        salt=f"hm-{lang}-{'on' if causal else 'off'}",
    )


# -- order and causality ------------------------------------------------------


@cache
def permutation_bits() -> dict[str, int]:
    """How many output entries are bit-identical between ``head(P x)`` and ``P head(x)``.

    Float32 on NumPy, the chapter's defaults: this turns "equal up to
    rounding" into a count a reader can check.
    """
    import portattn as pa

    rep = chapter.permutation_check()
    perm = list(rep.perm)
    head = pa.Head.random(8, 8, seed=0)
    x = np.random.default_rng(10_000).standard_normal((4, 8)).astype(np.float32)
    a = np.asarray(head(x[perm]))
    b = np.asarray(head(x))[perm]
    same = int(np.sum(a.view(np.uint32) == b.view(np.uint32)))
    rows_same = int(np.sum(np.all(a.view(np.uint32) == b.view(np.uint32), axis=1)))
    return {"entries": a.size, "same": same, "rows": a.shape[0], "rows_same": rows_same}


CAUSALITY = {"seq_len": 4, "d_model": 8}


@cache
def causality() -> chapter.CausalityReport:
    """The rewrite-the-last-token experiment, float32 on NumPy, run once per build."""
    return chapter.causality_check(**CAUSALITY)


def causality_markdown(*, causal: bool, lang: str = "en") -> str:
    """Changed bits per earlier output row after the last token is rewritten."""
    rep = causality()
    bits = rep.changed_bits_masked if causal else rep.changed_bits_unmasked
    row_bits = CAUSALITY["d_model"] * 32  # one float32 output row
    head = {
        "en": "| earlier output row (token) | bits changed | bits in the row |",
        "ja": "| 前の出力行(トークン) | 変わったビット数 | 行のビット数 |",
    }[lang]
    lines = [head, "|---:|---:|---:|"]
    lines += [f"| {i} | {b} | {row_bits} |" for i, b in enumerate(bits)]
    return "\n".join(lines) + "\n"
