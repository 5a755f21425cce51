"""The chapter's head, live in the page: weights as JSON, the forward pass in docs/assets/live.js.

The head is the chapter's (``Head.random(8, 8, seed=0, std=8**-0.5)``, float64)
and each word's vector is :func:`portattn.chapter.demo_embeddings`'s. Those
vectors are seeded by the word's CRC-32 through NumPy's generator, which the
page cannot rerun, so the page carries the vectors of a fixed vocabulary and
says so when the reader types a word outside it. The browser test
(tests/site/test_site.py) checks the page's forward pass against
:func:`forward` on random sentences.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

import portattn as pa
from portattn import chapter

from .figures import viridis

D_MODEL = 8
# The chapter's five tokens and a few more words to make sentences with.
_MORE = "the a dog bird fish mouse ran slept saw ate chased flew under over in by tree house ball"
VOCABULARY = (*chapter.DEMO_TOKENS, *_MORE.split(), "cheese", "big", "small", "red", "green", "and")

_TEXT = {
    "en": {
        "label": "Your sentence",
        "start": "the dog chased the cat",
        "switch": "Causal mask",
        "caption": "Attention weights of the chapter's head on your sentence, in percent",
        "corner": "query ↓ key →",
        "unknown": "Not in this page's vocabulary: {words}. Words it knows: {vocab}.",
        "empty": "Type at least one word.",
        "out": "Output row of the last token ({q}): {v}",
        "masked": "masked",
    },
    "ja": {
        "label": "文を入力",
        "start": "the dog chased the cat",
        "switch": "因果マスク",
        "caption": "入力した文に対する、この章のヘッドの注目の重み(%)",
        "corner": "クエリ ↓ キー →",
        "unknown": "このページの語彙にない語: {words}。使える語: {vocab}。",
        "empty": "語を1つ以上入力すること。",
        "out": "最後のトークン({q})の出力の行: {v}",
        "masked": "マスク",
    },
}


def head() -> pa.Head:
    """The chapter's head, in float64."""
    return pa.Head.random(D_MODEL, D_MODEL, seed=0, std=D_MODEL**-0.5, dtype=np.float64)


def forward(tokens: Sequence[str], *, causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """portattn's weights (n, n) and output (n, d) for ``tokens``: what the page must match."""
    h = head()
    x = np.asarray(chapter.demo_embeddings(tokens, d_model=D_MODEL), dtype=np.float64)
    return np.asarray(h.weights(x, causal=causal)), np.asarray(h(x, causal=causal))


def data(*, lang: str = "en") -> dict[str, Any]:
    """Everything the page's forward pass needs, and its words."""
    h = head()
    vectors = np.asarray(chapter.demo_embeddings(VOCABULARY, d_model=D_MODEL), dtype=np.float64)
    return {
        "wq": np.asarray(h.wq).tolist(),
        "wk": np.asarray(h.wk).tolist(),
        "wv": np.asarray(h.wv).tolist(),
        "vocab": {w: v.tolist() for w, v in zip(VOCABULARY, vectors, strict=True)},
        "colormap": list(viridis()),
        "text": _TEXT[lang],
    }


def live_widget(*, lang: str = "en") -> str:
    """The container; docs/assets/live.js draws the input, the grid and the output."""
    payload = json.dumps(data(lang=lang), separators=(",", ":"), ensure_ascii=False)
    payload = payload.replace("</", "<\\/")
    words = html.escape(", ".join(VOCABULARY))
    return (
        f'<div class="pa-live" data-pa-live lang="{lang}">'
        f'<script type="application/json" class="pa-live-data">{payload}</script>'
        f"<noscript><p>{html.escape(_TEXT[lang]['label'])}: JavaScript. {words}</p></noscript>"
        "</div>"
    )
