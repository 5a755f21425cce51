"""Input validation: every check raises an error naming what was expected and what was got."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from ._compat import device_of
from ._typing import Array, Device, DType, Namespace

__all__ = [
    "broadcast_shapes",
    "check_bool",
    "check_finite_scale",
    "check_flag",
    "check_floating",
    "check_int",
    "check_known_shape",
    "check_rank",
    "check_same_device",
    "dtype_name",
    "has_kind",
    "int_pair",
]


def dtype_name(dtype: DType) -> str:
    """A short name: ``float32`` for ``np.float32``, ``np.dtype("float32")``, ``torch.float32``."""
    if isinstance(dtype, type):  # NumPy's namespace hands out scalar types
        return dtype.__name__
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    return str(dtype).rsplit(".", 1)[-1]


# Keyed by the dtype's class as well as the dtype: dtypes of two libraries
# never share a class, so they are never confused (``np.dtype("float64") ==
# None`` is True, and other libraries' dtypes may compare loosely too). No
# namespace or array is held: those break tracing.
_KIND_CACHE: dict[tuple[type, object, str], bool] = {}


def has_kind(dtype: DType, kind: str, *, xp: Namespace) -> bool:
    """``xp.isdtype(dtype, kind)``, memoised by the dtype's class and value."""
    key = (type(dtype), dtype, kind)
    hit = _KIND_CACHE.get(key)
    if hit is None:
        hit = _KIND_CACHE[key] = bool(xp.isdtype(dtype, kind))
    return hit


def check_floating(name: str, x: Array, *, xp: Namespace) -> None:
    """Raise TypeError unless ``x`` has a real floating dtype."""
    if not has_kind(x.dtype, "real floating", xp=xp):
        msg = f"expected {name} to have a real floating dtype, got {dtype_name(x.dtype)}"
        if has_kind(x.dtype, "bool", xp=xp) and name == "bias":
            msg += " (boolean masks go to mask=, True where attention is allowed)"
        raise TypeError(msg)


def check_bool(name: str, x: Array, *, xp: Namespace) -> None:
    """Raise TypeError unless ``x`` is boolean."""
    if not has_kind(x.dtype, "bool", xp=xp):
        msg = (
            f"expected {name} to be a boolean array (True = may attend), got {dtype_name(x.dtype)}"
        )
        if has_kind(x.dtype, "real floating", xp=xp):
            msg += "; pass additive float masks as bias="
        raise TypeError(msg)


def check_known_shape(name: str, x: Array | None) -> None:
    """Raise ValueError if ``x``'s shape has unknown (NaN) sizes: dask after boolean indexing."""
    if x is None or not any(isinstance(n, float) and math.isnan(n) for n in x.shape):
        return
    msg = (
        f"expected {name} to have known sizes, got shape {tuple(x.shape)} with unknown (nan) "
        f"sizes; call {name}.compute_chunk_sizes() first"
    )
    raise ValueError(msg)


def check_rank(name: str, x: Array, minimum: int, layout: str) -> None:
    """Raise ValueError if ``x`` has fewer than ``minimum`` dimensions."""
    if x.ndim < minimum:
        msg = (
            f"expected {name} to have at least {minimum} dimensions {layout}, "
            f"got shape {tuple(x.shape)}"
        )
        raise ValueError(msg)


def check_same_device(named: Sequence[tuple[str, Array | None]]) -> Device:
    """Return the common device, raising ValueError if two arrays disagree."""
    first_name, first_dev = "", None
    for name, x in named:
        if x is None:
            continue
        dev = device_of(x)
        if first_name == "":
            first_name, first_dev = name, dev
        elif dev != first_dev:
            msg = (
                "Input arrays use different devices: expected all on the device of "
                f"{first_name} ({first_dev}), got {name} on {dev}"
            )
            raise ValueError(msg)
    return first_dev


def check_finite_scale(scale: object, *, name: str = "scale") -> float:
    """Validate a real option such as ``scale=`` and return it as a Python float."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        msg = f"expected {name} to be a finite real number or None, got {type(scale).__name__}"
        raise ValueError(msg)
    value = float(scale)
    if not math.isfinite(value):
        msg = f"expected {name} to be a finite real number or None, got {value}"
        raise ValueError(msg)
    return value


def broadcast_shapes(named: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """Broadcast shapes by NumPy rules, naming the offending input on failure."""
    if all(tuple(shape) == tuple(named[0][1]) for _, shape in named):
        return tuple(named[0][1]) if named else ()
    result: tuple[int, ...] = ()
    so_far: list[str] = []
    for name, shape in named:
        n = max(len(result), len(shape))
        a = (1,) * (n - len(result)) + result
        b = (1,) * (n - len(shape)) + tuple(shape)
        out = []
        for x, y in zip(a, b, strict=True):
            if x == y or y == 1:
                out.append(x)
            elif x == 1:
                out.append(y)
            else:
                msg = (
                    f"expected {name} to be broadcastable to {result} "
                    f"(from {', '.join(so_far)}), got shape {tuple(shape)}"
                )
                raise ValueError(msg)
        result = tuple(out)
        so_far.append(name)
    return result


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` as a Python int: any ``numbers.Integral`` but bool, at least ``minimum``.

    Options of the wrong kind raise ValueError, like every option check here
    (``scale``, ``causal``, ``window``); TypeError is kept for arrays.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        bound = "" if minimum is None else f" >= {minimum}"
        msg = f"expected {name} to be an int{bound}, got {type(value).__name__} {value!r}"
        raise ValueError(msg)
    n = int(value)
    if minimum is not None and n < minimum:
        msg = f"expected {name} to be an int >= {minimum}, got {n}"
        raise ValueError(msg)
    return n


def int_pair(name: str, value: object, *, minimum: int) -> tuple[int, int]:
    """``n`` or ``(a, b)`` as a pair of Python ints, each at least ``minimum``."""
    if isinstance(value, tuple | list):
        if len(value) != 2:
            msg = f"expected {name} to be an int or a pair of ints, got {value!r}"
            raise ValueError(msg)
        return check_int(name, value[0], minimum=minimum), check_int(
            name, value[1], minimum=minimum
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        got = f"{type(value).__name__} {value!r}"
        msg = f"expected {name} to be an int or a pair of ints, got {got}"
        raise ValueError(msg)
    n = check_int(name, value, minimum=minimum)
    return n, n


def check_flag(name: str, value: object) -> bool:
    """A real ``bool`` (NumPy's ``bool_`` too); ``"no"`` or ``0`` are refused, never guessed."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    msg = f"expected {name} to be True or False, got {type(value).__name__} {value!r}"
    raise ValueError(msg)
