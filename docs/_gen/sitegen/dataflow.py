"""The data-flow figure: one head's computation as boxes, with the worked example's shapes.

Nothing is typed: the example is run here with portattn and NumPy, and each
box shows the shape of the array that step really produced.
"""

from __future__ import annotations

import html
import re

import numpy as np

import portattn as pa
from portattn import chapter

EXAMPLE_TOKENS = ("The", "cat", "sat")
D_MODEL, D_HEAD = 4, 2

_WORDS = {
    "en": {
        "x": "X: one row per token",
        "proj": "projections",
        "scores": "S = Q Kᵀ",
        "scale": "÷ √d  (d = {d})",
        "mask": "causal mask: j > i → −∞",  # noqa: RUF001
        "softmax": "softmax, row by row",
        "mix": "A · V",
        "out": "output",
        "rows": "rows sum to 1",
        "label": "Data flow of one attention head with the shapes of the worked example",
    },
    "ja": {
        "x": "X: トークンごとに1行",
        "proj": "射影",
        "scores": "S = Q Kᵀ",
        "scale": "÷ √d(d = {d})",
        "mask": "因果マスク: j > i を −∞",  # noqa: RUF001
        "softmax": "行ごとの softmax",
        "mix": "A · V",
        "out": "出力",
        "rows": "各行の和は 1",
        "label": "1つの attention ヘッドのデータの流れと、例の配列の形",
    },
}


def shapes() -> dict[str, tuple[int, ...]]:
    """The shape of every intermediate of the worked example, as computed."""
    x = np.asarray(chapter.demo_embeddings(EXAMPLE_TOKENS, d_model=D_MODEL))
    head = pa.Head.random(D_MODEL, D_HEAD, seed=0)
    wq, wk, wv = (np.asarray(w) for w in (head.wq, head.wk, head.wv))
    q, k, v = x @ wq, x @ wk, x @ wv
    s = q @ k.T
    scaled = s / np.sqrt(head.d_head)
    masked = np.where(np.tril(np.ones(s.shape, dtype=bool)), scaled, -np.inf)
    a = np.asarray(pa.softmax(masked, axis=-1))
    out = a @ v
    return {
        "x": x.shape,
        "wq": wq.shape,
        "wk": wk.shape,
        "wv": wv.shape,
        "q": q.shape,
        "k": k.shape,
        "v": v.shape,
        "s": s.shape,
        "scaled": scaled.shape,
        "masked": masked.shape,
        "a": a.shape,
        "out": out.shape,
        "d": (head.d_head,),
    }


def _dims(shape: tuple[int, ...]) -> str:
    return " × ".join(str(n) for n in shape)  # noqa: RUF001


def dataflow_svg(*, lang: str = "en") -> str:
    """The figure, as inline SVG drawn in the page's colours (both schemes)."""
    w = _WORDS[lang]
    sh = shapes()
    W, box_h, gap = 360, 46, 22
    parts: list[str] = []

    def box(x: float, y: float, bw: float, title: str, sub: str, cls: str = "") -> None:
        parts.append(
            f'<g class="pa-df-box {cls}">'
            f'<rect x="{x}" y="{y}" width="{bw}" height="{box_h}" rx="7"/>'
            f'<text x="{x + bw / 2}" y="{y + 19}" text-anchor="middle" class="pa-df-title">'
            f"{_subscripts(html.escape(title))}</text>"
            f'<text x="{x + bw / 2}" y="{y + 37}" text-anchor="middle" class="pa-df-shape">'
            f"{html.escape(sub)}</text></g>"
        )

    def arrow(x1: float, y1: float, x2: float, y2: float) -> None:
        parts.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" class="pa-df-arrow" '
            'marker-end="url(#pa-df-head)"/>'
        )

    y = 8
    box(100, y, 160, w["x"], _dims(sh["x"]))
    y1 = y + box_h + gap + 8
    cols = ((8, "Q", "wq", "q"), (128, "K", "wk", "k"), (248, "V", "wv", "v"))
    for cx, name, wname, aname in cols:
        arrow(180, y + box_h, cx + 52, y1 - 2)
        box(cx, y1, 104, f"{name} = X W_{name}", f"{_dims(sh[wname])} → {_dims(sh[aname])}")
    y2 = y1 + box_h + gap
    arrow(60, y1 + box_h, 150, y2 - 2)
    arrow(180, y1 + box_h, 170, y2 - 2)
    box(90, y2, 160, w["scores"], _dims(sh["s"]))
    y3 = y2 + box_h + gap
    arrow(170, y2 + box_h, 170, y3 - 2)
    box(90, y3, 160, w["scale"].format(d=sh["d"][0]), _dims(sh["scaled"]), "pa-df-key")
    y4 = y3 + box_h + gap
    arrow(170, y3 + box_h, 170, y4 - 2)
    box(40, y4, 260, w["mask"], _dims(sh["masked"]), "pa-df-key")
    y5 = y4 + box_h + gap
    arrow(170, y4 + box_h, 170, y5 - 2)
    box(90, y5, 160, w["softmax"], f"A: {_dims(sh['a'])}, {w['rows']}")
    y6 = y5 + box_h + gap
    arrow(170, y5 + box_h, 170, y6 - 2)
    # V bypasses the score steps and joins at the mixing step.
    parts.append(
        f'<polyline points="300,{y1 + box_h} 340,{y1 + box_h + 12} 340,{y6 + box_h / 2} '
        f'{262},{y6 + box_h / 2}" class="pa-df-arrow" marker-end="url(#pa-df-head)"/>'
    )
    box(90, y6, 170, f"{w['mix']} = {w['out']}", _dims(sh["out"]), "pa-df-out")
    height = y6 + box_h + 8
    return (
        f'<svg class="pa-figure pa-dataflow" viewBox="0 0 {W} {height}" role="img" '
        f'aria-label="{html.escape(w["label"])}" xmlns="http://www.w3.org/2000/svg">'
        '<defs><marker id="pa-df-head" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" class="pa-df-tip"/></marker></defs>'
        + "".join(parts)
        + "</svg>"
    )


def _subscripts(text: str) -> str:
    """``W_Q`` as W with a subscript Q."""
    return re.sub(r"W_([QKV])", r'W<tspan dy="4" class="pa-df-sub">\1</tspan>', text)


def dataflow_figure(*, lang: str = "en", caption: str) -> str:
    """The figure with its caption."""
    svg = dataflow_svg(lang=lang)
    return f'<figure class="pa-dataflow-figure">{svg}<figcaption>{caption}</figcaption></figure>'
