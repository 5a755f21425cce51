"""Combine attention computed over disjoint key chunks into the attention over all of them."""

from __future__ import annotations

from collections.abc import Iterable

from .._lib._checks import check_floating, shown
from .._lib._compat import array_namespace, device_of, is_array_api_obj, refuse_non_array
from .._lib._precision import compute_dtype, narrow
from .._lib._typing import Array
from ._softmax import exp_floor, nonzero, row_shift, safe_exp

__all__ = ["merge_attention"]


def _parts(name: str, parts: object) -> list[Array]:
    """A list of per-chunk arrays from a sequence, any iterable, or one stacked array."""
    if is_array_api_obj(parts):
        refuse_non_array(name, parts)  # a masked array's mask would be ignored
        stacked: Array = parts
        if stacked.ndim < 1:
            msg = f"expected {name} stacked along a leading chunk axis, got a 0-d array"
            raise ValueError(msg)
        return [stacked[c, ...] for c in range(int(stacked.shape[0]))]
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Iterable):
        msg = (
            f"expected {name} to be a sequence or iterable of arrays, or one array stacked "
            f"along a leading chunk axis, got {shown(parts)}"
        )
        raise TypeError(msg)
    out = list(parts)
    for i, x in enumerate(out):
        refuse_non_array(f"{name}[{i}]", x)
    return out


def merge_attention(outputs: Iterable[Array], lses: Iterable[Array], /) -> tuple[Array, Array]:
    r"""Merge partial attention results over disjoint key chunks, exactly.

    If ``(o_c, l_c) = attention(q, k_c, v_c, return_lse=True)`` for key
    chunks ``c`` that together make up the keys, then the attention over all
    keys is :math:`o = \sum_c e^{l_c - l}\, o_c` with
    :math:`l = \log \sum_c e^{l_c}` (the softmax over all keys is each
    chunk's softmax reweighted by its share of the total mass). This is how
    attention is split across devices or streamed over a KV cache.

    Parameters
    ----------
    outputs : iterable of arrays, each (..., Lq, dv), or one array (C, ..., Lq, dv)
        Partial outputs, one per chunk, from one library: a list, a tuple,
        a generator, or the chunks stacked along a leading axis.
    lses : iterable of arrays, each (..., Lq), or one array (C, ..., Lq)
        Their log-sum-exps (``return_lse=True``); ``-inf`` where a chunk
        showed a row nothing. Stacked or not independently of ``outputs``.

    Returns
    -------
    output : array, shape (..., Lq, dv)
        In the outputs' (promoted) dtype; rows that no chunk showed anything
        are 0.
    lse : array, shape (..., Lq)
        The log-sum-exp over all chunks, in the lses' (promoted) dtype.

    Notes
    -----
    The merge is computed in the widest dtype among outputs and lses (half
    precision in float32), so float64 outputs merged with float32 lses keep
    float64 accuracy; only the results are cast back.

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
    outs = _parts("outputs", outputs)
    parts = _parts("lses", lses)  # one lse per chunk
    if len(outs) != len(parts) or not outs:
        msg = (
            "expected one lse per output and at least one of each, "
            f"got {len(outs)} outputs and {len(parts)} lses"
        )
        raise ValueError(msg)
    xp = array_namespace(*outs, *parts)
    for name, group in (("outputs", outs), ("lses", parts)):
        for x in group:
            check_floating(name, x, xp=xp)
    shape, lse_shape = tuple(outs[0].shape), tuple(parts[0].shape)
    if any(tuple(o.shape) != shape for o in outs) or any(
        tuple(x.shape) != lse_shape for x in parts
    ):
        msg = (
            "expected every output to have one shape (..., Lq, dv) and every lse (..., Lq), "
            f"got {[tuple(o.shape) for o in outs]} and {[tuple(x.shape) for x in parts]}"
        )
        raise ValueError(msg)
    if lse_shape != shape[:-1]:
        msg = f"expected lses of shape {shape[:-1]} to match outputs {shape}, got {lse_shape}"
        raise ValueError(msg)
    out_dtype = xp.result_type(*(o.dtype for o in outs))
    lse_dtype = xp.result_type(*(x.dtype for x in parts))
    work = compute_dtype(xp.result_type(out_dtype, lse_dtype), xp=xp)
    ls = xp.stack([xp.astype(x, work) for x in parts], axis=0)  # (C, ..., Lq)
    shift = row_shift(xp.max(ls, axis=0), xp=xp)  # (..., Lq)
    w = safe_exp(ls - shift, exp_floor(work, xp=xp), xp=xp)  # (C, ..., Lq), each <= 1
    total = xp.sum(w, axis=0)
    seen = total > 0
    safe_total = nonzero(total, xp=xp)
    out = xp.zeros(shape, dtype=work, device=device_of(ls))
    for c, o in enumerate(outs):
        out = out + xp.astype(o, work) * (w[c, ...] / safe_total)[..., None]
    lse = xp.where(seen, shift + xp.log(safe_total), xp.full_like(total, -xp.inf))
    return narrow(out, out_dtype, xp=xp), narrow(lse, lse_dtype, xp=xp)
