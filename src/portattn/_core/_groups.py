"""Grouped-query attention, once: ``H = G * Hkv`` query heads read ``Hkv`` key/value heads.

Query head ``h`` reads key/value head ``h // G`` (SDPA's ``enable_gqa``).
Keys and values are never repeated. A :class:`~portattn._core._problem.Problem`
keeps the query's layout, (..., H, Lq, d), for everything that has a head
(masks, biases, lengths, sinks, the mods' ``h``), and its keys and values
keep theirs, (..., Hkv, Lk, d). Only the products that pair a query-side
array with a key-side one know about groups, and they fold the group into
the rows: (..., H, m, n) is viewed as (..., Hkv, G * m, n), a free reshape
of a contiguous array, so each key/value head is read once, by one matmul,
for its whole group. The products back to the keys' side (the backward's
``dK``, ``dV``) contract over those rows, which sums each group in the
matmul itself, in one fixed order.
"""

from __future__ import annotations

import numpy as np

from .._lib._typing import Array, Namespace

__all__ = ["grouped_matmul", "grouped_matmul_t", "kv_groups", "repeat_kv"]


def kv_groups(query: object, key: object, value: object | None) -> int:
    """``G`` when ``key`` (and ``value``) hold ``Hkv`` heads shared by the query's ``H``, else 1.

    A grouped layout has (..., H, L, d) arrays of one rank (at least 3) with
    ``1 < Hkv < H`` and ``Hkv`` dividing ``H``. Anything else is left to the
    ordinary broadcasting rules, and to validation's errors (the arrays are
    not yet validated: shapes are read defensively).
    """
    nq, nk = getattr(query, "ndim", 0), getattr(key, "ndim", 0)
    if not isinstance(nq, int) or nq < 3 or nq != nk:
        return 1
    h, hkv = query.shape[-3], key.shape[-3]  # type: ignore[attr-defined]
    if h == hkv or hkv == 1 or hkv == 0 or h % hkv != 0:
        return 1
    same_rank = value is not None and getattr(value, "ndim", 0) == nk
    if same_rank and value.shape[-3] != hkv:  # type: ignore[union-attr]
        return 1  # not a grouped layout: validation names the mismatch
    return int(h // hkv)


def _view(x: Array, shape: tuple[int, ...], *, xp: Namespace) -> Array:
    """``xp.reshape(x, shape)``; a NumPy array's own method skips two wrappers (a decode step
    makes four of these views, each a microsecond through ``np.reshape``)."""
    if type(x) is np.ndarray:
        return x.reshape(shape)
    return xp.reshape(x, shape)


def grouped_matmul(a: Array, b: Array, groups: int, *, xp: Namespace) -> Array:
    """``a @ b`` where ``a`` (..., H, m, n) has query heads and ``b`` (..., Hkv, n, p) KV heads.

    Returns (..., H, m, p). With ``groups == 1`` it is ``a @ b``.
    """
    if groups == 1:
        return a @ b
    *lead, h, m, n = a.shape
    folded = _view(a, (*lead, h // groups, groups * m, n), xp=xp) @ b  # (..., Hkv, G*m, p)
    return _view(folded, (*folded.shape[:-3], h, m, folded.shape[-1]), xp=xp)


def grouped_matmul_t(a: Array, b: Array, groups: int, *, xp: Namespace) -> Array:
    """``aᵀ @ b`` summed over each group: (..., H, m, n) and (..., H, m, p) to (..., Hkv, n, p).

    The group's rows are one contraction, so the sum over the group happens
    inside the matmul, in the same order on every run. With ``groups == 1``
    it is ``aᵀ @ b``.
    """
    if groups == 1:
        return xp.matrix_transpose(a) @ b
    *lead, h, m, n = a.shape
    a2 = _view(a, (*lead, h // groups, groups * m, n), xp=xp)
    b2 = _view(b, (*b.shape[:-3], h // groups, groups * m, b.shape[-1]), xp=xp)
    return xp.matrix_transpose(a2) @ b2


def repeat_kv(x: Array, groups: int, *, xp: Namespace) -> Array:
    """``x`` (..., Hkv, L, d) with each head repeated ``groups`` times: (..., H, L, d), a copy.

    Only where one group's query heads need different keys: per-head padding
    lengths zero different keys for each of them.
    """
    *lead, n, length, d = x.shape
    grown = xp.broadcast_to(x[..., None, :, :], (*lead, n, groups, length, d))
    return xp.reshape(grown, (*lead, n * groups, length, d))
