"""The chapter's worked example, one query at a time, and its exercises: every number computed here.

:func:`walk_markdown` follows one query of the chapter's three-token example
(``The cat sat``, ``d_model = 4``, ``d = 2``, ``Head.random(4, 2, seed=0)``)
through the four steps: q·k for each key, the division by √d, softmax, and
the weighted sum of the values. The sum is checked against the head's own
output, so the build fails if the walk and portattn ever disagree.
:func:`exercises_markdown` writes the chapter's exercises, with the answers
folded away and computed from portattn.
"""

from __future__ import annotations

import math

import numpy as np

import portattn as pa
from portattn import chapter

from . import exercises

TOKENS = ("The", "cat", "sat")
D_MODEL, D = 4, 2


def _example() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x, q, k, v and the head's output, as the chapter's code block computes them."""
    x = np.asarray(chapter.demo_embeddings(TOKENS, d_model=D_MODEL))
    head = pa.Head.random(D_MODEL, D, seed=0)
    q, k, v = x @ head.wq, x @ head.wk, x @ head.wv  # (3, 2) each
    return x, q, k, v, np.asarray(head(x))


def _vec(a: np.ndarray) -> str:
    return "(" + ", ".join(f"{float(c):.2f}" for c in a) + ")"


_WORDS = {
    "en": {
        "intro": "Follow the query of **{tok}**, $q = {q}$, through the four steps "
        "(the numbers of the block above, rounded to two places):",
        "head": "| key | $k_j$ | step 1: $q \\cdot k_j$ | step 2: $\\div\\sqrt{{{d}}}$ "
        "| step 3: weight | step 4: weight × $v_j$ |",  # noqa: RUF001
        "sum": "**sum**",
        "after": "The last row, ${out}$, is row {i} of the head's output: the weighted sum "
        "of the values. The largest weight goes to **{best}** ({w:.2f}); the weights add "
        "up to {total:.2f}.",
    },
    "ja": {
        "intro": "**{tok}** のクエリ $q = {q}$ を、四つの段階に沿ってたどる"
        "(上のブロックの数値を小数2桁に丸めたもの):",
        "head": "| キー | $k_j$ | 段階1: $q \\cdot k_j$ | 段階2: $\\div\\sqrt{{{d}}}$ "
        "| 段階3: 重み | 段階4: 重み × $v_j$ |",  # noqa: RUF001
        "sum": "**和**",
        "after": "最後の行 ${out}$ が、ヘッドの出力の第 {i} 行、つまりバリューの重みつき和だ。"
        "いちばん大きな重みは **{best}** に向く({w:.2f})。重みの和は {total:.2f} になる。",
    },
}


def walk_markdown(query: int = 2, *, lang: str = "en") -> str:
    """One query through the four steps, as a sentence, a table and a closing sentence."""
    _, q, k, v, out = _example()
    dots = k @ q[query]  # (3,): step 1
    scaled = dots / math.sqrt(D)  # step 2
    weights = np.asarray(pa.softmax(scaled, axis=-1))  # step 3
    parts = weights[:, None] * v  # step 4, before the sum
    mixed = parts.sum(axis=0)
    if not np.allclose(mixed, out[query], rtol=1e-6, atol=1e-9):
        msg = f"the walk's sum {mixed} is not the head's output {out[query]}"
        raise AssertionError(msg)
    w = _WORDS[lang]
    lines = [w["intro"].format(tok=TOKENS[query], q=_vec(q[query])), "", w["head"].format(d=D)]
    lines.append("|---|---|---:|---:|---:|---|")
    for j, tok in enumerate(TOKENS):
        lines.append(
            f"| {tok} | {_vec(k[j])} | {dots[j]:.2f} | {scaled[j]:.2f} | {weights[j]:.2f} "
            f"| {_vec(parts[j])} |"
        )
    lines.append(f"| {w['sum']} | | | | {weights.sum():.2f} | {_vec(mixed)} |")
    best = int(np.argmax(weights))
    after = w["after"].format(
        out=_vec(mixed), i=query, best=TOKENS[best], w=weights[best], total=weights.sum()
    )
    return "\n".join(lines) + "\n\n" + after + "\n"


_EXERCISES = {
    "en": (
        (
            "Two scores in one row differ by $\\Delta = {delta}$. How many times more "
            "weight does the larger one get?",
            "$e^{{{delta}}} \\approx {ratio:.2f}$: softmax turns a difference of scores into "
            "a ratio of weights, whatever the other scores are.",
        ),
        (
            "A causal mask on $n = {n}$ tokens: how many of the $n^2 = {n2}$ weights does it "
            "force to zero, and how many does each row keep?",
            "{hidden} of them, the cells above the diagonal; row $i$ keeps its first $i + 1$ "
            "weights, {kept} in all (counted on `pa.causal_mask({n}, {n})`).",
        ),
        (
            "In the walk above, divide by $d = {d}$ instead of $\\sqrt{{{d}}}$. Does the "
            "largest weight of **{tok}**'s row grow or shrink, and to what?",
            "It shrinks, from {w_sqrt:.3f} to {w_d:.3f}: dividing by more flattens the row "
            "towards the uniform {uniform:.3f}.",
        ),
    ),
    "ja": (
        (
            "同じ行の二つのスコアの差が $\\Delta = {delta}$ のとき、大きいほうの重みは"
            "小さいほうの何倍になるか。",
            "$e^{{{delta}}} \\approx {ratio:.2f}$ 倍。softmax はスコアの差を重みの比に変える。"
            "ほかのスコアには左右されない。",
        ),
        (
            "$n = {n}$ トークンに因果マスクをかけると、$n^2 = {n2}$ 個の重みのうちいくつが "
            "0 になるか。各行にはいくつ残るか。",
            "対角線より上の {hidden} 個が 0 になる。第 $i$ 行には最初の $i + 1$ 個が残り、"
            "合計 {kept} 個(`pa.causal_mask({n}, {n})` で数えた)。",
        ),
        (
            "上の例で $\\sqrt{{{d}}}$ ではなく $d = {d}$ で割ると、**{tok}** の行の最大の重みは"
            "大きくなるか小さくなるか。いくつになるか。",
            "小さくなる。{w_sqrt:.3f} から {w_d:.3f} へ。大きな数で割るほど、行は一様な "
            "{uniform:.3f} に近づく。",
        ),
    ),
}


def exercises_markdown(query: int = 2, *, lang: str = "en") -> str:
    """The chapter's exercises, each answer folded away and computed from portattn."""
    _, q, k, _, _ = _example()
    delta, n = 2, 5
    allowed = np.asarray(pa.causal_mask(n, n), dtype=bool)
    dots = k @ q[query]
    values = {
        "delta": delta,
        "ratio": math.exp(delta),
        "n": n,
        "n2": n * n,
        "hidden": int((~allowed).sum()),
        "kept": int(allowed.sum()),
        "d": D,
        "tok": TOKENS[query],
        "w_sqrt": float(np.max(pa.softmax(dots / math.sqrt(D), axis=-1))),
        "w_d": float(np.max(pa.softmax(dots / D, axis=-1))),
        "uniform": 1 / len(TOKENS),
    }
    return exercises.render(_EXERCISES[lang], values, lang=lang)
