"""A float64 NumPy reference written for clarity, independently of portattn's code paths.

Masks are built with explicit loops over (i, j) so that the alignment rules
are spelled out once more, differently from ``portattn._core._masks``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def allowed_pairs(
    lq: int,
    lk: int,
    *,
    causal: bool | str = False,
    window: int | tuple[int, int] | None = None,
    align: str = "top_left",
) -> np.ndarray:
    """(lq, lk) boolean: may query i attend to key j."""
    if isinstance(window, int):
        window = (window, window)
    offset = lk - lq if "bottom_right" in (causal, align) else 0
    out = np.ones((lq, lk), dtype=bool)
    for i in range(lq):
        for j in range(lk):
            aligned = i + offset
            if causal and j > aligned:
                out[i, j] = False
            if window is not None and not (aligned - window[0] <= j <= aligned + window[1]):
                out[i, j] = False
    return out


def _scores(
    q: np.ndarray,
    k: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    causal: bool | str = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: np.ndarray | None = None,
    query_lengths: np.ndarray | None = None,
    softcap: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, allowed), broadcast to one shape, in float64: every option of attention."""
    q, k = (np.asarray(a, dtype=np.float64) for a in (q, k))
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q @ np.swapaxes(k, -1, -2)) * (1 / np.sqrt(d) if scale is None else scale)
    if softcap is not None:
        s = np.tanh(s / softcap) * softcap  # Gemma 2: cap the scaled scores, then bias and masks
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    ok = np.broadcast_to(allowed_pairs(lq, lk, causal=causal, window=window), s.shape)
    if mask is not None:
        ok = ok & mask
    if key_lengths is not None:
        ok = ok & (np.arange(lk) < np.asarray(key_lengths)[..., None, None])
    if query_lengths is not None:
        ok = ok & (np.arange(lq)[:, None] < np.asarray(query_lengths)[..., None, None])
    ok = ok & (s > -np.inf)  # a -inf bias hides a pair too
    s, ok = np.broadcast_arrays(s, ok)
    return s, ok


def attention_ref(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Return (output, weights) in float64; ``options`` are attention's (mask ... softcap)."""
    s, ok = _scores(q, k, **options)
    v = np.asarray(v, dtype=np.float64)
    lk = s.shape[-1]
    w = np.zeros(s.shape)
    if lk == 0:
        return w @ v, w
    flat_s, flat_ok, flat_w = s.reshape(-1, lk), ok.reshape(-1, lk), w.reshape(-1, lk)
    for r in range(flat_s.shape[0]):
        if flat_ok[r].any():
            row = flat_s[r][flat_ok[r]]
            e = np.exp(row - row.max())
            flat_w[r][flat_ok[r]] = e / e.sum()
    return w @ v, w


def lse_ref(q: np.ndarray, k: np.ndarray, **options: Any) -> np.ndarray:
    """The log-sum-exp of each row's visible scores, (..., Lq) in float64; -inf for an empty row."""
    s, ok = _scores(q, k, **options)
    out = np.full(s.shape[:-1], -np.inf)
    if s.shape[-1] == 0:
        return out
    flat_s, flat_ok, flat_out = (
        s.reshape(-1, s.shape[-1]),
        ok.reshape(-1, s.shape[-1]),
        out.reshape(-1),
    )
    for r in range(flat_s.shape[0]):
        if flat_ok[r].any():
            row = flat_s[r][flat_ok[r]]
            flat_out[r] = row.max() + np.log(np.exp(row - row.max()).sum())
    return out


def flex_ref(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    score_mod: object = None,
    mask_mod: object = None,
    sinks: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    bias: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(output, weights, lse) in float64 for 4-D (B, H, L, d) inputs, FlexAttention's model.

    ``score_mod``/``mask_mod`` are called once on the whole score matrix with
    NumPy index arrays; key/value heads fewer than the query's are shared by
    groups of query heads (GQA); ``allowed`` is any other boolean mask. The
    sink is one extra logit per (batch, head) whose value is 0.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    nb, nh, lq, d = q.shape
    g = nh // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    lk = k.shape[-2]
    s = (q @ np.swapaxes(k, -1, -2)) * (1 / np.sqrt(d) if scale is None else scale)
    if softcap is not None:
        s = np.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    b = np.arange(nb).reshape(-1, 1, 1, 1)
    h = np.arange(nh).reshape(1, -1, 1, 1)
    qi = np.arange(lq).reshape(1, 1, -1, 1)
    ki = np.arange(lk).reshape(1, 1, 1, -1)
    if score_mod is not None:
        s = np.asarray(score_mod(s, b, h, qi, ki), dtype=np.float64)  # type: ignore[operator]
    ok = np.ones(s.shape, dtype=bool)
    if mask_mod is not None:
        ok = ok & np.asarray(mask_mod(b, h, qi, ki))  # type: ignore[operator]
    if allowed is not None:
        ok = ok & allowed
    ok = ok & (s > -np.inf)
    s = np.where(ok, s, -np.inf)
    sink = np.full((nb, nh), -np.inf) if sinks is None else np.broadcast_to(sinks, (nb, nh))
    sink = sink[..., None, None]  # (B, H, 1, 1)
    top = np.maximum(np.max(s, axis=-1, keepdims=True, initial=-np.inf), sink)  # (B, H, Lq, 1)
    top = np.where(np.isinf(top), 0.0, top)
    e = np.where(ok, np.exp(np.where(ok, s, 0.0) - top), 0.0)
    total = e.sum(axis=-1, keepdims=True) + np.exp(sink - top)
    w = e / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, top + np.log(np.where(total > 0, total, 1.0)), -np.inf)[..., 0]
    return w @ v, w, lse
