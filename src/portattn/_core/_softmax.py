"""A softmax that never overflows, never warns, and sends fully masked rows to zero.

Sinks (gpt-oss) are one more logit per row whose value is 0:
:func:`add_sink` folds ``exp(sink)`` into a row's running softmax.
"""

from __future__ import annotations

import math
import numbers

from .._lib._checks import check_floating, shown
from .._lib._compat import (
    array_namespace,
    clipped_exp,
    device_of,
    host_float,
    is_concrete,
    max_last,
    shifted_exp,
    sum_last,
)
from .._lib._precision import compute_dtype, narrow
from .._lib._typing import Array, Device, DType, Namespace

__all__ = [
    "add_sink",
    "exp_floor",
    "floored_exp",
    "lse_from",
    "masked_exp",
    "masked_softmax",
    "no_keys",
    "nonzero",
    "row_shift",
    "safe_exp",
    "softmax",
]


def exp_floor(dtype: object, *, xp: Namespace) -> float:
    """Below this exponent a weight is treated as exactly 0.

    ``exp`` of anything smaller would underflow (and raise under
    ``np.errstate(all="raise")``), and the weight it gives is at least 1e13
    times smaller than the smallest normal number, far below any precision
    the result can hold; the margin keeps ``e / sum`` normal as well.
    """
    key = (type(dtype), dtype)
    floor = _FLOOR_BY_DTYPE.get(key)
    if floor is None:
        floor = _FLOOR_BY_DTYPE[key] = _FLOORS[xp.finfo(dtype).bits]
    return floor


# Compute dtypes are float32 and float64 only (see _lib._precision).
# Keyed by the dtype's class as well (see _lib._checks.has_kind): finfo costs a
# microsecond, and small calls ask once per call.
_FLOOR_BY_DTYPE: dict[tuple[type, object], float] = {}
_FLOORS = {bits: math.log(tiny) + 30.0 for bits, tiny in ((32, 2.0**-126), (64, 2.0**-1022))}


def safe_exp(z: Array, floor: float, *, xp: Namespace) -> Array:
    """``exp(z)`` for ``z <= 0``, with ``z < floor`` sent to exactly 0 instead of underflowing."""
    return xp.exp(xp.where(z < floor, -math.inf, z))


def floored_exp(z: Array, floor: float, *, xp: Namespace, overwrite: bool = False) -> Array:
    """:func:`safe_exp` without ever handing ``exp`` an input whose result underflows.

    On CPUs, ``exp`` of an input whose result is subnormal or 0 takes a slow
    path: torch's vectorised ``exp`` runs 13-40 times slower on such inputs
    (``-inf`` included), NumPy's up to 3 times, and a matmul with subnormal
    weights slows too. A tile whose row spans more than the floor (ALiBi's
    distant keys, a masking ``score_mod``) is full of them. So the exponent
    is raised to a floor ``f`` first, and ``exp(f)`` subtracted after::

        exp(max(z, f)) - exp(f)

    Every ``z <= f`` (``-inf`` too) becomes one number minus itself: exactly
    0, as :func:`safe_exp` gives. Above the floor a weight moves by
    ``exp(f)``, below float32's rounding for any weight above ``1e-10`` of
    the row's top one. ``f`` sits ``log(1 / eps)`` above :func:`exp_floor`, so
    every nonzero weight (steps of ``eps * exp(f)`` above 0) is still at
    least ``exp(exp_floor)``: no flag, no subnormal. NaN stays NaN.

    This needs ``exp(f)`` exactly as the library's own ``exp`` gives it,
    which is read once per library, dtype and device from concrete arrays
    (:func:`_floor_weight`). Under a trace, or where the library's ``exp``
    gives ``f`` different values at different positions, it is
    :func:`safe_exp`. ``overwrite=True`` lets it compute into ``z``, the
    caller's scratch (see :func:`~portattn._lib._compat.clipped_exp`).
    """
    if is_concrete(z):
        high = floor - math.log(xp.finfo(z.dtype).eps)
        weight = _floor_weight(z, high, xp=xp)
        if weight is not None:
            e = clipped_exp(z, high, xp=xp, overwrite=overwrite)
            if getattr(e, "requires_grad", False):  # autograd saved e for exp's gradient
                return e - weight
            e -= weight  # a fresh array: in place saves an allocation and a pass
            return e
    return safe_exp(z, floor, xp=xp)


# (array type, dtype, device) -> exp(floor) as that library computes it, or
# None where its exp is not one function of its input.
_FLOOR_WEIGHTS: dict[tuple[type, str, str], float | None] = {}


def _floor_weight(z: Array, floor: float, *, xp: Namespace) -> float | None:
    """The library's own ``exp(floor)`` in ``z``'s dtype and device, if every position agrees.

    Vectorised ``exp`` kernels run a block's body and its tail through
    different code; lengths up to 67 and one long array cover both, for
    vector widths up to 64 lanes. Read on the host once, then cached.
    """
    device = device_of(z)
    key = (type(z), str(z.dtype), str(device))
    if key not in _FLOOR_WEIGHTS:
        seen = set()
        for n in (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 67, 1031):
            e = xp.exp(xp.full((n,), floor, dtype=z.dtype, device=device))
            seen |= {host_float(xp.min(e)), host_float(xp.max(e))}
        weight = seen.pop() if len(seen) == 1 else None
        _FLOOR_WEIGHTS[key] = weight if weight is not None and weight > 0 else None
    return _FLOOR_WEIGHTS[key]


def row_shift(row_max: Array, *, xp: Namespace) -> Array:
    """What to subtract from each row: its max, or 0 where the max is infinite.

    A row that sees nothing has max ``-inf``; shifting it by 0 means
    ``-inf - -inf`` (NaN) never happens, and its ``exp`` terms stay exact 0s.
    """
    return xp.where(xp.isinf(row_max), 0.0, row_max)


def no_keys(
    batch: tuple[int, ...], rows: int, dv: int, *, dtype: DType, device: Device, xp: Namespace
) -> tuple[Array, Array]:
    """Rows that see no key: output zeros (..., rows, dv) and lse ``-inf`` (..., rows)."""
    out = xp.zeros((*batch, rows, dv), dtype=dtype, device=device)
    lse = xp.full((*batch, rows), -math.inf, dtype=dtype, device=device)
    return out, lse


def masked_exp(
    scores: Array,
    allowed: Array | None,
    *,
    xp: Namespace,
    may_hide: bool = True,
    no_empty_rows: bool = False,
) -> tuple[Array, Array, Array]:
    """The unnormalised softmax over the last axis where ``allowed``: ``(exp(s - max), max, sum)``.

    Hidden entries become ``-inf`` before the row max is taken and get an
    exact 0. A row with nothing visible keeps max ``-inf``, is shifted by 0
    instead (so ``-inf - -inf`` never happens) and sums to 0. ``max`` and
    ``sum`` keep their last axis, so callers can form the log-sum-exp or
    normalise whatever is cheaper: the weights, or the weighted values. No
    floating-point flag is raised, underflow included.

    ``may_hide=False`` promises that no entry is ``-inf`` (no mask, no bias),
    so no row can be empty and those guards are skipped: small calls are
    dominated by per-operation overhead. ``no_empty_rows=True`` promises
    that ``allowed`` leaves every row an entry (a causal triangle hides
    entries but leaves every row its first key), so no row max is ``-inf``
    and the shift needs no guard.
    """
    floor = exp_floor(scores.dtype, xp=xp)
    if not may_hide and allowed is None:
        # Nothing is -inf, so no row is empty; raising exponents below the
        # floor to the floor turns weights under 1e-25 (float32) into weights
        # under 1e-25: one cheap pass instead of a compare and a where.
        # scores - row_max is fresh scratch: clipped and exponentiated in place
        # on NumPy and torch (two fewer allocations of the scores' size).
        return shifted_exp(scores, floor, xp=xp)
    # Python scalars in where() keep the array's dtype (array API 2024.12).
    if allowed is not None:
        scores = xp.where(allowed, scores, -math.inf)
    row_max = max_last(scores, xp=xp)
    if no_empty_rows and not may_hide:
        e = safe_exp(scores - row_max, floor, xp=xp)  # hidden entries: exp(-inf) = 0
    else:
        e = safe_exp(scores - row_shift(row_max, xp=xp), floor, xp=xp)
    return e, row_max, sum_last(e, xp=xp)


def nonzero(total: Array, *, xp: Namespace) -> Array:
    """``total`` with zeros (rows that saw nothing) replaced by 1, to divide by."""
    return xp.where(total > 0, total, 1.0)


def masked_softmax(
    scores: Array, allowed: Array | None, *, xp: Namespace, may_hide: bool = True
) -> tuple[Array, Array, Array]:
    """Softmax over the last axis of ``scores`` where ``allowed``; returns ``(weights, max, sum)``.

    As :func:`masked_exp`, normalised: a row with nothing visible comes out
    as zeros, never NaN.
    """
    e, row_max, total = masked_exp(scores, allowed, xp=xp, may_hide=may_hide)
    if not may_hide and allowed is None:
        return e / total, row_max, total
    return e / nonzero(total, xp=xp), row_max, total


def lse_from(row_max: Array, total: Array, *, xp: Namespace) -> Array:
    """``max + log(sum)``, ``-inf`` where the row saw nothing; shapes (..., Lq, 1) -> (..., Lq).

    A NaN sum (a NaN input or sink) stays NaN: ``-inf`` means "saw no key".
    """
    unseen = total == 0
    lse = row_max + xp.log(xp.where(unseen, 1.0, total))
    lse = xp.where(unseen, -math.inf, lse)
    return lse[..., 0]


def add_sink(
    acc: Array, total: Array, m: Array, sink: Array, *, xp: Namespace
) -> tuple[Array, Array, Array]:
    """Fold one more logit, ``sink`` (value 0), into a row's running softmax.

    ``acc`` (..., Tq, dv) and ``total`` (..., Tq, 1) are the weighted values
    and the sum of weights relative to the row shift ``m`` (..., Tq, 1);
    ``m = -inf`` means the row has seen nothing (``acc``, ``total`` are 0).
    Returns them relative to the new shift ``max(m, sink)``. The sink's value
    is 0, so it only grows the denominator: a row that sees no key keeps
    ``acc = 0`` and outputs 0.
    """
    floor = exp_floor(m.dtype, xp=xp)
    top = xp.maximum(m, sink)
    shift = xp.where(xp.isinf(top), 0.0, top)  # -inf sink and nothing seen: shift by 0
    alpha = safe_exp(m - shift, floor, xp=xp)
    total = total * alpha + safe_exp(sink - shift, floor, xp=xp)
    return acc * alpha, total, top


def softmax(x: Array, /, *, axis: int = -1) -> Array:
    """Numerically stable softmax along ``axis``.

    The row maximum is subtracted before exponentiating, and entries so far
    below it that their weight is below the smallest normal number are set
    to exactly 0 *before* the subtraction, so every finite input is in
    range, the extremes of the dtype included (``[3.4e38, -3.4e38]`` in
    float32 gives ``[1, 0]``), and no floating-point flag is raised. A slice
    that is entirely ``-inf`` (nothing to attend to) gives zeros rather than
    NaN. A slice holding ``+inf`` or NaN comes out all NaN: it has no
    meaningful softmax, and NaN says so rather than a plausible number.
    float16 and bfloat16 inputs are computed in float32 and cast back.

    Parameters
    ----------
    x : array
        Real floating array.
    axis : int, optional
        Axis to normalise over, any integer (``np.int64`` too). Default: the
        last.

    Returns
    -------
    array
        Same shape, dtype, namespace and device as ``x``; each slice along
        ``axis`` sums to 1 (or is all zeros).

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> pa.softmax(np.array([[0.0, 0.0], [-np.inf, -np.inf]]))
    array([[0.5, 0.5],
           [0. , 0. ]])
    """
    xp = array_namespace(x, names=("x",))
    check_floating("x", x, xp=xp)
    if (
        not isinstance(axis, numbers.Integral)
        or isinstance(axis, bool)
        or not -x.ndim <= int(axis) < x.ndim
    ):
        msg = f"expected axis to be an int in [{-x.ndim}, {x.ndim}), got {shown(axis)}"
        raise ValueError(msg)
    axis = int(axis)
    dtype = x.dtype
    work = xp.astype(x, compute_dtype(dtype, xp=xp), copy=False)
    if x.shape[axis] == 0:
        return narrow(xp.asarray(work, copy=True), dtype, xp=xp)
    moved = axis not in (-1, x.ndim - 1)
    if moved:
        work = xp.moveaxis(work, axis, -1)
    weights = _safe_softmax(work, xp=xp)
    if moved:
        weights = xp.moveaxis(weights, -1, axis)
    return narrow(weights, dtype, xp=xp)


def _safe_softmax(x: Array, *, xp: Namespace) -> Array:
    """Softmax over the last axis in which ``x - max`` is never formed where it could overflow.

    An entry below ``max + floor`` gets weight exactly 0 and is replaced by
    the max before subtracting, so the subtraction only ever sees pairs
    within ``-floor`` of each other (``max + floor`` itself is in range for
    any finite max: it only rounds).
    """
    floor = exp_floor(x.dtype, xp=xp)
    row_max = xp.max(x, axis=-1, keepdims=True)
    shift = row_shift(row_max, xp=xp)
    keep = x >= shift + floor
    e = xp.where(keep, xp.exp(xp.where(keep, x, shift) - shift), 0.0)
    total = nonzero(xp.sum(e, axis=-1, keepdims=True), xp=xp)
    # A slice whose max is +inf or NaN holds +inf or NaN: make all of it NaN.
    poisoned = xp.logical_not(xp.logical_or(xp.isfinite(row_max), row_max == -math.inf))
    return e / xp.where(poisoned, math.nan, total)
