"""Positions: sinusoidal encodings (Vaswani et al. 2017) and rotary embeddings (RoPE, Su et al.).

Attention by itself is permutation equivariant: it cannot tell token order.
Both encodings break that symmetry. The sinusoidal one is *added* to the
token embeddings; RoPE *rotates* queries and keys so that the score between
positions ``m`` and ``n`` depends on ``m - n`` only.

Frequencies are computed once in float64 NumPy (deterministic, identical on
every backend); angles and rotations run on the caller's backend in the
compute dtype (float64 stays float64, float16/bfloat16 use float32).
"""

from __future__ import annotations

import numbers
from typing import Literal

import numpy as np

from .._lib._checks import (
    broadcast_shapes,
    check_dtype,
    check_floating,
    check_int,
    check_real,
    dtype_name,
    shown,
)
from .._lib._compat import array_namespace, device_of, resolve_namespace
from .._lib._precision import compute_dtype, narrow
from .._lib._typing import Array, Device, DType, Namespace

__all__ = [
    "RopeLayout",
    "apply_rope",
    "check_rope",
    "check_rope_call",
    "rope_heads",
    "rope_positions",
    "sinusoidal_encoding",
]

RopeLayout = Literal["half", "interleaved"]
_LAYOUTS = ("half", "interleaved")


def _check_even(name: str, d: object) -> int:
    n = check_int(name, d, minimum=2)
    if n % 2:
        msg = f"expected {name} to be a positive even int (features come in sin/cos pairs), got {n}"
        raise ValueError(msg)
    return n


def check_rope(rope: object, d_head: int) -> None:
    """A layer's ``rope=``: ``None``, or a layout whose pairs fit ``d_head`` (even)."""
    if rope is not None and (rope not in _LAYOUTS or d_head % 2):
        msg = (
            "expected rope to be None, 'half' or 'interleaved' with an even d_head, "
            f"got rope={rope!r} with d_head={d_head}"
        )
        raise ValueError(msg)


def check_rope_call(
    rope: object, positions: Array | None, context: Array | None, x_shape: tuple[int, ...]
) -> None:
    """A layer call's ``positions`` and ``context`` against its ``rope`` and tokens (..., Lq, d)."""
    if context is not None and rope is not None:
        msg = (
            "expected context=None with rope: RoPE rotates by positions within one "
            "sequence, and a cross-attention context has no shared positions"
        )
        raise ValueError(msg)
    if positions is not None and rope is None:
        msg = "expected positions=None for a MultiHeadAttention built with rope=None"
        raise ValueError(msg)
    lq = x_shape[-2]
    if positions is not None and (positions.ndim < 1 or int(positions.shape[-1]) != lq):
        msg = (
            f"expected positions of shape (..., Lq={lq}) like x {x_shape}, "
            f"got shape {tuple(int(n) for n in positions.shape)}"
        )
        raise ValueError(msg)


def _check_base(base: object) -> float:
    return check_real("base", base, above=1.0)


def _inverse_frequencies(
    d: int, base: float, *, xp: Namespace, dtype: DType, device: Device
) -> Array:
    """``base ** (-2i/d)`` for ``i = 0 .. d/2 - 1``, from float64 NumPy."""
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if dtype == xp.float32:
        return xp.asarray(inv.astype(np.float32), dtype=xp.float32, device=device)
    return xp.asarray(inv, dtype=dtype, device=device)  # float64 (or a wider NumPy float)


def _angles(positions: Array, d: int, base: float, *, xp: Namespace, work: DType) -> Array:
    """``positions[..., None] * inv_freq``: shape ``positions.shape + (d/2,)``."""
    dev = device_of(positions)
    inv = _inverse_frequencies(d, base, xp=xp, dtype=work, device=dev)
    return xp.astype(positions, work)[..., None] * inv


def _check_positions(positions: Array, *, xp: Namespace) -> None:
    if not (
        xp.isdtype(positions.dtype, "integral") or xp.isdtype(positions.dtype, "real floating")
    ):
        got = dtype_name(positions.dtype)
        msg = f"expected positions to be an integer or real floating array, got {got}"
        raise TypeError(msg)
    if positions.ndim < 1:
        msg = f"expected positions to have shape (..., length), got shape {tuple(positions.shape)}"
        raise ValueError(msg)


def sinusoidal_encoding(
    positions: int | Array,
    d_model: int,
    /,
    *,
    base: float = 10000.0,
    xp: Namespace | None = None,
    dtype: DType | None = None,
    device: Device | None = None,
) -> Array:
    r"""Sinusoidal position encodings of Vaswani et al. (2017), to be added to embeddings.

    .. math::

        PE_{p, 2i} = \sin(p / \mathrm{base}^{2i/d}), \qquad
        PE_{p, 2i+1} = \cos(p / \mathrm{base}^{2i/d})

    Sines and cosines are interleaved along the feature axis, as in the paper.

    Parameters
    ----------
    positions : int or array of shape (..., length)
        An int ``n`` means positions ``0, 1, ..., n-1``; an integer or real
        array gives them explicitly (its library and device are used).
    d_model : int
        Feature width; must be even.
    base : float, optional
        The wavelength base, 10000 in the paper.
    xp : namespace or module, optional
        Array library when ``positions`` is an int; ``None`` means NumPy.
    dtype : dtype, optional
        Real floating dtype of the result; default float32.
    device : optional
        Device when ``positions`` is an int.

    Returns
    -------
    array, shape (..., length, d_model)

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> pe = pa.sinusoidal_encoding(3, 4, xp=np, dtype=np.float64)
    >>> pe.shape
    (3, 4)
    >>> pe[0]  # position 0: sin 0 = 0, cos 0 = 1
    array([0., 1., 0., 1.])
    """
    d = _check_even("d_model", d_model)
    b = _check_base(base)
    if isinstance(positions, bool):
        msg = f"expected positions to be an int length or an array, got {positions!r}"
        raise TypeError(msg)
    if isinstance(positions, numbers.Integral):
        n = int(positions)
        if n < 0:
            msg = f"expected positions to be a non-negative length, got {n}"
            raise ValueError(msg)
        ns = resolve_namespace(xp)
        target = ns.float32 if dtype is None else check_dtype("dtype", dtype, xp=ns)
        pos = ns.arange(n, dtype=ns.int64, device=device)
    else:
        if isinstance(positions, (numbers.Number, str)) or positions is None:
            msg = f"expected positions to be an int length or an array, got {shown(positions)}"
            raise TypeError(msg)
        ns = array_namespace(positions, names=("positions",))
        _check_positions(positions, xp=ns)
        target = ns.float32 if dtype is None else check_dtype("dtype", dtype, xp=ns)
        pos = positions
    work = compute_dtype(target, xp=ns)
    ang = _angles(pos, d, b, xp=ns, work=work)  # (..., L, d/2)
    pe = ns.stack((ns.sin(ang), ns.cos(ang)), axis=-1)  # (..., L, d/2, 2)
    pe = ns.reshape(pe, (*pe.shape[:-2], d))  # (..., L, d): sin, cos, sin, cos, ...
    return narrow(pe, target, xp=ns)


def rope_positions(
    length: int, /, *, offset: int = 0, xp: Namespace | None = None, device: Device | None = None
) -> Array:
    """Integer positions ``offset, offset + 1, ..., offset + length - 1`` (int64).

    Examples
    --------
    >>> import portattn as pa
    >>> pa.rope_positions(3, offset=5).tolist()
    [5, 6, 7]
    """
    n = check_int("length", length, minimum=0)
    start = check_int("offset", offset, minimum=0)
    ns = resolve_namespace(xp)
    return ns.arange(start, start + n, dtype=ns.int64, device=device)


def apply_rope(
    x: Array,
    /,
    positions: Array | None = None,
    *,
    layout: RopeLayout = "half",
    base: float = 10000.0,
) -> Array:
    r"""Rotary position embedding: rotate feature pairs of ``x`` by position-dependent angles.

    Pair ``i`` of the token at position ``p`` is rotated by the angle
    :math:`p\,\theta_i` with :math:`\theta_i = \mathrm{base}^{-2i/d}`. Seen
    as a complex number :math:`z_i`, the pair becomes
    :math:`z_i e^{\mathrm{i}\,p\,\theta_i}`. Because rotations compose, the
    dot product of a query rotated at ``m`` and a key rotated at ``n``
    depends on ``m - n`` only.

    Parameters
    ----------
    x : array, shape (..., length, d)
        Real floating queries or keys; ``d`` must be even.
    positions : array, optional
        Integer (or real) positions broadcastable to ``x.shape[:-1]``, with
        last axis ``length``. Default: ``0, 1, ..., length - 1``.
    layout : {"half", "interleaved"}, optional
        Which features form a pair. ``"half"`` (default; GPT-NeoX, Llama,
        Hugging Face ``rotate_half``): feature ``i`` pairs with
        ``i + d/2``, real parts first. ``"interleaved"`` (the RoFormer paper,
        GPT-J, Meta's original Llama): features ``2i`` and ``2i + 1`` pair.
        The two differ by a fixed permutation of features, so weights
        trained with one do not transfer to the other without it.
    base : float, optional
        Frequency base, 10000 in the paper.

    Returns
    -------
    array
        Same shape, dtype, library and device as ``x``.

    Raises
    ------
    ValueError
        ``d`` odd; an unknown layout; positions whose last axis is not
        ``length`` or that do not broadcast to ``x.shape[:-1]``.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> x = np.array([[1.0, 0.0], [1.0, 0.0]])
    >>> r = pa.apply_rope(x, np.array([0, 1]))
    >>> r[1]  # position 1 rotates the pair (1, 0) by 1 radian: (cos 1, sin 1)
    array([0.54030231, 0.84147098])
    """
    xp = array_namespace(x, positions, names=("x", "positions"))
    return rope_impl(x, positions, layout=layout, base=base, xp=xp)


def rope_impl(
    x: Array, positions: Array | None, *, layout: str, base: float, xp: Namespace
) -> Array:
    """:func:`apply_rope` for callers that already hold the namespace."""
    check_floating("x", x, xp=xp)
    if layout not in _LAYOUTS:
        msg = f"expected layout to be 'half' or 'interleaved', got {layout!r}"
        raise ValueError(msg)
    if x.ndim < 2:
        msg = f"expected x to have shape (..., length, d), got shape {tuple(x.shape)}"
        raise ValueError(msg)
    length, d = int(x.shape[-2]), int(x.shape[-1])
    if d % 2:
        msg = f"expected x to have an even feature size d (pairs are rotated), got d={d}"
        raise ValueError(msg)
    b = _check_base(base)
    dev = device_of(x)
    if positions is None:
        # The default integer dtype: int64 is not JAX's without x64 (it warns and truncates).
        positions = xp.arange(length, device=dev)
    else:
        _check_positions(positions, xp=xp)
        if int(positions.shape[-1]) != length:
            msg = (
                f"expected positions to have length {length} on their last axis like x "
                f"{tuple(x.shape)}, got positions shape {tuple(positions.shape)}"
            )
            raise ValueError(msg)
        lead = tuple(x.shape[:-1])
        if (
            broadcast_shapes([("x.shape[:-1]", lead), ("positions", tuple(positions.shape))])
            != lead
        ):
            got = tuple(positions.shape)
            msg = f"expected positions to be broadcastable to {lead}, got shape {got}"
            raise ValueError(msg)
    work = compute_dtype(x.dtype, xp=xp)
    ang = _angles(positions, d, b, xp=xp, work=work)  # (..., L, d/2)
    cos, sin = xp.cos(ang), xp.sin(ang)
    xw = xp.astype(x, work)
    if layout == "half":
        re, im = xw[..., : d // 2], xw[..., d // 2 :]
    else:
        pairs = xp.reshape(xw, (*xw.shape[:-1], d // 2, 2))  # (..., L, d/2, 2)
        re, im = pairs[..., 0], pairs[..., 1]
    # (re + i im) * (cos + i sin)
    out_re = re * cos - im * sin
    out_im = re * sin + im * cos
    if layout == "half":
        out = xp.concat((out_re, out_im), axis=-1)
    else:
        out = xp.stack((out_re, out_im), axis=-1)
        out = xp.reshape(out, (*out.shape[:-2], d))
    return narrow(out, x.dtype, xp=xp)


def rope_heads(
    q: Array,
    k: Array,
    positions: Array | None,
    *,
    offset: int,
    layout: str,
    base: float,
    xp: Namespace,
) -> tuple[Array, Array]:
    """RoPE on head-major queries (..., H, L, d) and keys (..., Hkv, L, d) of one sequence.

    ``positions`` (..., L), checked by the caller, are the tokens'
    positions, shared by every head; ``None`` means ``offset, ...,
    offset + L - 1`` (``offset`` is the number of tokens already in a KV
    cache).
    """
    length = int(q.shape[-2])
    if positions is None:
        positions = xp.arange(offset, offset + length, device=device_of(q))  # default int dtype
    per_head = xp.reshape(positions, (*positions.shape[:-1], 1, length))  # (..., 1, L)
    q = rope_impl(q, per_head, layout=layout, base=base, xp=xp)
    k = rope_impl(k, per_head, layout=layout, base=base, xp=xp)
    return q, k
