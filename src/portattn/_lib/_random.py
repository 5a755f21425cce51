"""Seeded weights and inputs, bit-identical on every backend: drawn once in float64, then moved."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._checks import check_dtype, check_int
from ._typing import Array, Device, DType, Namespace

__all__ = ["draw_weights", "from_numpy_float64", "standard_normal"]


def standard_normal(shape: tuple[int, ...], *, seed: int) -> np.ndarray:
    """I.i.d. N(0, 1) float64 draws from NumPy's PCG64 seeded with ``seed``.

    Weights are drawn here, once, in float64, and only then converted, which
    is what makes them bit-identical on every backend.
    """
    s = check_int("seed", seed, minimum=0)
    return np.random.Generator(np.random.PCG64(s)).standard_normal(shape)


def from_numpy_float64(
    a: np.ndarray, *, xp: Namespace, dtype: DType | None, device: Device | None
) -> Array:
    """Move float64 NumPy data to ``xp``/``device`` and round to ``dtype`` (default float32).

    Rounding happens in NumPy when the target is float32 or float64 so every
    backend receives identical bits; narrower targets round on the backend
    from float32, which is exact-rounding everywhere.
    """
    target = xp.float32 if dtype is None else check_dtype("dtype", dtype, xp=xp)
    if target == xp.float64:
        return xp.asarray(a, dtype=xp.float64, device=device)
    f32 = xp.asarray(a.astype(np.float32), dtype=xp.float32, device=device)
    return f32 if target == xp.float32 else xp.astype(f32, target)


def draw_weights(
    shapes: Sequence[tuple[int, ...]],
    scales: Sequence[float],
    *,
    seed: int,
    xp: Namespace,
    dtype: DType | None,
    device: Device | None,
) -> list[Array]:
    """Arrays of ``shapes`` filled in order from one float64 draw, each times its scale.

    One :func:`standard_normal` draw of all the entries, cut in order: the
    layers' seeded weights (``Head.random``, ``MultiHeadAttention.random``).
    """
    sizes = [math.prod(shape) for shape in shapes]
    flat = standard_normal((sum(sizes),), seed=seed)
    out, end = [], 0
    for shape, size, scale in zip(shapes, sizes, scales, strict=True):
        a = flat[end : end + size].reshape(shape) * scale
        out.append(from_numpy_float64(a, xp=xp, dtype=dtype, device=device))
        end += size
    return out
