"""The materialising path: form the whole (..., Lq, Lk) score matrix, then softmax it.

The reference the other paths are held to, and the fastest for short
sequences, where blocking machinery costs more than the memory it saves.
"""

from __future__ import annotations

from .._core._groups import grouped_matmul, grouped_scores, unfold_rows
from .._core._problem import Problem, empty_result, empty_scores, expand
from .._core._softmax import add_sink, exp_floor, lse_from, masked_exp, masked_softmax, nonzero
from .._lib._compat import matmul, matrix_transpose, shifted_exp
from .._lib._typing import Array, Namespace

__all__ = ["materialize_attention", "materialize_weights", "plain_materialize"]


def _scores(p: Problem, *, xp: Namespace) -> tuple[Array, Array | None, bool]:
    """All the scores (..., Lq, Lk), what hides pairs (or None), and whether -inf may occur."""
    lq, lk = p.structure.lq, p.structure.lk
    scores = p.scores(p.q, matrix_transpose(p.k, xp=xp), 0, lq, 0, lk, xp=xp)
    return scores, p.allowed(0, lq, 0, lk, xp=xp), p.may_hide


def materialize_attention(
    p: Problem, *, want_lse: bool, xp: Namespace
) -> tuple[Array, Array | None]:
    """Output (..., Lq, dv), and the log-sum-exp (..., Lq) when asked for.

    The weighted values are normalised rather than the weights: (Lq, dv)
    divisions instead of (Lq, Lk).
    """
    s = p.structure
    if s.lk == 0:
        return empty_result(p, xp=xp)
    if _plain(p):
        out, row_max, total = plain_materialize(p.q, p.k, p.v, groups=p.groups, xp=xp)
        if want_lse and p.groups > 1:  # (..., Hkv, G*Lq, 1) -> (..., H, Lq, 1)
            row_max, total = (unfold_rows(x, p.groups, xp=xp) for x in (row_max, total))
    else:
        out, row_max, total = _weighted(p, xp=xp)
    out = expand(out, (*p.batch, s.lq, p.v.shape[-1]), xp=xp)
    if not want_lse:
        return out, None
    return out, expand(lse_from(row_max, total, xp=xp), (*p.batch, s.lq), xp=xp)  # (..., Lq)


def plain_materialize(
    q: Array, k: Array, v: Array, /, *, groups: int, xp: Namespace
) -> tuple[Array, Array, Array]:
    """``softmax(q kᵀ) v`` for a scaled ``q`` with nothing hiding a pair or changing a score.

    Returns the output (..., H, Lq, dv), and the row max and row sum with
    the group folded into the rows, (..., H / groups, groups * Lq, 1)
    (:func:`~portattn._core._groups.unfold_rows` gives (..., H, Lq, 1)).
    The core of :func:`materialize_attention` for a plain call, and all of
    a repeat plain NumPy call (the public entry's shortcut): one function,
    so the two give the same bits. ``k`` and ``v`` have ``H / groups``
    heads. The scores stay folded from the first product to the output: a
    row's softmax does not depend on which head it belongs to, and a decode
    step pays for each view (and each helper call) it makes.
    """
    # (..., Hkv, G*Lq, Lk). No -inf anywhere, so no row is empty: masked_exp's
    # guards are not needed.
    scores = grouped_scores(q, matrix_transpose(k, xp=xp), groups, xp=xp, folded=True)
    e, row_max, total = shifted_exp(scores, exp_floor(scores.dtype, xp=xp), xp=xp)
    out = matmul(e, v, xp=xp) / total
    return (out if groups == 1 else unfold_rows(out, groups, xp=xp)), row_max, total


def _plain(p: Problem) -> bool:
    """No mask, bias, lengths, mods, hiding positions, softcap or sinks: the scores are q kᵀ."""
    va = p.variant
    return va.positions_only and p.structure.trivial and va.kernel_lacks() is None


def _weighted(p: Problem, *, xp: Namespace) -> tuple[Array, Array, Array]:
    """:func:`plain_materialize` for any ``p``: output (..., Lq, dv), row max and row sum."""
    scores, allowed, may_hide = _scores(p, xp=xp)
    # Positions alone (no mask, lengths or bias) leave every row a key: no
    # row sums to 0, and the guards for that case are skipped.
    full_rows = not p.rows_may_be_empty
    e, row_max, total = masked_exp(
        scores, allowed, xp=xp, may_hide=may_hide, no_empty_rows=full_rows
    )
    if p.sink is not None:
        ev = grouped_matmul(e, p.v, p.groups, xp=xp)
        acc, total, row_max = add_sink(ev, total, row_max, p.sink, xp=xp)
        out = acc / nonzero(total, xp=xp)  # 0 only where the sink is -inf and no key is seen
    else:
        hides = (may_hide or allowed is not None) and not full_rows
        ev = grouped_matmul(e, p.v, p.groups, xp=xp)  # (..., Lq, dv)
        out = ev / (nonzero(total, xp=xp) if hides else total)
    return out, row_max, total


def materialize_weights(p: Problem, *, xp: Namespace) -> Array:
    """The weights (..., Lq, Lk) in the compute dtype."""
    if p.lk == 0:
        return expand(empty_scores(p, xp=xp), (*p.batch, p.lq, 0), xp=xp)  # connected to autograd
    scores, allowed, may_hide = _scores(p, xp=xp)
    if p.sink is not None:  # the sink takes its share of each row: rows sum to below 1
        e, row_max, total = masked_exp(scores, allowed, xp=xp, may_hide=True)
        e, total, _ = add_sink(e, total, row_max, p.sink, xp=xp)
        return expand(e / nonzero(total, xp=xp), (*p.batch, p.lq, p.lk), xp=xp)
    w, _, _ = masked_softmax(scores, allowed, xp=xp, may_hide=may_hide)
    return expand(w, (*p.batch, p.lq, p.lk), xp=xp)
