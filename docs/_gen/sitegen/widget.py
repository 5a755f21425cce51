"""The interactive heatmap: data emitted as JSON at build time, drawn by docs/assets/heatmap.js."""

from __future__ import annotations

import html
import json

from portattn import chapter
from portattn.testing import to_numpy

from .figures import demo_heatmap, percentages, viridis
from .i18n import t

_TEXT = {
    "en": {
        "switch": "Causal mask",
        "caption": "Attention weights in percent: rows are queries, columns keys",
        "corner": "query ↓ key →",
        "hint": "Hover over a row, or click a query token, to read it as a sentence.",
        "attends": "{q} attends to {parts}",
        "hidden": " (the mask hides the tokens after {q})",
        "masked": "masked",
        "scale": "attention weight",
        "noscript": "JavaScript is off, so here are both states as still pictures.",
        "figcaption": (
            "{tokens}: rows are queries, columns keys; hatched cells are hidden by the mask. "
            "Hover over a row or click a query token (or tab to it and use the arrow keys) "
            "to read that row as a sentence; the switch turns the causal mask on and off."
        ),
    },
    "ja": {
        "switch": "因果マスク",
        "caption": "注目の重み(%):行が見る側(クエリ)、列が見られる側(キー)",
        "corner": "クエリ ↓ キー →",
        "hint": "行にカーソルを置くか、見る側(クエリ)のトークンを押すと、その行が文で読める。",
        "attends": "{q} の注目先: {parts}",
        "hidden": "({q} より後ろのトークンはマスクで見えない)",
        "masked": "マスク",
        "scale": "注目の重み",
        "noscript": "JavaScript が無効なので、2つの状態を静止画で示す。",
        "figcaption": (
            "{tokens}:行が見る側(クエリ)、列が見られる側(キー)。斜線のマスはマスクで隠れている。"
            "行にカーソルを置くか、クエリのトークンを押す(Tab で移動し矢印キーでも可)と、"
            "その行を文で読める。スイッチで因果マスクを切り替える。"
        ),
    },
}


def heatmap_widget(*, lang: str = "en") -> str:
    """The widget's container, its JSON data, and both static figures for readers without JS.

    Both weight matrices come from :func:`portattn.chapter.demo_weights`; the
    script only draws them. Percentages are rounded here, with the rounding
    ``describe_row`` uses, so the widget's sentences match the library's.
    """
    tokens = list(chapter.DEMO_TOKENS)
    words = _TEXT[lang]
    data: dict[str, object] = {
        "tokens": tokens,
        "colormap": list(viridis()),
        "tabs": {"on": t("mask_on", lang), "off": t("mask_off", lang)},
        "text": words,
    }
    for key, causal in (("causal", True), ("full", False)):
        w = chapter.demo_weights(tokens, causal=causal)
        data[key] = {
            "weights": to_numpy(w).astype(float).tolist(),
            "percent": percentages(w),
        }
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    still = "".join(
        f"<p><strong>{t('mask_on' if c else 'mask_off', lang)}</strong></p>"
        f"{demo_heatmap(causal=c, lang=lang)}"
        for c in (True, False)
    )
    return (
        '<figure class="pa-heatmap" data-pa-heatmap>'
        f'<script type="application/json" class="pa-heatmap-data">{payload}</script>'
        '<div class="pa-heatmap-live"></div>'
        f"<noscript><p>{words['noscript']}</p>{still}</noscript>"
        "<figcaption>"
        + words["figcaption"].format(tokens=html.escape(" ".join(tokens)))
        + "</figcaption></figure>"
    )
