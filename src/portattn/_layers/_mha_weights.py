"""The weights of a :class:`~portattn.MultiHeadAttention`: their shapes checked, or drawn at random.

The head counts and widths are read off the matrices, so a layer is fully
described by its weights and ``num_heads`` / ``num_kv_heads``; this module
checks that the matrices agree with each other before the class keeps them.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .._lib._checks import check_array, check_flag, check_floating, check_int, check_same_device
from .._lib._compat import array_namespace
from .._lib._random import from_numpy_float64, standard_normal
from .._lib._typing import Array, Device, DType, Namespace

__all__ = ["Sizes", "check_heads", "check_weights", "random_weights", "weights_namespace"]


class Sizes(NamedTuple):
    """The sizes a layer's weights imply."""

    num_heads: int
    num_kv_heads: int
    d_head: int
    d_model: int
    d_context: int


def check_heads(num_heads: object, num_kv_heads: object) -> tuple[int, int]:
    """``(H, Hkv)``: positive, ``Hkv`` dividing ``H``; ``num_kv_heads=None`` means ``H``."""
    h = check_int("num_heads", num_heads, minimum=1)
    hkv = h if num_kv_heads is None else check_int("num_kv_heads", num_kv_heads, minimum=1)
    if h % hkv:
        msg = (
            f"expected num_kv_heads to divide num_heads (each KV head serves a group of "
            f"query heads), got num_heads={h}, num_kv_heads={hkv}"
        )
        raise ValueError(msg)
    return h, hkv


def _shape(a: Array) -> tuple[int, ...]:
    return tuple(int(n) for n in a.shape)


def weights_namespace(matrices: dict[str, Array], biases: dict[str, Array | None]) -> Namespace:
    """The layer's one namespace lookup, after naming any weight that is not an array."""
    for name, a in (*matrices.items(), *biases.items()):
        if a is not None or name in matrices:
            check_array(name, a)
    return array_namespace(*matrices.values(), *biases.values())


def check_weights(
    matrices: dict[str, Array],
    biases: dict[str, Array | None],
    *,
    num_heads: object,
    num_kv_heads: object,
    rope: object,
    xp: Namespace,
) -> Sizes:
    """Check the four matrices, the four biases and ``rope`` against each other."""
    h, hkv = check_heads(num_heads, num_kv_heads)
    for name, w in matrices.items():
        check_floating(name, w, xp=xp)
        if w.ndim != 2:
            msg = f"expected {name} to be a 2-D matrix, got shape {_shape(w)}"
            raise ValueError(msg)
    wq = matrices["wq"]
    d_model, inner = _shape(wq)
    if inner % h:
        msg = (
            f"expected wq of shape (d_model, num_heads * d_head) with num_heads={h} "
            f"dividing its {inner} columns, got shape {_shape(wq)}"
        )
        raise ValueError(msg)
    d_head = inner // h
    d_context = int(matrices["wk"].shape[0])
    want = {
        "wk": (d_context, hkv * d_head),
        "wv": (d_context, hkv * d_head),
        "wo": (h * d_head, d_model),
    }
    for name, shape in want.items():
        if _shape(matrices[name]) != shape:
            msg = (
                f"expected {name} of shape {shape} (num_heads={h}, num_kv_heads={hkv}, "
                f"d_head={d_head}, d_model={d_model}), got shape {_shape(matrices[name])}"
            )
            raise ValueError(msg)
    widths = {"bq": h * d_head, "bk": hkv * d_head, "bv": hkv * d_head, "bo": d_model}
    for name, b in biases.items():
        if b is None:
            continue
        check_floating(name, b, xp=xp)
        if _shape(b) != (widths[name],):
            msg = f"expected {name} of shape ({widths[name]},), got shape {_shape(b)}"
            raise ValueError(msg)
    if rope is not None and (rope not in ("half", "interleaved") or d_head % 2):
        msg = (
            "expected rope to be None, 'half' or 'interleaved' with an even d_head, "
            f"got rope={rope!r} with d_head={d_head}"
        )
        raise ValueError(msg)
    check_same_device([*matrices.items(), *biases.items()])
    return Sizes(h, hkv, d_head, d_model, d_context)


def random_weights(
    d_model: object,
    num_heads: object,
    *,
    num_kv_heads: object,
    d_head: object,
    bias: object,
    seed: int,
    xp: Namespace,
    dtype: DType | None,
    device: Device | None,
) -> tuple[tuple[Array, Array, Array, Array], dict[str, Any]]:
    """The arguments of :meth:`MultiHeadAttention.random`'s layer: arrays and keyword options."""
    d = check_int("d_model", d_model, minimum=1)
    h, hkv = check_heads(num_heads, num_kv_heads)
    if d_head is None:
        if d % h:
            msg = (
                f"expected num_heads to divide d_model when d_head is not given, got "
                f"d_model={d}, num_heads={h}; pass d_head= explicitly"
            )
            raise ValueError(msg)
        d_head = d // h
    dh = check_int("d_head", d_head, minimum=1)
    with_bias = check_flag("bias", bias)
    inner, kv = h * dh, hkv * dh
    shapes: list[tuple[int, ...]] = [(d, inner), (d, kv), (d, kv), (inner, d)]
    stds = [d**-0.5] * 3 + [inner**-0.5]
    if with_bias:
        shapes += [(inner,), (kv,), (kv,), (d,)]
        stds += [d**-0.5] * 3 + [inner**-0.5]
    sizes = [math.prod(s) for s in shapes]
    flat = standard_normal((sum(sizes),), seed=seed)
    parts = []
    start = 0
    for shape, size, std in zip(shapes, sizes, stds, strict=True):
        a = np.reshape(flat[start : start + size], shape) * std
        parts.append(from_numpy_float64(a, xp=xp, dtype=dtype, device=device))
        start += size
    wq, wk, wv, wo = parts[:4]
    bq, bk, bv, bo = parts[4:] if with_bias else (None, None, None, None)
    options = {"num_heads": h, "num_kv_heads": hkv, "bq": bq, "bk": bk, "bv": bv, "bo": bo}
    return (wq, wk, wv, wo), options
