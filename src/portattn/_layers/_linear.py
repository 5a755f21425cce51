r"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax attention weighs key ``j`` for query ``i`` by
:math:`\exp(q_i \cdot k_j)`. Replacing that kernel by a dot product of feature
maps, :math:`\phi(q_i) \cdot \phi(k_j)` with :math:`\phi(x) = \mathrm{elu}(x) + 1`,
lets the sums be reassociated:

.. math::

    o_i = \frac{\phi(q_i)^\top \sum_j \phi(k_j) v_j^\top}{\phi(q_i)^\top \sum_j \phi(k_j)}

so the (Lq, Lk) matrix is never formed. With a causal mask the sums become
prefix sums, which is exactly a recurrent network whose state is
:math:`S_i = \sum_{j \le i} \phi(k_j) v_j^\top` and
:math:`z_i = \sum_{j \le i} \phi(k_j)`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .._lib._checks import (
    broadcast_shapes,
    check_flag,
    check_floating,
    check_int,
    check_real,
    check_same_device,
    dtype_name,
    shown,
)
from .._lib._compat import array_namespace, device_of, is_array_api_obj, library_name
from .._lib._precision import compute_dtype, narrow
from .._lib._typing import Array, Namespace

__all__ = ["LinearAttentionState", "elu_feature_map", "linear_attention", "linear_attention_step"]

_DEFAULT_CHUNK = 64


class LinearAttentionState(NamedTuple):
    """The recurrent state of causal linear attention after some tokens."""

    kv: Array
    """:math:`S = \\sum_j \\phi(k_j) v_j^\\top`, shape (..., d, dv), compute dtype."""
    normalizer: Array
    """:math:`z = \\sum_j \\phi(k_j)`, shape (..., d), compute dtype."""


def _phi(x: Array, *, xp: Namespace) -> Array:
    # elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise. exp only ever sees
    # [log(smallest_normal), 0], so it neither overflows in the branch `where`
    # discards nor raises underflow; below that range the value is 0 (it would
    # be subnormal at most).
    lo = math.log(xp.finfo(x.dtype).smallest_normal)
    e = xp.exp(xp.clip(x, lo, 0.0))
    return xp.where(x > 0, x + 1, xp.where(x > lo, e, xp.zeros_like(x)))


def elu_feature_map(x: Array, /) -> Array:
    """The feature map ``elu(x) + 1`` of Katharopoulos et al.: positive, smooth, ~``x+1``.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> pa.elu_feature_map(np.array([-1.0, 0.0, 2.0]))
    array([0.36787944, 1.        , 3.        ])
    """
    xp = array_namespace(x, names=("x",))
    check_floating("x", x, xp=xp)
    work = compute_dtype(x.dtype, xp=xp)
    return narrow(_phi(xp.astype(x, work), xp=xp), x.dtype, xp=xp)


def _check_options(*, causal: object, eps: object, chunk_size: object) -> tuple[bool, float, int]:
    """Every option of :func:`linear_attention`, checked whichever form runs."""
    is_causal = check_flag("causal", causal)
    e = check_real("eps", eps, minimum=0.0)
    c = _DEFAULT_CHUNK if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
    return is_causal, e, c


def _validate(query: Array, key: Array, value: Array, *, xp: Namespace) -> None:
    for name, a in (("query", query), ("key", key), ("value", value)):
        check_floating(name, a, xp=xp)
        if a.ndim < 2:
            msg = (
                f"expected {name} to have shape (..., length, features), got shape {tuple(a.shape)}"
            )
            raise ValueError(msg)
    if int(key.shape[-1]) != int(query.shape[-1]):
        msg = (
            f"expected key to have feature size d={int(query.shape[-1])} like query "
            f"{tuple(query.shape)}, got key shape {tuple(key.shape)}"
        )
        raise ValueError(msg)
    if int(value.shape[-2]) != int(key.shape[-2]):
        msg = (
            f"expected value to have Lk={int(key.shape[-2])} rows like key {tuple(key.shape)}, "
            f"got value shape {tuple(value.shape)}"
        )
        raise ValueError(msg)
    broadcast_shapes(
        [(n, tuple(a.shape[:-2])) for n, a in (("query", query), ("key", key), ("value", value))]
    )


def linear_attention(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    causal: bool = False,
    eps: float = 1e-6,
    chunk_size: int | None = None,
) -> Array:
    r"""Linear attention with the ``elu + 1`` feature map, in O(L) time and memory.

    Non-causal: :math:`o_i = \phi(q_i)^\top S / (\phi(q_i)^\top z + \epsilon)`
    with :math:`S = \sum_j \phi(k_j) v_j^\top`, :math:`z = \sum_j \phi(k_j)`.
    Causal: the same with prefix sums over ``j <= i``, computed chunk by
    chunk with ``cumulative_sum`` so memory is O(L·dv + chunk·d·dv), never
    O(L²). Equal (to rounding) to running :func:`linear_attention_step`
    token by token.

    Parameters
    ----------
    query : array, shape (..., Lq, d)
        Queries, passed through the feature map.
    key : array, shape (..., Lk, d)
        Keys, passed through the feature map.
    value : array, shape (..., Lk, dv)
        Values. All three real floating; batch dimensions broadcast.
    causal : bool, optional
        Query ``i`` sees keys ``j <= i``; requires ``Lq == Lk``. Only
        ``True`` and ``False`` (or NumPy bools) are accepted.
    eps : float, optional
        Added to the denominator, as in the paper's reference code; any
        finite real number ``>= 0``.
    chunk_size : int, optional
        Tokens per prefix-sum chunk in the causal form (default 64); a
        positive int, checked in the non-causal form too.

    Returns
    -------
    array, shape (..., Lq, dv)
        In the inputs' library, dtype and device.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> q = k = np.zeros((3, 2))
    >>> v = np.arange(3.0).reshape(3, 1)
    >>> pa.linear_attention(q, k, v, causal=True, eps=0.0)  # phi(0) = 1: running means
    array([[0. ],
           [0.5],
           [1. ]])
    """
    xp = array_namespace(query, key, value, names=("query", "key", "value"))
    _validate(query, key, value, xp=xp)
    is_causal, e, chunk = _check_options(causal=causal, eps=eps, chunk_size=chunk_size)
    lq, lk = int(query.shape[-2]), int(key.shape[-2])
    if is_causal and lq != lk:
        msg = f"expected Lq == Lk for causal linear attention, got Lq={lq}, Lk={lk}"
        raise ValueError(msg)
    out_dtype = xp.result_type(query.dtype, key.dtype, value.dtype)
    work = compute_dtype(out_dtype, xp=xp)
    fq = _phi(xp.astype(query, work), xp=xp)  # (..., Lq, d)
    fk = _phi(xp.astype(key, work), xp=xp)  # (..., Lk, d)
    v = xp.astype(value, work)  # (..., Lk, dv)
    if is_causal:
        out = _causal(fq, fk, v, eps=e, chunk_size=chunk, xp=xp)
    else:
        kv = xp.matrix_transpose(fk) @ v  # (..., d, dv)
        z = xp.sum(fk, axis=-2)  # (..., d)
        num = fq @ kv  # (..., Lq, dv)
        den = xp.sum(fq * z[..., None, :], axis=-1, keepdims=True)  # (..., Lq, 1)
        out = num / (den + e)
    return narrow(out, out_dtype, xp=xp)


def _causal(fq: Array, fk: Array, v: Array, *, eps: float, chunk_size: int, xp: Namespace) -> Array:
    c = chunk_size
    n, d, dv = int(fq.shape[-2]), int(fq.shape[-1]), int(v.shape[-1])
    batch = broadcast_shapes(
        [
            ("query", tuple(fq.shape[:-2])),
            ("key", tuple(fk.shape[:-2])),
            ("value", tuple(v.shape[:-2])),
        ]
    )
    s = xp.zeros((*batch, d, dv), dtype=fq.dtype, device=device_of(fq))  # running S
    z = xp.zeros((*batch, d), dtype=fq.dtype, device=device_of(fq))  # running z
    outs = []
    for c0 in range(0, n, c):
        c1 = min(n, c0 + c)
        fk_c, v_c, fq_c = fk[..., c0:c1, :], v[..., c0:c1, :], fq[..., c0:c1, :]
        outer = fk_c[..., :, :, None] * v_c[..., :, None, :]  # (..., C, d, dv)
        s_pre = s[..., None, :, :] + xp.cumulative_sum(outer, axis=-3)  # (..., C, d, dv)
        z_pre = z[..., None, :] + xp.cumulative_sum(fk_c, axis=-2)  # (..., C, d)
        num = (fq_c[..., :, None, :] @ s_pre)[..., 0, :]  # (..., C, dv)
        den = xp.sum(fq_c * z_pre, axis=-1, keepdims=True)  # (..., C, 1)
        outs.append(num / (den + eps))
        s, z = s_pre[..., -1, :, :], z_pre[..., -1, :]
    if not outs:
        return xp.zeros((*batch, 0, dv), dtype=fq.dtype, device=device_of(fq))
    return xp.concat(outs, axis=-2) if len(outs) > 1 else outs[0]


def linear_attention_step(
    query: Array,
    key: Array,
    value: Array,
    /,
    state: LinearAttentionState | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[Array, LinearAttentionState]:
    """One token of causal linear attention as a recurrent network: the RNN view.

    ``S += φ(k) vᵀ``, ``z += φ(k)``, then ``o = φ(q)ᵀ S / (φ(q)ᵀ z + eps)``.
    Feeding a sequence through token by token gives :func:`linear_attention`
    with ``causal=True``, in O(1) memory per step.

    Parameters
    ----------
    query, key : array, shape (..., d)
        The current token's query and key.
    value : array, shape (..., dv)
        The current token's value; batch dimensions broadcast.
    state : LinearAttentionState, optional
        The state after the previous tokens, as a previous call returned it:
        ``kv`` of shape (..., d, dv) and ``normalizer`` (..., d), in the
        compute dtype, library and device of the inputs. ``None`` starts
        from zeros. It is read, never modified.
    eps : float, optional
        As in :func:`linear_attention`.

    Returns
    -------
    output : array, shape (..., dv)
        In the inputs' library and dtype.
    state : LinearAttentionState
        A new state; the old one is not modified.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> q = k = np.zeros(2)
    >>> out, state = pa.linear_attention_step(q, k, np.array([4.0]), eps=0.0)
    >>> out, state = pa.linear_attention_step(q, k, np.array([2.0]), state, eps=0.0)
    >>> out  # running mean of the values
    array([3.])
    """
    xp = array_namespace(query, key, value, names=("query", "key", "value"))
    for name, a in (("query", query), ("key", key), ("value", value)):
        check_floating(name, a, xp=xp)
        if a.ndim < 1:
            msg = f"expected {name} to have shape (..., features), got a 0-d array"
            raise ValueError(msg)
    d, dv = int(query.shape[-1]), int(value.shape[-1])
    if int(key.shape[-1]) != d:
        msg = f"expected key to have d={d} features like query, got key shape {tuple(key.shape)}"
        raise ValueError(msg)
    e = check_real("eps", eps, minimum=0.0)
    batch = broadcast_shapes(
        [(n, tuple(a.shape[:-1])) for n, a in (("query", query), ("key", key), ("value", value))]
    )
    out_dtype = xp.result_type(query.dtype, key.dtype, value.dtype)
    work = compute_dtype(out_dtype, xp=xp)
    if state is not None:
        _check_state(state, d=d, dv=dv, batch=batch, work=work, xp=xp, like=query)
    fq = _phi(xp.astype(query, work), xp=xp)  # (..., d)
    fk = _phi(xp.astype(key, work), xp=xp)
    v = xp.astype(value, work)  # (..., dv)
    outer = fk[..., :, None] * v[..., None, :]  # (..., d, dv)
    if state is None:
        s, z = outer, fk
    else:
        s, z = state.kv + outer, state.normalizer + fk
    num = (fq[..., None, :] @ s)[..., 0, :]  # (..., dv)
    den = xp.sum(fq * z, axis=-1, keepdims=True)  # (..., 1)
    out = num / (den + e)
    return narrow(out, out_dtype, xp=xp), LinearAttentionState(s, z)


def _check_state(
    state: object,
    *,
    d: int,
    dv: int,
    batch: tuple[int, ...],
    work: object,
    xp: Namespace,
    like: Array,
) -> None:
    """Raise unless ``state`` is a state this step can continue from."""
    if not isinstance(state, LinearAttentionState):
        msg = (
            "expected state to be a LinearAttentionState (as returned by the previous step) "
            f"or None, got {shown(state)}"
        )
        raise TypeError(msg)
    for name, a in (("state.kv", state.kv), ("state.normalizer", state.normalizer)):
        if not is_array_api_obj(a):
            msg = f"expected {name} to be an array, got {shown(a)}"
            raise TypeError(msg)
        if array_namespace(a) is not xp:
            msg = (
                f"expected {name} to come from the inputs' library {library_name(like)}, "
                f"got an array from {library_name(a)}"
            )
            raise TypeError(msg)
        if a.dtype != work:
            msg = (
                f"expected {name} in the compute dtype {dtype_name(work)}, "
                f"got {dtype_name(a.dtype)}"
            )
            raise TypeError(msg)
    kv, z = state.kv, state.normalizer
    if kv.ndim < 2 or tuple(kv.shape[-2:]) != (d, dv):
        msg = f"expected state.kv of shape (..., d={d}, dv={dv}), got shape {tuple(kv.shape)}"
        raise ValueError(msg)
    if tuple(z.shape) != tuple(kv.shape[:-1]):
        msg = (
            f"expected state.normalizer of shape {tuple(kv.shape[:-1])} (state.kv's without "
            f"its last axis), got shape {tuple(z.shape)}"
        )
        raise ValueError(msg)
    broadcast_shapes([("the inputs' batch shape", batch), ("state", tuple(kv.shape[:-2]))])
    check_same_device([("query", like), ("state.kv", kv), ("state.normalizer", z)])
