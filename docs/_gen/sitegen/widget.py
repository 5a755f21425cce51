"""The interactive heatmap: data emitted as JSON at build time, drawn by docs/assets/heatmap.js."""

from __future__ import annotations

import html
import json

from portattn import chapter
from portattn.testing import to_numpy

from .figures import heatmap_svg, percentages, viridis

# The titles of the chapter's linked content tabs; the widget's switch follows
# them and moves them.
TAB_ON = "Causal mask on"
TAB_OFF = "Causal mask off"


def heatmap_widget() -> str:
    """The widget's container, its JSON data, and a static figure for readers without JavaScript.

    Both weight matrices come from :func:`portattn.chapter.demo_weights`; the
    script only draws them. Percentages are rounded here, with the rounding
    ``describe_row`` uses, so the widget's sentences match the library's.
    """
    tokens = list(chapter.DEMO_TOKENS)
    data: dict[str, object] = {
        "tokens": tokens,
        "colormap": list(viridis()),
        "tabs": {"on": TAB_ON, "off": TAB_OFF},
    }
    for key, causal in (("causal", True), ("full", False)):
        w = chapter.demo_weights(tokens, causal=causal)
        data[key] = {
            "weights": to_numpy(w).astype(float).tolist(),
            "percent": percentages(w),
        }
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    static = heatmap_svg(
        tokens,
        chapter.demo_weights(tokens, causal=True),
        label="Attention weights of The cat sat on mat, causal mask on",
    )
    return (
        '<figure class="pa-heatmap" data-pa-heatmap>'
        f'<script type="application/json" class="pa-heatmap-data">{payload}</script>'
        '<div class="pa-heatmap-live"></div>'
        "<noscript>"
        f"{static}"
        "<p>JavaScript is off, so this is a still picture with the causal mask on; "
        "the tabs above show both states.</p>"
        "</noscript>"
        "<figcaption>"
        f"{html.escape(' '.join(tokens))}: rows are queries, columns keys. "
        "Hover over a row or click a query token (or tab to it and use the arrow keys) "
        "to read that row as a sentence; the switch turns the causal mask on and off."
        "</figcaption>"
        "</figure>"
    )
