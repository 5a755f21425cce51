"""Grouped-query attention, once: ``H = G * Hkv`` query heads read ``Hkv`` key/value heads.

Query head ``h`` reads key/value head ``h // G`` (SDPA's ``enable_gqa``).
Keys and values are never repeated. A :class:`~portattn._core._problem.Problem`
keeps the query's layout, (..., H, Lq, d), for everything that has a head
(masks, biases, lengths, sink logits, the mods' ``h``), and its keys and values
keep theirs, (..., Hkv, Lk, d). Only the products that pair a query-side
array with a key-side one know about groups, and they fold the group into
the rows: (..., H, m, n) is viewed as (..., Hkv, G * m, n), a free reshape
of a contiguous array, so each key/value head is read once, by one matmul,
for its whole group. One exception, :func:`grouped_scores`: a decode step's
scores on NumPy (one row per head) are each head's own product, the keys
broadcast over the group, never copied. The products back to the keys' side (the backward's
``dK``, ``dV``) contract over those rows, which sums each group in the
matmul itself, in one fixed order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lib._checks import broadcastable, check_int, int_shape
from .._lib._compat import matmul
from .._lib._typing import Array, Namespace

__all__ = [
    "check_heads",
    "fold_rows",
    "group_heads",
    "group_mask",
    "group_per_head",
    "grouped_matmul",
    "grouped_matmul_t",
    "grouped_scores",
    "heads_layout",
    "kv_groups",
    "repeat_kv",
    "split_heads",
    "unfold_rows",
    "ungroup_heads",
]


def kv_groups(query: object, key: object, value: object | None) -> int:
    """``G`` when ``key`` (and ``value``) hold ``Hkv`` heads shared by the query's ``H``, else 1.

    A grouped layout has (..., H, L, d) arrays of one rank (at least 3) with
    ``1 < Hkv < H`` and ``Hkv`` dividing ``H``; ``H > 1`` query heads that
    ``Hkv > 1`` key heads do not divide can neither group nor broadcast, and
    are refused in those words. Anything else is left to the ordinary
    broadcasting rules, and to validation's errors (the arrays are not yet
    validated: shapes are read defensively).
    """
    nq, nk = getattr(query, "ndim", 0), getattr(key, "ndim", 0)
    if not isinstance(nq, int) or nq < 3 or nq != nk:
        return 1
    qs, ks = tuple(query.shape), tuple(key.shape)  # type: ignore[attr-defined]
    h, hkv = qs[-3], ks[-3]
    if not (isinstance(h, int) and isinstance(hkv, int)):
        return 1  # a dynamic size (an ndonnx argument): validation asks for a static shape
    if h > 1 and hkv > 1 and h % hkv != 0:
        msg = (
            "expected the key's heads to divide the query's (grouped-query attention): "
            f"the query's {h} heads must be a multiple of the key's {hkv}, got query shape "
            f"{qs} and key shape {ks}"
        )
        raise ValueError(msg)
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


def fold_rows(a: Array, groups: int, *, xp: Namespace) -> Array:
    """``a`` (..., H, m, n) as (..., Hkv, G * m, n): each key/value head's group as one matrix.

    A view of a contiguous ``a``; :func:`unfold_rows` undoes it.
    """
    shape = a.shape
    return _view(a, (*shape[:-3], shape[-3] // groups, groups * shape[-2], shape[-1]), xp=xp)


def unfold_rows(x: Array, groups: int, *, xp: Namespace) -> Array:
    """``x`` (..., Hkv, G * m, p) back to (..., H, m, p), ``H = G * Hkv``: fold_rows undone."""
    shape = x.shape
    return _view(x, (*shape[:-3], shape[-3] * groups, shape[-2] // groups, shape[-1]), xp=xp)


def grouped_matmul(a: Array, b: Array, groups: int, *, xp: Namespace) -> Array:
    """``a @ b`` where ``a`` (..., H, m, n) has query heads and ``b`` (..., Hkv, n, p) KV heads.

    Returns (..., H, m, p). With ``groups == 1`` it is ``a @ b``.
    """
    if groups == 1:
        return matmul(a, b, xp=xp)
    rows = matmul(fold_rows(a, groups, xp=xp), b, xp=xp)  # (..., Hkv, G*m, p)
    return unfold_rows(rows, groups, xp=xp)


def grouped_scores(
    q: Array, k_t: Array, groups: int, *, xp: Namespace, folded: bool = False
) -> Array:
    """``q @ k_t`` where ``q`` (..., H, m, d) has query heads and ``k_t`` (..., Hkv, d, n) KV heads.

    Returns (..., H, m, n), or with ``folded`` (..., Hkv, G * m, n), the same
    memory (:func:`fold_rows`). :func:`grouped_matmul`, except for one query
    row per head (a decode step) on NumPy: each head's row then meets its
    keys alone, broadcast over the group ((..., Hkv, G, 1, d) against
    (..., Hkv, 1, d, n), nothing copied), which BLAS computes as
    matrix-vector products, with plain multi-head attention's bits. Folded,
    the group's G rows against the transposed keys make a small matrix
    product that OpenBLAS's AVX-512 kernels run twice as slowly (38 us
    against 16 for H = 8, Hkv = 2, Lk = 512, d = 64).
    """
    if groups == 1:
        return matmul(q, k_t, xp=xp)
    shape = q.shape
    if shape[-2] != 1 or type(q) is not np.ndarray:
        rows = matmul(fold_rows(q, groups, xp=xp), k_t, xp=xp)  # (..., Hkv, G*m, n)
        return rows if folded else unfold_rows(rows, groups, xp=xp)
    per_head = matmul(
        q.reshape(*shape[:-3], shape[-3] // groups, groups, 1, shape[-1]),
        k_t[..., None, :, :],
        xp=xp,
    )
    # The batch from the product: q's may broadcast against the keys'.
    batch = per_head.shape[:-4]
    lead = batch + ((shape[-3] // groups, groups) if folded else (shape[-3], 1))
    return per_head.reshape(*lead, per_head.shape[-1])


def grouped_matmul_t(a: Array, b: Array, groups: int, *, xp: Namespace) -> Array:
    """``aᵀ @ b`` summed over each group: (..., H, m, n) and (..., H, m, p) to (..., Hkv, n, p).

    The group's rows are one contraction, so the sum over the group happens
    inside the matmul, in the same order on every run. With ``groups == 1``
    it is ``aᵀ @ b``.
    """
    if groups == 1:
        return matmul(xp.matrix_transpose(a), b, xp=xp)
    *lead, h, m, n = a.shape
    a2 = _view(a, (*lead, h // groups, groups * m, n), xp=xp)
    b2 = _view(b, (*b.shape[:-3], h // groups, groups * m, b.shape[-1]), xp=xp)
    return matmul(xp.matrix_transpose(a2), b2, xp=xp)


def repeat_kv(x: Array, groups: int, *, xp: Namespace) -> Array:
    """``x`` (..., Hkv, L, d) with each head repeated ``groups`` times: (..., H, L, d), a copy.

    Only where one group's query heads need different keys: per-head padding
    lengths zero different keys for each of them.
    """
    *lead, n, length, d = x.shape
    grown = xp.broadcast_to(x[..., None, :, :], (*lead, n, groups, length, d))
    return xp.reshape(grown, (*lead, n * groups, length, d))


# The broadcast layout: a caller that groups the heads itself, before attention,
# as the transformers adapter still does. (MultiHeadAttention passes its H query
# heads and Hkv key/value heads to the core as they are.) Query head ``h`` sits
# at ``[h // G, h % G]`` of (..., Hkv, G, Lq, d), and keys and values at
# (..., Hkv, 1, Lk, d) broadcast over ``G``, never copied.


def group_heads(
    q: Array, k: Array, v: Array | None, *, xp: Namespace
) -> tuple[Array, Array, Array | None]:
    """Query heads (..., H, Lq, d) as (..., Hkv, G, Lq, d), and k, v as (..., Hkv, 1, Lk, d)."""
    hkv = int(k.shape[-3])
    h = int(q.shape[-3])
    q = xp.reshape(q, (*q.shape[:-3], hkv, h // hkv, *q.shape[-2:]))  # (..., Hkv, G, Lq, d)
    k = xp.expand_dims(k, axis=-3)  # (..., Hkv, 1, Lk, d)
    return q, k, None if v is None else xp.expand_dims(v, axis=-3)


def group_mask(mask: Array, *, num_kv_heads: int, heads_axis: bool, xp: Namespace) -> Array:
    """A mask or bias (..., [1 or H,] Lq, Lk) in the layout of :func:`group_heads`.

    Without a heads axis every head shares the mask, as it does with a heads
    axis of size 1: both become (..., 1, 1, Lq, Lk). A heads axis of size H
    holds one mask per query head and becomes (..., Hkv, G, Lq, Lk).
    """
    lq_lk = tuple(mask.shape[-2:])
    if not heads_axis:
        return xp.reshape(mask, (*mask.shape[:-2], 1, 1, *lq_lk))
    h = int(mask.shape[-3])
    if h == 1:
        return xp.reshape(mask, (*mask.shape[:-3], 1, 1, *lq_lk))
    return xp.reshape(mask, (*mask.shape[:-3], num_kv_heads, h // num_kv_heads, *lq_lk))


def group_per_head(t: Array, *, num_kv_heads: int, xp: Namespace) -> Array:
    """One value per query head (..., H), such as a sink logit, as (..., Hkv, G)."""
    h = int(t.shape[-1])
    return xp.reshape(t, (*t.shape[:-1], num_kv_heads, h // num_kv_heads))


def ungroup_heads(t: Array, *, xp: Namespace) -> Array:
    """The grouped (..., Hkv, G, Lq, d) of :func:`group_heads` back to (..., H, Lq, d)."""
    return xp.reshape(t, (*t.shape[:-4], int(t.shape[-4]) * int(t.shape[-3]), *t.shape[-2:]))


def check_heads(num_heads: object, num_kv_heads: object) -> tuple[int, int]:
    """``(H, Hkv)`` of a layer: positive, ``Hkv`` dividing ``H``; ``num_kv_heads=None`` is ``H``."""
    h = check_int("num_heads", num_heads, minimum=1)
    hkv = h if num_kv_heads is None else check_int("num_kv_heads", num_kv_heads, minimum=1)
    if h % hkv:
        msg = (
            f"expected num_kv_heads to divide num_heads (each KV head serves a group of "
            f"query heads), got num_heads={h}, num_kv_heads={hkv}"
        )
        raise ValueError(msg)
    return h, hkv


def split_heads(t: Array, heads: int, *, xp: Namespace) -> Array:
    """A projection's token-major (..., L, heads * d) as head-major (..., heads, L, d)."""
    nb = t.ndim - 2
    t = xp.reshape(t, (*t.shape[:-1], heads, int(t.shape[-1]) // heads))  # (..., L, heads, d)
    return xp.permute_dims(t, (*range(nb), nb + 1, nb, nb + 2))  # (..., heads, L, d)


def heads_layout(
    given: dict[str, Any], x_shape: tuple[int, ...], lk: int, *, heads: int, xp: Namespace
) -> dict[str, Any]:
    """A layer's options ``given`` with heads axes on ``mask`` and ``key_lengths``.

    For a multi-head layer whose tokens ``x`` have shape ``x_shape``
    (..., Lq, d): ``mask`` (..., Lq, Lk), shared by the heads, or in the
    torch / Hugging Face layout (*batch, 1 or H, Lq, Lk), becomes
    (..., 1 or H, Lq, Lk); ``key_lengths`` (...) becomes (..., 1). What
    would silently enlarge the batch is refused, with the user's own shapes.
    """
    mask, key_lengths = given["mask"], given["key_lengths"]
    batch, nb, lq_lk = x_shape[:-2], len(x_shape) - 2, (x_shape[-2], lk)
    if mask is not None:
        shape, has_heads = int_shape(mask), mask.ndim == nb + 3
        if (
            not 2 <= mask.ndim <= nb + 3
            or (has_heads and shape[-3] not in (1, heads))
            or not all(n in (1, m) for n, m in zip(shape[-2:], lq_lk, strict=False))
            or not broadcastable(shape[: -3 if has_heads else -2], batch)
        ):
            msg = (
                f"expected mask of shape (..., Lq, Lk) with (Lq, Lk) = {lq_lk} and a batch "
                f"broadcastable with x's {batch} (x of shape {x_shape}), or in the torch / "
                f"Hugging Face layout (*batch, 1 or num_heads={heads}, Lq, Lk); "
                f"got mask shape {shape}"
            )
            raise ValueError(msg)
        mask = mask if has_heads else xp.expand_dims(mask, axis=-3)  # (..., 1 or H, Lq, Lk)
    if key_lengths is not None:
        shape = int_shape(key_lengths)
        if key_lengths.ndim > nb or not broadcastable(shape, batch):
            msg = (
                f"expected key_lengths with one length per sequence, broadcastable to x's "
                f"batch shape {batch}, got shape {shape}"
            )
            if key_lengths.ndim == nb + 1 and shape[-1] == 1:
                msg += f"; pass key_lengths[..., 0] (shape {shape[:-1]})"
            raise ValueError(msg)
        key_lengths = xp.expand_dims(key_lengths, axis=-1)  # (..., 1): for every head
    return given | {"mask": mask, "key_lengths": key_lengths}
