"""The trained models of "What attention learns", live in the page: the reader types a sequence.

The weights of both tasks' models (:func:`.learned.trained`, float64) are
written into the page at build time, each tensor as the base64 of its
little-endian float64 bytes: exact to the bit, and about half the size of the
same numbers in decimal. docs/assets/learnedlive.js decodes them and runs the
model's forward pass in plain JavaScript: embeddings and positions, each
block's layer norm, one attention per head (scores scaled by 1/√d, the causal
mask for induction, a softmax that subtracts each row's largest score), the
output projection and the residual, the final norm, the logits and their
argmax. It hands the attention weights to the head view
(docs/assets/headview.js) as the reader types. The browser test
(tests/site/test_site_learned_live.py) compares that forward pass with
:func:`forward`, which runs the trained model through portattn.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from . import heads, learned
from .figures import viridis

# Every string the widget shows, both languages side by side. The lengths and
# the vocabulary's first and last letters are filled in from the settings.
_TEXT: dict[str, dict[str, str]] = {
    "en": {
        "label": "Your sequence",
        "hint_reverse": (
            "Type exactly {max} letters from {first} to {last} (spaces optional). "
            "The model writes them backwards; the head view below follows."
        ),
        "hint_induction": (
            "Type {min} to {max} letters from {first} to {last} (spaces optional), and repeat "
            "a stretch of them: in the repeat, the model predicts the next letter from the "
            "first copy. The head view below follows."
        ),
        "unknown": (
            "Not in the model's vocabulary: {bad}. It knows the {vocab} letters {first} to {last}."
        ),
        "bad": "“{c}”",
        "bad_sep": ", ",
        "length_reverse": "The reversal model reads exactly {max} letters; this is {n}.",
        "length_induction": "The induction model reads {min} to {max} letters; this is {n}.",
        "input": "input",
        "output_reverse": "model",
        "output_induction": "next",
        "said_reverse": "The model writes {out}: {right} of {n} letters in reversed order.",
        "said_induction": "After the last letter, {last}, the model predicts {next}.",
        "noscript": (
            "JavaScript is off, so the model cannot run in the page; the head view below "
            "shows the sequence it was built with."
        ),
    },
    "ja": {
        "label": "入力する系列",
        "hint_reverse": (
            "{first}〜{last} の英字をちょうど {max} 個入力する(空白はあってもなくてもよい)。"
            "モデルはそれを逆順に書き出し、下のヘッドビューもそれに合わせて描き直される。"
        ),
        "hint_induction": (
            "{first}〜{last} の英字を {min}〜{max} 個入力し、その一部を繰り返す(空白はあっても"
            "なくてもよい)。繰り返しの中では、モデルは1回目を見て次の文字を予測する。"
            "下のヘッドビューもそれに合わせて描き直される。"
        ),
        "unknown": (
            "モデルの語彙にない文字がある: {bad}。このモデルが知っているのは "
            "{first}〜{last} の {vocab} 文字だ。"
        ),
        "bad": "「{c}」",
        "bad_sep": "、",
        "length_reverse": "反転のモデルが読むのはちょうど {max} 文字だが、入力は {n} 文字だ。",
        "length_induction": "帰納のモデルが読むのは {min}〜{max} 文字だが、入力は {n} 文字だ。",
        "input": "入力",
        "output_reverse": "出力",
        "output_induction": "次の予測",
        "said_reverse": (
            "モデルの出力は {out} だ。{n} 文字のうち {right} 文字が逆順の正しい位置にある。"
        ),
        "said_induction": "最後の文字 {last} の次を、モデルは {next} と予測する。",
        "noscript": (
            "JavaScript が無効なので、モデルはページの中で動かない。下のヘッドビューは"
            "ビルド時の系列を示す。"
        ),
    },
}


def lengths(task: str) -> tuple[int, int]:
    """The shortest and longest input the task's model reads.

    Reversal is trained on sequences of half the position table
    (:func:`.learned.reverse_batch`) and only those: output ``i`` is input
    ``n - 1 - i``, so ``n`` is fixed. Induction is trained on full-length
    sequences under a causal mask, so any prefix of one is a valid input.
    """
    s = learned.TASKS[task]
    if task == "reverse":
        return s.length // 2, s.length // 2
    return 1, s.length


def check(task: str, tokens: Sequence[int]) -> None:
    """Raise ValueError naming what was expected when ``tokens`` cannot go into the model."""
    if task not in learned.TASKS:
        msg = f"expected task to be one of {tuple(learned.TASKS)}, got {task!r}"
        raise ValueError(msg)
    lo, hi = lengths(task)
    if not lo <= len(tokens) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        msg = f"expected {want} tokens for {task!r}, got {len(tokens)}"
        raise ValueError(msg)
    vocab = learned.TASKS[task].vocab
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        msg = f"expected token ids in [0, {vocab}), got {bad}"
        raise ValueError(msg)


def forward(task: str, tokens: Sequence[int]) -> dict[str, np.ndarray]:
    """portattn's forward pass of the task's model on ``tokens``: what the page must match.

    ``weights`` is (layers, heads, n, n), from :func:`portattn.attention_weights`;
    ``logits`` is (n, vocab), from the model run with ``impl="portattn"``;
    ``predicted`` is the logits' argmax at each position.
    """
    check(task, tokens)
    model = learned.trained(task).model
    t = torch.tensor([list(tokens)])
    with torch.no_grad():
        logits = model(t, impl="portattn")[0]
        weights = torch.stack([w[0] for w in model.weights(t)])
    return {
        "weights": weights.numpy(),
        "logits": logits.numpy(),
        "predicted": logits.argmax(-1).numpy(),
    }


def _encode(x: torch.Tensor) -> dict[str, Any]:
    """A tensor as its shape and the base64 of its float64 bytes, little-endian."""
    raw = x.detach().to(torch.float64).contiguous().numpy().astype("<f8").tobytes()
    return {"shape": list(x.shape), "data": base64.b64encode(raw).decode("ascii")}


def _eps(model: torch.nn.Module) -> float:
    """The layer norms' epsilon: one number, which the script uses for all of them."""
    found = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    if len(found) != 1:
        msg = f"expected one epsilon for every LayerNorm, got {sorted(found)}"
        raise ValueError(msg)
    return found.pop()


def data(task: str, *, lang: str = "en") -> dict[str, Any]:
    """Everything the page's forward pass needs for ``task``, and the widget's words."""
    r = learned.trained(task)
    s = r.settings
    model = r.model
    lo, hi = lengths(task)
    letters = heads.LETTERS[: s.vocab]
    fmt = {"min": lo, "max": hi, "first": letters[0], "last": letters[-1], "vocab": s.vocab}
    words = _TEXT[lang]
    text = {
        "label": words["label"],
        "hint": words[f"hint_{task}"].format(**fmt),
        # {bad} and {n} stay for the script to fill in.
        "unknown": words["unknown"].format(**fmt, bad="{bad}"),
        "length": words[f"length_{task}"].format(**fmt, n="{n}"),
        "bad": words["bad"],  # each letter not in the vocabulary, quoted
        "bad_sep": words["bad_sep"],
        "input": words["input"],
        "output": words[f"output_{task}"],
        "said": words[f"said_{task}"],
    }
    return {
        "task": task,
        "causal": s.causal,
        "layers": s.layers,
        "heads": s.heads,
        "eps": _eps(model),
        "letters": letters,
        "min": lo,
        "max": hi,
        # The head view's sequence: the widget starts where the head view does.
        "start": "".join(heads.view_data(task)["tokens"]),
        "params": {name: _encode(p) for name, p in model.state_dict().items()},
        "colormap": list(viridis(64)),
        "text": text,
    }


def live_widget(task: str, *, lang: str = "en") -> str:
    """The container; docs/assets/learnedlive.js draws the input, the message and the output."""
    d = data(task, lang=lang)
    payload = json.dumps(d, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    return (
        f'<div class="pa-ll" data-pa-learnedlive="{task}" lang="{lang}">'
        f'<script type="application/json" class="pa-ll-data">{payload}</script>'
        f"<noscript><p>{html.escape(_TEXT[lang]['noscript'])}</p></noscript>"
        "</div>"
    )
