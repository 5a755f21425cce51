"""Scaled dot-product attention: the public entry points and the materialising path."""

from __future__ import annotations

from typing import Literal

from ._lib._compat import array_namespace
from ._lib._precision import narrow
from ._lib._typing import Array, Namespace
from ._masks import Causal
from ._problem import Problem, prepare
from ._softmax import masked_softmax

__all__ = [
    "Impl",
    "attention",
    "attention_weights",
    "empty_keys",
    "expand",
    "lse_from",
    "run_attention",
    "weights_impl",
]

Impl = Literal["auto", "materialize", "blockwise", "native"]
_IMPLS = ("auto", "materialize", "blockwise", "native")

# Below this many (query, key) pairs per batch entry, materialising the score
# matrix is cheaper than any blocking machinery.
_AUTO_MATERIALIZE_MAX_PAIRS = 256 * 256


def attention(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    return_lse: bool = False,
) -> Array | tuple[Array, Array]:
    r"""Scaled dot-product attention, :math:`\mathrm{softmax}(QK^\top s + B)\,V`.

    Works on any array API namespace: NumPy, PyTorch, CuPy,
    ``array_api_strict``, ... The result comes back in the inputs' namespace,
    dtype and device.

    Parameters
    ----------
    query : array, shape (..., Lq, d)
    key : array, shape (..., Lk, d)
    value : array, shape (..., Lk, dv)
        Real floating arrays from one library, on one device. Leading batch
        dimensions broadcast. float16 and bfloat16 are computed in float32
        and cast back; float64 stays float64.
    mask : bool array, optional
        Broadcastable to (..., Lq, Lk). True where a query may attend.
    bias : real floating array, optional
        Broadcastable to (..., Lq, Lk); added to the scaled scores.
    causal : {False, True, "top_left", "bottom_right"}, optional
        Hide keys in the future of each query. ``True`` is the usual lower
        triangle and requires ``Lq == Lk``; with ``Lq != Lk`` choose the
        alignment explicitly. ``"top_left"``: query ``i`` sees ``j <= i``
        (torch, JAX, Keras). ``"bottom_right"``: query ``i`` sees
        ``j <= i + Lk - Lq`` (flash-attn, KV-cache decoding).
    scale : float, optional
        Multiplies :math:`QK^\top`. Default ``1/sqrt(d)``.
    window : int or (int, int), optional
        Sliding window ``(left, right)``: query ``i`` sees keys
        ``i - left <= j <= i + right`` (an int ``w`` means ``(w, w)``), as
        ``local_window_size`` in ``jax.nn.dot_product_attention``. Aligned
        like ``causal`` when ``Lq != Lk``.
    key_lengths, query_lengths : integer array, optional
        Valid lengths, broadcastable to the batch shape. Keys at positions
        ``>= key_lengths`` get weight 0; query rows at positions
        ``>= query_lengths`` output 0.
    impl : {"auto", "materialize", "blockwise", "native"}, optional
        ``"materialize"`` forms the (..., Lq, Lk) score matrix;
        ``"blockwise"`` streams over key blocks with an online softmax in
        O(Lq + Lk) extra memory and skips blocks that ``causal``/``window``
        hide; ``"auto"`` (default) picks by size; ``"native"`` delegates to
        the library's fused kernel where the arguments map exactly.
    block_size : int or (int, int), optional
        ``(query_block, key_block)`` for the blockwise path.
    return_lse : bool, optional
        Also return the log-sum-exp of each row's scores, shape (..., Lq),
        in the compute dtype (``-inf`` for a row that sees nothing), so
        results over disjoint key chunks can be merged exactly.

    Returns
    -------
    array, shape (..., Lq, dv)
        The attention output; ``(output, lse)`` if ``return_lse``.

    Raises
    ------
    TypeError
        Arrays from two libraries; non-floating query, key, value or bias;
        a non-boolean mask; non-integer lengths.
    ValueError
        Rank below 2; mismatched ``d`` or ``Lk``; mask or bias not
        broadcastable; ``causal=True`` with ``Lq != Lk``; an unknown
        ``causal``; a scale that is not a finite number; arrays on
        different devices; a negative window.

    Notes
    -----
    A row whose keys are all hidden gets weights 0 and output 0, never NaN,
    and so does ``Lk == 0``. With ``causal``, rewriting the keys and values
    of later positions leaves earlier output rows bit-for-bit unchanged.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> import portattn as pa
    >>> q = k = xp.eye(3)
    >>> v = xp.reshape(xp.arange(6, dtype=xp.float64), (3, 2))
    >>> pa.attention(q, k, v, causal=True)[0, :]
    Array([0., 1.], dtype=array_api_strict.float64)
    >>> pa.attention(q, k, v, causal=True).shape
    (3, 2)
    """
    xp = array_namespace(query, key, value, mask, bias, key_lengths, query_lengths)
    return run_attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        window=window,
        key_lengths=key_lengths,
        query_lengths=query_lengths,
        impl=impl,
        block_size=block_size,
        return_lse=return_lse,
        xp=xp,
    )


def run_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    return_lse: bool = False,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """:func:`attention` for callers that already hold the namespace."""
    if impl not in _IMPLS:
        msg = f"expected impl to be one of {', '.join(map(repr, _IMPLS))}, got {impl!r}"
        raise ValueError(msg)
    p = prepare(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        window=window,
        key_lengths=key_lengths,
        query_lengths=query_lengths,
        xp=xp,
    )
    if impl == "native":
        from ._native import native_attention

        out, lse = native_attention(p, return_lse=return_lse, xp=xp)
    elif impl == "blockwise" or (impl == "auto" and p.lq * p.lk > _AUTO_MATERIALIZE_MAX_PAIRS):
        from ._blockwise import blockwise_attention

        out, lse = blockwise_attention(p, block_size=block_size, xp=xp)
    else:
        out, lse = _materialized(p, want_lse=return_lse, xp=xp)
    out = narrow(out, p.out_dtype, xp=xp)
    return (out, lse) if return_lse else out


def empty_keys(p: Problem, *, xp: Namespace) -> tuple[Array, Array]:
    """``Lk == 0``: nothing to attend to, so output zeros and lse ``-inf``."""
    out = xp.zeros((*p.batch, p.lq, p.dv), dtype=p.q.dtype, device=p.device)
    lse = xp.full((*p.batch, p.lq), -xp.inf, dtype=p.q.dtype, device=p.device)
    return out, lse


def _weights(p: Problem, *, xp: Namespace) -> tuple[Array, Array, Array]:
    scores = p.q @ xp.matrix_transpose(p.k)  # (..., Lq, Lk)
    bias = p.bias_tile(0, p.lq, 0, p.lk)
    if bias is not None:
        scores = scores + bias
    allowed = p.allowed(0, p.lq, 0, p.lk, xp=xp)
    return masked_softmax(scores, allowed, xp=xp, may_hide=bias is not None)


def _materialized(p: Problem, *, want_lse: bool, xp: Namespace) -> tuple[Array, Array | None]:
    if p.lk == 0:
        return empty_keys(p, xp=xp)
    weights, row_max, total = _weights(p, xp=xp)
    out = expand(weights @ p.v, (*p.batch, p.lq, p.dv), xp=xp)  # (..., Lq, dv)
    if not want_lse:
        return out, None
    return out, expand(lse_from(row_max, total, xp=xp), (*p.batch, p.lq), xp=xp)  # (..., Lq)


def expand(x: Array, shape: tuple[int, ...], *, xp: Namespace) -> Array:
    """Broadcast ``x`` to ``shape`` as a fresh, writable array (no-op when it already fits)."""
    if tuple(x.shape) == shape:
        return x
    return xp.asarray(xp.broadcast_to(x, shape), copy=True)


def lse_from(row_max: Array, total: Array, *, xp: Namespace) -> Array:
    """``max + log(sum)``, ``-inf`` where the row saw nothing; shapes (..., Lq, 1) -> (..., Lq)."""
    seen = total > 0
    lse = row_max + xp.log(xp.where(seen, total, xp.ones_like(total)))
    lse = xp.where(seen, lse, xp.full_like(lse, -xp.inf))
    return lse[..., 0]


def attention_weights(
    query: Array,
    key: Array,
    /,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
) -> Array:
    """The attention weights ``softmax(Q Kᵀ · scale + bias)``, shape (..., Lq, Lk).

    Takes the same options as :func:`attention` (other than ``value``) with
    the same meaning. Each row sums to 1, or is all zeros when every key is
    hidden from it.

    Parameters
    ----------
    query : array, shape (..., Lq, d)
    key : array, shape (..., Lk, d)
    mask, bias, causal, scale, window, key_lengths, query_lengths
        As in :func:`attention`.

    Returns
    -------
    array, shape (..., Lq, Lk)
        In the inputs' namespace, dtype and device.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> x = np.eye(3, dtype=np.float32)
    >>> pa.attention_weights(x, x, causal=True, scale=0.0)
    array([[1.        , 0.        , 0.        ],
           [0.5       , 0.5       , 0.        ],
           [0.33333334, 0.33333334, 0.33333334]], dtype=float32)
    """
    xp = array_namespace(query, key, mask, bias, key_lengths, query_lengths)
    return weights_impl(
        query,
        key,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        window=window,
        key_lengths=key_lengths,
        query_lengths=query_lengths,
        xp=xp,
    )


def weights_impl(
    query: Array,
    key: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    xp: Namespace,
) -> Array:
    """:func:`attention_weights` for callers that already hold the namespace."""
    p = prepare(
        query,
        key,
        None,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        window=window,
        key_lengths=key_lengths,
        query_lengths=query_lengths,
        xp=xp,
    )
    if p.lk == 0:
        w = xp.zeros((*p.batch, p.lq, 0), dtype=p.q.dtype, device=p.device)
    else:
        w, _, _ = _weights(p, xp=xp)
        w = expand(w, (*p.batch, p.lq, p.lk), xp=xp)
    return narrow(w, p.out_dtype, xp=xp)
