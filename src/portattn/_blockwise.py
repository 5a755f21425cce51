"""Blockwise attention with an online softmax (Rabe & Staats 2021; FlashAttention).

Queries are cut into blocks of ``bq`` rows and keys into blocks of ``bk``.
Each query block keeps a running row maximum ``m``, a running sum ``l`` of
``exp(s - m)`` and a running output ``acc``; when a new key block raises the
maximum, the old sum and output are rescaled by ``exp(m_old - m_new)``. The
(Lq, Lk) score matrix is never formed: extra memory is one (bq, bk) tile.

Key blocks that ``causal``/``window`` hide entirely are never read, which
halves the work for causal attention and keeps causality bit-exact even if
later values are inf.
"""

from __future__ import annotations

from ._attention import empty_keys, expand, lse_from
from ._lib._typing import Array, Namespace
from ._problem import Problem

__all__ = ["block_sizes", "blockwise_attention"]

_DEFAULT_BLOCKS = {"torch": (256, 512), "numpy": (128, 512)}
_FALLBACK_BLOCKS = (128, 512)


def block_sizes(block_size: int | tuple[int, int] | None, *, xp: Namespace) -> tuple[int, int]:
    """Resolve ``block_size=`` to ``(query_block, key_block)``, with a tuned default per library."""
    if block_size is None:
        name = xp.__name__.removeprefix("array_api_compat.").split(".")[0]
        return _DEFAULT_BLOCKS.get(name, _FALLBACK_BLOCKS)
    if isinstance(block_size, int) and not isinstance(block_size, bool):
        pair: tuple[object, ...] = (block_size, block_size)
    elif isinstance(block_size, tuple) and len(block_size) == 2:
        pair = block_size
    else:
        msg = f"expected block_size to be a positive int or a pair of them, got {block_size!r}"
        raise ValueError(msg)
    bq, bk = pair
    if not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in (bq, bk)):
        msg = f"expected block_size to be a positive int or a pair of them, got {block_size!r}"
        raise ValueError(msg)
    assert isinstance(bq, int) and isinstance(bk, int)
    return bq, bk


def blockwise_attention(
    p: Problem, *, block_size: int | tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """Output (..., Lq, dv) and log-sum-exp (..., Lq) of ``p``, one query block at a time."""
    bq, bk = block_sizes(block_size, xp=xp)
    if p.lk == 0:
        return empty_keys(p, xp=xp)
    k_t = xp.matrix_transpose(p.k)  # (..., d, Lk)
    outs, lses = [], []
    for q0 in range(0, p.lq, bq):
        q1 = min(q0 + bq, p.lq)
        out, lse = _query_block(p, q0, q1, k_t, bk, xp=xp)
        outs.append(expand(out, (*p.batch, q1 - q0, p.dv), xp=xp))
        lses.append(expand(lse, (*p.batch, q1 - q0), xp=xp))
    if len(outs) == 1:
        return outs[0], lses[0]
    if not outs:  # Lq == 0
        return empty_keys(p, xp=xp)
    return xp.concat(outs, axis=-2), xp.concat(lses, axis=-1)


def _query_block(
    p: Problem, q0: int, q1: int, k_t: Array, bk: int, *, xp: Namespace
) -> tuple[Array, Array]:
    qb = p.q[..., q0:q1, :]  # (..., bq, d)
    lo, hi = p.structure.key_range(q0, q1)
    neg_inf = xp.asarray(-xp.inf, dtype=p.q.dtype, device=p.device)
    zero = xp.asarray(0.0, dtype=p.q.dtype, device=p.device)
    m = total = acc = None
    for k0 in range(lo, hi, bk):
        k1 = min(k0 + bk, hi)
        s = qb @ k_t[..., k0:k1]  # (..., bq, bk)
        bias = p.bias_tile(q0, q1, k0, k1)
        if bias is not None:
            s = s + bias
        allowed = p.allowed(q0, q1, k0, k1, xp=xp)
        if allowed is not None:
            s = xp.where(allowed, s, neg_inf)
        tile_max = xp.max(s, axis=-1, keepdims=True)  # (..., bq, 1)
        m_new = tile_max if m is None else xp.maximum(m, tile_max)
        shift = xp.where(m_new == neg_inf, zero, m_new)
        e = xp.exp(s - shift)
        v_blk = p.v[..., k0:k1, :]  # (..., bk, dv)
        if m is None:
            total = xp.sum(e, axis=-1, keepdims=True)
            acc = e @ v_blk  # (..., bq, dv)
        else:
            alpha = xp.exp(m - shift)  # rescales what earlier key blocks contributed
            total = total * alpha + xp.sum(e, axis=-1, keepdims=True)
            acc = acc * alpha + e @ v_blk
        m = m_new
    if m is None:  # positions hide every key from this query block
        out = xp.zeros((*p.batch, q1 - q0, p.dv), dtype=p.q.dtype, device=p.device)
        lse = xp.full((*p.batch, q1 - q0), -xp.inf, dtype=p.q.dtype, device=p.device)
        return out, lse
    out = acc / xp.where(total > 0, total, xp.ones_like(total))
    return out, lse_from(m, total, xp=xp)
