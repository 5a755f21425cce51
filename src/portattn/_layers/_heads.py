"""Heads: split a projection into heads, merge them back, and group query heads onto KV heads.

Grouped-query attention never repeats keys or values. The ``H`` query heads
are reshaped to (..., Hkv, G, Lq, d) with ``G = H // Hkv`` and the keys and
values to (..., Hkv, 1, Lk, d); batch broadcasting over the group axis then
pairs query head ``h`` with KV head ``h // G`` (torch's ``enable_gqa``
convention). :class:`~portattn.MultiHeadAttention` and the ``transformers``
adapter both group this way, through these functions.
"""

from __future__ import annotations

from .._lib._typing import Array, Namespace

__all__ = [
    "group_heads",
    "group_mask",
    "group_per_head",
    "merge_heads",
    "split_heads",
    "ungroup_heads",
]


def split_heads(t: Array, heads: int, *, xp: Namespace) -> Array:
    """Token-major (..., L, heads * d) to head-major (..., heads, L, d)."""
    nb = t.ndim - 2
    t = xp.reshape(t, (*t.shape[:-1], heads, int(t.shape[-1]) // heads))  # (..., L, heads, d)
    return xp.permute_dims(t, (*range(nb), nb + 1, nb, nb + 2))  # (..., heads, L, d)


def merge_heads(t: Array, *, xp: Namespace) -> Array:
    """Head-major (..., heads, L, d) back to token-major (..., L, heads * d)."""
    nb = t.ndim - 3
    t = xp.permute_dims(t, (*range(nb), nb + 1, nb, nb + 2))  # (..., L, heads, d)
    return xp.reshape(t, (*t.shape[:-2], int(t.shape[-2]) * int(t.shape[-1])))


def group_heads(
    q: Array, k: Array, v: Array | None, *, xp: Namespace
) -> tuple[Array, Array, Array | None]:
    """Query heads (..., H, Lq, d) onto KV heads (..., Hkv, Lk, d) for one broadcast call.

    Returns q as (..., Hkv, G, Lq, d) and k, v as (..., Hkv, 1, Lk, d):
    query head ``h`` sits at ``[h // G, h % G]``, and broadcasting over the
    axis of ``G`` reads its KV head ``h // G`` once for the whole group,
    never a copy.
    """
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
