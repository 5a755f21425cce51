"""The √d playground: every state precomputed by portattn as a small JSON grid.

docs/assets/playground.js draws it; nothing is computed in the browser. The
grid is widths :data:`DIMS` by {fixed std, 1/√d} by {scaled, unscaled}: the
"The cat sat on mat" weights of one head of that width (no mask), and the
chapter's sharpness curves for the same initialisation.
"""

from __future__ import annotations

import html
import json
import math
from functools import cache

import numpy as np

import portattn as pa
from portattn import chapter
from portattn.testing import to_numpy

from .figures import PLOT_DIMS, SEQ_LEN, percentages, scaling, viridis

DIMS = (8, 16, 32, 64, 128, 256)
INITS = ("constant", "scaled")

_TEXT = {
    "en": {
        "width": "Head width d",
        "division": "Scores",
        "scaled": "divided by √d",
        "unscaled": "not divided",
        "init": "Initialisation",
        "constant": f"weights N(0, {chapter.CHAPTER_STD}²)",
        "unit": "weights N(0, 1/d)",
        "sharp": "mean largest weight of this sentence: {v}",
        "curve_x": "head width d",
        "curve_y": "mean largest weight",
        "corner": "query ↓ key →",
        "caption": "The cat sat on mat, no mask: attention weights in percent",
        "noscript": "JavaScript is off. Mean largest weight of the sentence for each setting:",
    },
    "ja": {
        "width": "ヘッドの幅 d",
        "division": "スコア",
        "scaled": "√d で割る",
        "unscaled": "割らない",
        "init": "初期化",
        "constant": f"重み N(0, {chapter.CHAPTER_STD}²)",
        "unit": "重み N(0, 1/d)",
        "sharp": "この文の最大の重みの平均: {v}",
        "curve_x": "ヘッドの幅 d",
        "curve_y": "最大の重みの平均",
        "corner": "クエリ ↓ キー →",
        "caption": "The cat sat on mat(マスクなし):注目の重み(%)",
        "noscript": "JavaScript が無効なので、設定ごとに、この文の最大の重みの平均を示す:",
    },
}


def _std(init: str, d: int) -> float:
    return chapter.CHAPTER_STD if init == "constant" else 1 / math.sqrt(d)


@cache
def state(init: str, d: int, *, scaled: bool) -> dict[str, object]:
    """One setting's weights, percentages and sharpness, as the playground shows them.

    Apart from :func:`grid`, whose curves cost seconds: the browser test
    checks two settings against this without computing the curves again.
    """
    x = chapter.demo_embeddings(chapter.DEMO_TOKENS, d_model=d)
    head = pa.Head.random(d, d, seed=0, std=_std(init, d))
    w = pa.softmax(head.scores(x, scaled=scaled), axis=-1)
    return {
        "weights": np.round(to_numpy(w).astype(float), 4).tolist(),
        "percent": percentages(w),
        "sharpness": round(chapter.sharpness(w), 3),
    }


@cache
def grid() -> dict[str, object]:
    """The precomputed states, keyed ``"{init}/{d}/{scaled|unscaled}"``."""
    tokens = chapter.DEMO_TOKENS
    states = {
        f"{init}/{d}/{'scaled' if scaled else 'unscaled'}": state(init, d, scaled=scaled)
        for init in INITS
        for d in DIMS
        for scaled in (True, False)
    }
    curves = {
        init: {
            "d": [r.d for r in scaling(init, PLOT_DIMS)],
            "scaled": [round(r.scaled, 4) for r in scaling(init, PLOT_DIMS)],
            "unscaled": [round(r.unscaled, 4) for r in scaling(init, PLOT_DIMS)],
        }
        for init in INITS
    }
    return {
        "tokens": list(tokens),
        "dims": list(DIMS),
        "seq_len": SEQ_LEN,
        "colormap": list(viridis()),
        "states": states,
        "curves": curves,
    }


def playground(*, lang: str = "en") -> str:
    """The playground's container with its JSON, and a static table for readers without JS."""
    words = _TEXT[lang]
    data = dict(grid())
    data["text"] = words
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    states = grid()["states"]
    assert isinstance(states, dict)
    head = "".join(
        f"<th>{html.escape(words['constant' if i == 'constant' else 'unit'])}, "
        f"{html.escape(words[s])}</th>"
        for i in INITS
        for s in ("unscaled", "scaled")
    )
    body = "".join(
        f"<tr><td>{d}</td>"
        + "".join(
            f"<td>{states[f'{i}/{d}/{s}']['sharpness']:.3f}</td>"
            for i in INITS
            for s in ("unscaled", "scaled")
        )
        + "</tr>"
        for d in DIMS
    )
    fallback = (
        f"<p>{words['noscript']}</p><table class='pa-num'><thead><tr><th>d</th>{head}</tr>"
        f"</thead><tbody>{body}</tbody></table>"
    )
    return (
        f'<div class="pa-playground" data-pa-playground lang="{lang}">'
        f'<script type="application/json" class="pa-playground-data">{payload}</script>'
        f'<div class="pa-playground-live"></div><noscript>{fallback}</noscript></div>'
    )
