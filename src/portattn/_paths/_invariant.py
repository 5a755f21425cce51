"""``impl="invariant"``: arithmetic that does not depend on the shapes around a row.

A matmul sums in an order that its library picks from the shapes it is
given, so a row computed in a padded batch, in a decode step or in a chunk
of a prefill is rounded differently from the same row in a full prefill.
Here nothing a row's bits depend on sees those shapes:

- keys are cut into tiles of :data:`KEY_TILE` aligned to absolute key
  positions (``[t, t + KEY_TILE)`` with ``t`` a multiple of it), and every
  tile is padded to that width with hidden keys, so every sum over a tile
  has the same length and the same order;
- a score is a product summed over ``d`` (``sum(q * k)``, never
  ``q @ kᵀ``), and the weighted values a product summed over the tile,
  each sum a pairwise tree of elementwise adds whose order is set by the
  axis's length alone (:func:`fixed_sum`), never a library's reduction;
- the online softmax merges the tiles one by one in ascending order. A
  tile that hides every key of a row (a tile a neighbour in the query block
  needed, or past a shorter sequence's length) merges as an exact
  identity: its weights are 0 and its rescaling ``exp(0) = 1``.

The meaning of a call (masks, lengths, window, soft cap, mods, block masks,
the sink logit, GQA) is the :class:`~portattn._core._problem.Problem`'s, read through
``Problem.scores`` and ``Problem.allowed``. Costs: no BLAS, and temporaries
of (rows, tile, d) elements; gradients flow through the operations
(torch autograd, ``jax.grad``).

Examples
--------
>>> import numpy as np
>>> import portattn as pa
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((3, 1, 2, 9, 8))
>>> full = pa.attention(q, k, v, causal=True, impl="invariant")
>>> step = pa.attention(q[..., 4:5, :], k[..., :5, :], v[..., :5, :],
...                     causal="bottom_right", impl="invariant")
>>> bool((step[..., 0, :] == full[..., 4, :]).all())
True
"""

from __future__ import annotations

import math

from .._core._flex import EMPTY
from .._core._problem import Problem, empty_result, expand
from .._core._softmax import add_sink, exp_floor, lse_from, no_keys, nonzero, row_shift, safe_exp
from .._lib._compat import device_of
from .._lib._typing import Array, Namespace

__all__ = ["KEY_TILE", "fixed_sum", "invariant_attention"]

#: Keys per tile, aligned to absolute key positions.
KEY_TILE = 64
# Query rows per block are chosen so that one (batch..., rows, KEY_TILE, d)
# product holds about this many elements. The block only bounds memory:
# every row's arithmetic is the same whatever block it sits in.
_PRODUCT_ELEMENTS = 1 << 21


def invariant_attention(p: Problem, *, xp: Namespace) -> tuple[Array, Array]:
    """Output (..., Lq, dv) and log-sum-exp (..., Lq) of ``p``, bit-identical per row.

    A row's bits depend on its own query, its keys and values, and its
    options, never on the other rows, the batch, or the query and key
    lengths of the call.
    """
    if p.lk == 0 or p.lq == 0 or math.prod(p.batch) == 0:
        return empty_result(p, xp=xp)
    width = max(p.q.shape[-1], p.dv, 1)
    rows = max(1, _PRODUCT_ELEMENTS // (math.prod(p.batch) * KEY_TILE * width))
    outs, lses = [], []
    for q0 in range(0, p.lq, rows):
        q1 = min(q0 + rows, p.lq)
        out, lse = _query_block(p, q0, q1, xp=xp)
        outs.append(expand(out, (*p.batch, q1 - q0, p.dv), xp=xp))
        lses.append(expand(lse, (*p.batch, q1 - q0), xp=xp))
    if len(outs) == 1:
        return outs[0], lses[0]
    return xp.concat(outs, axis=-2), xp.concat(lses, axis=-1)


def _query_block(p: Problem, q0: int, q1: int, *, xp: Namespace) -> tuple[Array, Array]:
    """Online softmax of rows ``[q0, q1)`` over the aligned key tiles they may see."""
    qb = p.q[..., q0:q1, :]  # (..., rows, d)
    lo, hi = p.structure.key_range(q0, q1)
    floor = exp_floor(p.q.dtype, xp=xp)
    m = total = acc = None
    for t0 in range(lo - lo % KEY_TILE, hi, KEY_TILE):
        k0, k1 = max(t0, lo), min(t0 + KEY_TILE, hi)  # the keys read; the rest is padding
        if p.kind(q0, q1, k0, k1) == EMPTY:  # the block mask hides the tile
            continue
        k_t = xp.matrix_transpose(p.k[..., k0:k1, :])
        s = p.scores(qb, k_t, q0, q1, k0, k1, xp=xp, product=_summed_product)
        allowed = p.allowed(q0, q1, k0, k1, xp=xp)
        if allowed is not None:
            s = xp.where(allowed, s, -math.inf)
        s = _pad_keys(s, k0 - t0, t0 + KEY_TILE - k1, -math.inf, axis=-1, xp=xp)
        v = _pad_keys(p.v[..., k0:k1, :], k0 - t0, t0 + KEY_TILE - k1, 0.0, axis=-2, xp=xp)
        tile_max = xp.max(s, axis=-1, keepdims=True)  # (..., rows, 1)
        m_new = tile_max if m is None else xp.maximum(m, tile_max)
        shift = row_shift(m_new, xp=xp)
        e = safe_exp(s - shift, floor, xp=xp)  # (..., rows, KEY_TILE)
        ev = _weighted_values(e, v, p.groups, xp=xp)  # (..., rows, dv)
        tile_total = fixed_sum(e, xp=xp)[..., None]  # (..., rows, 1)
        if m is None:
            acc, total = ev, tile_total
        else:
            alpha = safe_exp(m - shift, floor, xp=xp)  # exactly 1 where the max is unchanged
            acc, total = acc * alpha + ev, total * alpha + tile_total
        m = m_new
    if m is None:  # positions or the block mask hide every key from these rows
        out, lse = no_keys(p.batch, q1 - q0, p.dv, dtype=p.q.dtype, device=p.device, xp=xp)
        if p.sink is not None:  # the sink is the row's only logit
            lse = expand(p.sink[..., 0], (*p.batch, q1 - q0), xp=xp)
        return out, lse
    assert acc is not None
    assert total is not None
    if p.sink is not None:
        acc, total, m = add_sink(acc, total, m, p.sink, xp=xp)
    return acc / nonzero(total, xp=xp), lse_from(m, total, xp=xp)


def _pad_keys(x: Array, before: int, after: int, fill: float, *, axis: int, xp: Namespace) -> Array:
    """``x`` with ``before`` and ``after`` entries of ``fill`` around the key ``axis``."""
    if before == 0 and after == 0:
        return x
    parts = []
    for n in (before, after):
        shape = list(x.shape)
        shape[axis] = n
        parts.append(xp.full(tuple(shape), fill, dtype=x.dtype, device=device_of(x)))
    return xp.concat([parts[0], x, parts[1]], axis=axis)


def _summed_product(q: Array, k_t: Array, groups: int, *, xp: Namespace) -> Array:
    """``q @ k_t`` as products summed over ``d`` by :func:`fixed_sum`.

    ``q`` (..., H, rows, d), ``k_t`` (..., Hkv, d, keys); returns (..., H, rows, keys).
    """
    k = xp.matrix_transpose(k_t)  # (..., Hkv, keys, d)
    if groups == 1:
        return fixed_sum(q[..., :, None, :] * k[..., None, :, :], xp=xp)
    *lead, h, rows, d = q.shape
    folded = xp.reshape(q, (*lead, h // groups, groups * rows, d))  # (..., Hkv, G*rows, d)
    s = fixed_sum(folded[..., :, None, :] * k[..., None, :, :], xp=xp)
    return xp.reshape(s, (*lead, h, rows, k.shape[-2]))


def _weighted_values(e: Array, v: Array, groups: int, *, xp: Namespace) -> Array:
    """``e @ v`` summed over the tile: (..., H, rows, KEY_TILE) by (..., Hkv, KEY_TILE, dv)."""
    v_t = xp.matrix_transpose(v)  # (..., Hkv, dv, KEY_TILE): the sum runs over the last axis
    if groups == 1:
        return fixed_sum(e[..., :, None, :] * v_t[..., None, :, :], xp=xp)
    *lead, h, rows, n = e.shape
    folded = xp.reshape(e, (*lead, h // groups, groups * rows, n))
    ev = fixed_sum(folded[..., :, None, :] * v_t[..., None, :, :], xp=xp)
    return xp.reshape(ev, (*lead, h, rows, v.shape[-1]))


def fixed_sum(x: Array, *, xp: Namespace) -> Array:
    """The sum over the last axis, added pairwise in an order set by its length alone.

    Each step adds the second half of the axis to the first (an odd element
    out is carried), elementwise: a library's reduction picks its order
    from the whole shape (XLA's on CPU does, measured), an elementwise add
    cannot. ``log2(n)`` passes.

    >>> import numpy as np
    >>> fixed_sum(np.arange(10.0).reshape(2, 5), xp=np)
    array([10., 35.])
    """
    n = x.shape[-1]
    if n == 0:
        return xp.sum(x, axis=-1)
    while n > 1:
        half = n // 2
        head = x[..., :half] + x[..., half : 2 * half]
        x = xp.concat([head, x[..., 2 * half :]], axis=-1) if n % 2 else head
        n = x.shape[-1]
    return x[..., 0]
