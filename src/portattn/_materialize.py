"""The materialising path: form the whole (..., Lq, Lk) score matrix, then softmax it.

The reference the other paths are held to, and the fastest for short
sequences, where blocking machinery costs more than the memory it saves.
"""

from __future__ import annotations

from ._lib._typing import Array, Namespace
from ._problem import Problem, empty_result, expand
from ._softmax import lse_from, masked_softmax

__all__ = ["materialize_attention", "materialize_weights"]


def _weights(p: Problem, *, xp: Namespace) -> tuple[Array, Array, Array]:
    """``(weights, row max, row sum)`` over all keys, in the compute dtype."""
    scores = p.scores(p.q, xp.matrix_transpose(p.k), 0, p.lq, 0, p.lk, xp=xp)  # (..., Lq, Lk)
    allowed = p.allowed(0, p.lq, 0, p.lk, xp=xp)
    return masked_softmax(scores, allowed, xp=xp, may_hide=p.bias is not None)


def materialize_attention(
    p: Problem, *, want_lse: bool, xp: Namespace
) -> tuple[Array, Array | None]:
    """Output (..., Lq, dv), and the log-sum-exp (..., Lq) when asked for."""
    if p.lk == 0:
        return empty_result(p, xp=xp)
    weights, row_max, total = _weights(p, xp=xp)
    out = expand(weights @ p.v, (*p.batch, p.lq, p.dv), xp=xp)  # (..., Lq, dv)
    if not want_lse:
        return out, None
    return out, expand(lse_from(row_max, total, xp=xp), (*p.batch, p.lq), xp=xp)  # (..., Lq)


def materialize_weights(p: Problem, *, xp: Namespace) -> Array:
    """The weights (..., Lq, Lk) in the compute dtype."""
    if p.lk == 0:
        return xp.zeros((*p.batch, p.lq, 0), dtype=p.q.dtype, device=p.device)
    w, _, _ = _weights(p, xp=xp)
    return expand(w, (*p.batch, p.lq, p.lk), xp=xp)
