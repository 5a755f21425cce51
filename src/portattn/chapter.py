"""The single-head chapter's experiments, as functions that return numbers.

Each function runs on any array library (``xp=``) and returns plain Python
values, so the same code feeds the tests, ``python -m portattn`` and the docs
site, and no figure can drift from the library that produced it.

- :func:`scaling_table`: why scores are divided by √d.
- :func:`permutation_check`: attention ignores order.
- :func:`causality_check`: the causal mask makes earlier outputs independent of later tokens.
- :func:`demo_weights` / :func:`describe_row`: the "The cat sat on mat" heatmap.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from ._attention import attend
from ._core._softmax import masked_softmax
from ._core._variant import build_variant
from ._layers._head import Head
from ._lib._compat import resolve_namespace
from ._lib._convert import to_numpy
from ._lib._random import from_numpy_float64, standard_normal
from ._lib._typing import Array, DType, Namespace

__all__ = [
    "CHAPTER_STD",
    "DEMO_TOKENS",
    "CausalityReport",
    "PermutationReport",
    "ScalingRow",
    "causality_check",
    "demo_embeddings",
    "demo_weights",
    "describe_row",
    "permutation_check",
    "scaling_table",
    "sharpness",
]

DEMO_TOKENS = ("The", "cat", "sat", "on", "mat")
#: Standard deviation of the chapter's untrained weights in :func:`scaling_table`.
CHAPTER_STD = 0.2


class ScalingRow(NamedTuple):
    """One row of the √d table: mean largest weight per query, without and with ÷√d."""

    d: int
    unscaled: float
    scaled: float


class PermutationReport(NamedTuple):
    """How far ``attention(P x)`` is from ``P attention(x)``."""

    perm: tuple[int, ...]
    max_abs_diff: float
    max_ulp: float


class CausalityReport(NamedTuple):
    """Bits that changed in each earlier output row after rewriting the last token."""

    changed_bits_masked: tuple[int, ...]
    changed_bits_unmasked: tuple[int, ...]
    factor: float


def sharpness(weights: Array) -> float:
    """Mean over query rows of the row's largest weight: 1/n is uniform, 1 is one-hot."""
    w = to_numpy(weights).astype(np.float64)
    return float(np.mean(np.max(w, axis=-1)))


def _inputs(seq_len: int, d_model: int, *, seed: int, xp: Namespace, dtype: DType | None) -> Array:
    """A fixed N(0, 1) input of shape (seq_len, d_model), drawn after the weights' stream."""
    x = standard_normal((seq_len, d_model), seed=seed + 10_000)
    return from_numpy_float64(x, xp=xp, dtype=dtype, device=None)


def scaling_table(
    dims: Sequence[int] = (8, 32, 64, 256),
    *,
    seq_len: int = 6,
    seed: int = 0,
    trials: int = 32,
    init: Literal["constant", "scaled"] = "constant",
    xp: Namespace | None = None,
) -> list[ScalingRow]:
    """Measure how peaked attention gets as the head width ``d`` grows, with and without ÷√d.

    For each ``d`` and each of ``trials`` seeds ``seed, seed + 1, ...``, a
    head ``Head.random(d, d, seed=..., std=...)`` is applied to a fixed
    N(0, 1) input of ``seq_len`` tokens; :func:`sharpness` of the softmax of
    the unscaled and of the scaled scores is averaged over the trials (one
    draw of six tokens is too noisy to show a trend).

    With weights of a fixed standard deviation (``init="constant"``, std
    :data:`CHAPTER_STD`, like the chapter's untrained random weights), a
    query entry has variance ``d·std²`` and a raw score variance
    ``d³·std⁴``: dividing by √d removes one factor of ``d`` but not the
    growth that the initialisation itself causes, so even scaled attention
    sharpens. With ``init="scaled"`` (std ``1/sqrt(d)``, queries and keys at
    unit scale) the scaled scores have unit variance at every ``d``, and the
    scaled curve stays flat.

    Parameters
    ----------
    dims : sequence of int
        Head widths (``d_model = d_head = d``).
    seq_len : int
        Tokens; ``1/seq_len`` is the value for perfectly uniform attention.
    seed : int
        First seed for weights and inputs.
    trials : int
        Number of independent heads and inputs averaged per ``d``.
    init : {"constant", "scaled"}
        ``"constant"``: weights N(0, CHAPTER_STD²) whatever ``d``.
        ``"scaled"``: weights N(0, 1/d).
    xp : namespace or module, optional
        Array library; ``None`` means NumPy.

    Returns
    -------
    list of ScalingRow
        ``(d, unscaled, scaled)`` per ``d``.

    Examples
    --------
    >>> from portattn.chapter import scaling_table
    >>> row = scaling_table((8,))[0]
    >>> row.d, 1 / 6 <= row.scaled <= row.unscaled <= 1
    (8, True)
    """
    ns = resolve_namespace(xp)
    if init not in ("constant", "scaled"):
        msg = f"expected init to be 'constant' or 'scaled', got {init!r}"
        raise ValueError(msg)
    rows = []
    for d in dims:
        std = CHAPTER_STD if init == "constant" else 1.0 / math.sqrt(d)
        unscaled, scaled = 0.0, 0.0
        for t in range(seed, seed + trials):
            head = Head.random(d, d, seed=t, std=std, xp=ns)
            x = _inputs(seq_len, d, seed=t, xp=ns, dtype=None)
            unscaled += sharpness(_softmax_rows(head.scores(x, scaled=False), xp=ns))
            scaled += sharpness(_softmax_rows(head.scores(x, scaled=True), xp=ns))
        rows.append(ScalingRow(int(d), unscaled / trials, scaled / trials))
    return rows


def _softmax_rows(scores: Array, *, xp: Namespace) -> Array:
    weights, _, _ = masked_softmax(scores, None, xp=xp)
    return weights


def permutation_check(
    *,
    seq_len: int = 4,
    d_model: int = 8,
    perm: Sequence[int] = (2, 1, 0, 3),
    seed: int = 0,
    xp: Namespace | None = None,
    dtype: DType | None = None,
) -> PermutationReport:
    """Compare ``head(x[perm])`` with ``head(x)[perm]``.

    The default swaps the first and third of four tokens. Attention has no
    notion of position, so the two agree; any difference is rounding, and is
    reported in absolute terms and in units in the last place of the dtype.

    Returns
    -------
    PermutationReport

    Examples
    --------
    >>> from portattn.chapter import permutation_check
    >>> permutation_check().max_ulp <= 4
    True
    """
    ns = resolve_namespace(xp)
    order = tuple(int(i) for i in perm)
    if sorted(order) != list(range(seq_len)):
        msg = f"expected perm to be a permutation of range({seq_len}), got {order}"
        raise ValueError(msg)
    head = Head.random(d_model, d_model, seed=seed, xp=ns, dtype=dtype)
    x = _inputs(seq_len, d_model, seed=seed, xp=ns, dtype=dtype)
    idx = ns.asarray(order, dtype=ns.int64)
    of_permuted = to_numpy(head(ns.take(x, idx, axis=0)))
    permuted_out = to_numpy(head(x))[list(order)]
    diff = np.abs(of_permuted.astype(np.float64) - permuted_out.astype(np.float64))
    ulp = np.spacing(np.abs(permuted_out)).astype(np.float64)
    return PermutationReport(order, float(diff.max()), float((diff / ulp).max()))


def _bits(a: np.ndarray) -> np.ndarray:
    """Per-row count of set bits in the raw representation."""
    raw = np.ascontiguousarray(a).view(np.uint8).reshape(a.shape[0], -1)
    counts: np.ndarray = np.unpackbits(raw, axis=1).sum(axis=1)
    return counts


def causality_check(
    *,
    seq_len: int = 4,
    d_model: int = 8,
    factor: float = 1e6,
    seed: int = 0,
    xp: Namespace | None = None,
    dtype: DType | None = None,
) -> CausalityReport:
    """Rewrite the last token (multiply it by ``-factor``) and count changed bits in earlier rows.

    With the causal mask every earlier row is bit-for-bit identical (0
    changed bits); without it, the earlier rows move.

    Returns
    -------
    CausalityReport
        ``changed_bits_masked`` and ``changed_bits_unmasked`` have one entry
        per earlier output row.

    Examples
    --------
    >>> from portattn.chapter import causality_check
    >>> causality_check().changed_bits_masked
    (0, 0, 0)
    """
    ns = resolve_namespace(xp)
    head = Head.random(d_model, d_model, seed=seed, xp=ns, dtype=dtype)
    base = standard_normal((seq_len, d_model), seed=seed + 10_000)
    rewritten = base.copy()
    rewritten[-1] *= -factor
    x0 = from_numpy_float64(base, xp=ns, dtype=dtype, device=None)
    x1 = from_numpy_float64(rewritten, xp=ns, dtype=dtype, device=None)
    changed = []
    for causal in (True, False):
        a = to_numpy(head(x0, causal=causal))[:-1]
        b = to_numpy(head(x1, causal=causal))[:-1]
        changed.append(tuple(int(n) for n in _bits(_xor(a, b))))
    return CausalityReport(changed[0], changed[1], float(factor))


def _xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    diff: np.ndarray = np.bitwise_xor(
        np.ascontiguousarray(a).view(unsigned), np.ascontiguousarray(b).view(unsigned)
    )
    return diff


def demo_embeddings(
    tokens: Sequence[str] = DEMO_TOKENS, *, d_model: int = 8, xp: Namespace | None = None
) -> Array:
    """Deterministic token vectors: each token's N(0, 1) vector is seeded by the CRC-32 of its text.

    The same word always gets the same vector, on every backend.
    """
    ns = resolve_namespace(xp)
    rows = [standard_normal((d_model,), seed=zlib.crc32(t.encode())) for t in tokens]
    return from_numpy_float64(np.stack(rows), xp=ns, dtype=None, device=None)


def demo_weights(
    tokens: Sequence[str] = DEMO_TOKENS,
    *,
    causal: bool = True,
    xp: Namespace | None = None,
) -> Array:
    """The demo heatmap: attention weights of a fixed head over ``tokens``, shape (n, n).

    Row ``i`` is how query token ``i`` spreads its attention over the keys;
    rows sum to 1. The head is ``Head.random(8, 8, seed=0, std=8**-0.5)`` and
    the embeddings come from :func:`demo_embeddings`.

    Examples
    --------
    >>> from portattn.chapter import demo_weights
    >>> w = demo_weights()
    >>> w.shape, bool(w[0, 0] == 1.0), bool((w[0, 1:] == 0).all())
    ((5, 5), True, True)
    """
    ns = resolve_namespace(xp)
    if len(tokens) == 0:
        msg = "expected at least one token, got none"
        raise ValueError(msg)
    d_model = 8
    head = Head.random(d_model, d_model, seed=0, std=d_model**-0.5, xp=ns)
    x = demo_embeddings(tokens, d_model=d_model, xp=ns)
    q, k = x @ head.wq, x @ head.wk
    w = attend(q, k, None, variant=build_variant(causal=causal), xp=ns)
    assert not isinstance(w, tuple)
    return w


def describe_row(tokens: Sequence[str], weights: Array, i: int, /) -> str:
    """One row of the heatmap as a sentence: ``"sat attends to The 3%, cat 26%, sat 71%"``.

    Percentages are ``round(100 * w)``; keys with exactly zero weight (hidden
    by the mask) are left out.

    Examples
    --------
    >>> from portattn.chapter import demo_weights, describe_row
    >>> describe_row(["a", "b"], demo_weights(["a", "b"]), 0)
    'a attends to a 100%'
    """
    w = to_numpy(weights).astype(np.float64)
    if w.shape != (len(tokens), len(tokens)):
        msg = f"expected weights of shape ({len(tokens)}, {len(tokens)}), got {w.shape}"
        raise ValueError(msg)
    parts = [f"{tok} {round(100 * p)}%" for tok, p in zip(tokens, w[i], strict=True) if p != 0]
    return f"{tokens[i]} attends to " + ", ".join(parts)
