"""Combine attention computed over disjoint key chunks into the attention over all of them."""

from __future__ import annotations

from collections.abc import Sequence

from ._lib._checks import check_floating
from ._lib._compat import array_namespace, device_of
from ._lib._precision import narrow
from ._lib._typing import Array
from ._softmax import exp_floor, safe_exp

__all__ = ["merge_attention"]


def merge_attention(outputs: Sequence[Array], lses: Sequence[Array], /) -> tuple[Array, Array]:
    r"""Merge partial attention results over disjoint key chunks, exactly.

    If ``(o_c, l_c) = attention(q, k_c, v_c, return_lse=True)`` for key
    chunks ``c`` that together make up the keys, then the attention over all
    keys is :math:`o = \sum_c e^{l_c - l}\, o_c` with
    :math:`l = \log \sum_c e^{l_c}` (the softmax over all keys is each
    chunk's softmax reweighted by its share of the total mass). This is how
    attention is split across devices or streamed over a KV cache.

    Parameters
    ----------
    outputs : sequence of arrays, each (..., Lq, dv)
        Partial outputs, one per chunk, from one library.
    lses : sequence of arrays, each (..., Lq)
        Their log-sum-exps (``return_lse=True``); ``-inf`` where a chunk
        showed a row nothing.

    Returns
    -------
    output : array, shape (..., Lq, dv)
        In the outputs' dtype; rows that no chunk showed anything are 0.
    lse : array, shape (..., Lq)
        The log-sum-exp over all chunks, in the lses' dtype.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((4, 8)) for _ in range(3))
    >>> parts = [pa.attention(q, k[i:i + 2], v[i:i + 2], return_lse=True) for i in (0, 2, 4, 6)]
    >>> out, lse = pa.merge_attention([o for o, _ in parts], [l for _, l in parts])
    >>> bool(np.allclose(out, pa.attention(q, k, v)))
    True
    """
    if len(outputs) != len(lses) or not outputs:
        msg = (
            "expected one lse per output and at least one of each, "
            f"got {len(outputs)} outputs and {len(lses)} lses"
        )
        raise ValueError(msg)
    xp = array_namespace(*outputs, *lses)
    for name, group in (("outputs", outputs), ("lses", lses)):
        for x in group:
            check_floating(name, x, xp=xp)
    shape, lse_shape = tuple(outputs[0].shape), tuple(lses[0].shape)
    if any(tuple(o.shape) != shape for o in outputs) or any(
        tuple(x.shape) != lse_shape for x in lses
    ):
        msg = (
            "expected every output to have one shape (..., Lq, dv) and every lse (..., Lq), "
            f"got {[tuple(o.shape) for o in outputs]} and {[tuple(x.shape) for x in lses]}"
        )
        raise ValueError(msg)
    if lse_shape != shape[:-1]:
        msg = f"expected lses of shape {shape[:-1]} to match outputs {shape}, got {lse_shape}"
        raise ValueError(msg)
    work = xp.result_type(*(x.dtype for x in lses))
    ls = xp.stack([xp.astype(x, work) for x in lses], axis=0)  # (C, ..., Lq)
    neg_inf = xp.asarray(-xp.inf, dtype=work, device=device_of(ls))
    top = xp.max(ls, axis=0)  # (..., Lq)
    shift = xp.where(top == neg_inf, xp.zeros_like(top), top)
    w = safe_exp(ls - shift, exp_floor(work, xp=xp), xp=xp)  # (C, ..., Lq), each <= 1
    total = xp.sum(w, axis=0)
    seen = total > 0
    safe_total = xp.where(seen, total, xp.ones_like(total))
    out = xp.zeros(shape, dtype=work, device=device_of(ls))
    for c, o in enumerate(outputs):
        out = out + xp.astype(o, work) * (w[c, ...] / safe_total)[..., None]
    lse = xp.where(seen, shift + xp.log(safe_total), xp.full_like(total, -xp.inf))
    return narrow(out, outputs[0].dtype, xp=xp), lse
