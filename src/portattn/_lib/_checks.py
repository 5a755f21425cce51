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
    "check_floating",
    "check_rank",
    "check_same_device",
    "dtype_name",
    "has_kind",
]


def dtype_name(dtype: DType) -> str:
    """A short name: ``float32`` for ``np.float32``, ``np.dtype("float32")``, ``torch.float32``."""
    if isinstance(dtype, type):  # NumPy's namespace hands out scalar types
        return dtype.__name__
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    return str(dtype).rsplit(".", 1)[-1]


_KIND_CACHE: dict[tuple[object, object, str], bool] = {}


def has_kind(dtype: DType, kind: str, *, xp: Namespace) -> bool:
    """``xp.isdtype(dtype, kind)``, memoised: dtypes and namespaces are few and hashable."""
    key = (xp, dtype, kind)
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


def check_finite_scale(scale: object) -> float:
    """Validate ``scale=`` and return it as a Python float."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        msg = f"expected scale to be a finite real number or None, got {type(scale).__name__}"
        raise ValueError(msg)
    value = float(scale)
    if not math.isfinite(value):
        msg = f"expected scale to be a finite real number or None, got {value}"
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
