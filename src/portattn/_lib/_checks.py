"""Input validation: every check raises an error naming what was expected and what was got."""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from collections.abc import Sequence

from ._compat import device_of, refuse_non_array
from ._shown import shown
from ._typing import Array, Device, DType, Namespace

__all__ = [
    "broadcast_shapes",
    "check_array",
    "check_bool",
    "check_dtype",
    "check_finite_scale",
    "check_flag",
    "check_floating",
    "check_int",
    "check_int_pair",
    "check_known_shape",
    "check_rank",
    "check_real",
    "check_same_device",
    "dtype_name",
    "has_kind",
    "is_flag",
    "shown",
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


# (dtype class, dtype) pairs already accepted by check_floating: a repeat call
# costs one set lookup (small calls are dominated by such bookkeeping).
# A dict, not a set: torch.compile guards dict lookups (has_kind's cache too)
# but fails on a set that grows inside the frame it traces.
_FLOATING_OK: dict[tuple[type, object], bool] = {}


def check_floating(name: str, x: Array, *, xp: Namespace) -> None:
    """Raise TypeError unless ``x`` has a real floating dtype of at most 64 bits.

    Wider floats (NumPy's ``longdouble``, float128 on x86 Linux) are refused
    rather than silently computed in float32 and relabelled: portattn
    computes in float32 or float64 only.
    """
    key = (type(x.dtype), x.dtype)
    if _FLOATING_OK.get(key):
        return
    if not has_kind(x.dtype, "real floating", xp=xp):
        msg = f"expected {name} to have a real floating dtype, got {dtype_name(x.dtype)}"
        if has_kind(x.dtype, "bool", xp=xp) and name == "bias":
            msg += " (boolean masks go to mask=, True where attention is allowed)"
        raise TypeError(msg)
    if _wider_than_float64(x.dtype, xp=xp):
        msg = (
            f"expected {name} to have a floating dtype of at most 64 bits (float16, bfloat16, "
            f"float32 or float64), got {dtype_name(x.dtype)}: portattn computes in float32 or "
            f"float64 only; cast to float64 first"
        )
        raise TypeError(msg)
    _FLOATING_OK[key] = True


_WIDE_CACHE: dict[tuple[type, object], bool] = {}


def _wider_than_float64(dtype: DType, *, xp: Namespace) -> bool:
    key = (type(dtype), dtype)
    hit = _WIDE_CACHE.get(key)
    if hit is None:
        hit = _WIDE_CACHE[key] = int(xp.finfo(dtype).bits) > 64
    return hit


# Array types already accepted by check_array (whether an object is an array
# depends on its type only).
_ARRAY_TYPES: dict[type, bool] = {}


def check_array(name: str, x: object) -> None:
    """Raise TypeError unless ``x`` is an array that portattn can read as it is.

    ``None`` and non-arrays are named; ``numpy.ma.MaskedArray`` is refused,
    because its mask would silently be ignored by every array operation.
    """
    if _ARRAY_TYPES.get(type(x)):
        return
    if x is None:
        msg = f"expected {name} to be an array, got None"
        raise TypeError(msg)
    refuse_non_array(name, x)
    _ARRAY_TYPES[type(x)] = True


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
    """Raise ValueError unless every size of ``x`` is known when the call is made.

    Blocks, masks and broadcasting are planned from the sizes, so every size
    must be a number: a dask array after boolean indexing has NaN sizes, an
    ndonnx argument declared with a symbolic dimension has ``None``. Sizes
    are only compared, never read with ``int()`` (which would specialise
    symbolic sizes such as torch's ``SymInt``).
    """
    if x is None:
        return
    for n in x.shape:
        if n is None or (isinstance(n, float) and math.isnan(n)):
            break
    else:
        return
    shape = tuple(x.shape)
    if any(isinstance(n, float) for n in shape):
        msg = (
            f"expected {name} to have known chunk sizes, got shape {shape}: a dask array "
            "whose chunk sizes are unknown (after boolean indexing, say); call "
            f"{name}.compute_chunk_sizes() first"
        )
    else:
        msg = (
            f"expected {name} to have a static shape, got shape {shape}: portattn plans "
            "its blocks and masks from the sizes, so every dimension must be known when "
            "it is called (export with static shapes, e.g. ndonnx.argument(shape=(2, 16, 8)))"
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
    """Return the common device, raising ValueError if two arrays disagree.

    A device of ``None`` (a JAX tracer has none) matches any device; the
    result is the first device that is not ``None``, or ``None``.
    """
    first_name, first_dev = "", None
    for name, x in named:
        dev = None if x is None else device_of(x)
        if dev is None:
            continue
        if first_dev is None:
            first_name, first_dev = name, dev
        elif dev is not first_dev and dev != first_dev:
            msg = (
                "Input arrays use different devices: expected all on the device of "
                f"{first_name} ({first_dev}), got {name} on {dev}"
            )
            raise ValueError(msg)
    return first_dev


def check_finite_scale(scale: object, *, name: str = "scale") -> float:
    """Validate a real option such as ``scale=`` and return it as a Python float."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        msg = f"expected {name} to be a finite real number or None, got {shown(scale)}"
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


# --- Python-level options ----------------------------------------------------
#
# One helper per idea. Every option that means an int accepts any
# numbers.Integral (np.int64 included) and every option that means a float any
# numbers.Real (np.float32 included); bool is refused everywhere, because
# True == 1 would otherwise slip through as a size. A wrong option raises
# ValueError naming the option, what was expected and what was received,
# whatever its type, as portattn's options always have.


def _int_phrase(minimum: int | None) -> str:
    if minimum is None:
        return "an int"
    if minimum == 0:
        return "a non-negative int"
    if minimum == 1:
        return "a positive int"
    return f"an int >= {minimum}"


def _as_index(value: object) -> int | None:
    """``operator.index(value)`` for an integer scalar that is not a bool, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    # a 0-d integer array (torch, JAX) is an integer scalar; a bool array is not
    if getattr(value, "ndim", 0) != 0 or "bool" in str(getattr(value, "dtype", "")):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` as a Python int: an integer scalar (``operator.index``), not a bool, >= minimum."""
    n = _as_index(value)
    if n is None:
        msg = f"expected {name} to be {_int_phrase(minimum)}, got {shown(value)}"
        raise ValueError(msg)
    if minimum is not None and n < minimum:
        msg = f"expected {name} to be {_int_phrase(minimum)}, got {n}"
        raise ValueError(msg)
    return n


def check_real(
    name: str, value: object, *, minimum: float | None = None, above: float | None = None
) -> float:
    """``value`` as a finite Python float: any ``numbers.Real`` but bool.

    ``minimum`` is an inclusive bound, ``above`` an exclusive one.
    """
    want = "a finite real number"
    if minimum is not None:
        want += f" >= {minimum:g}"
    if above is not None:
        want += f" > {above:g}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = f"expected {name} to be {want}, got {shown(value)}"
        raise ValueError(msg)
    x = float(value)
    if (
        not math.isfinite(x)
        or (minimum is not None and x < minimum)
        or (above is not None and x <= above)
    ):
        msg = f"expected {name} to be {want}, got {shown(value)}"
        raise ValueError(msg)
    return x


def check_int_pair(name: str, value: object, *, minimum: int | None = None) -> tuple[int, int]:
    """An int ``n`` (meaning ``(n, n)``) or a tuple of two ints, each at least ``minimum``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        n = check_int(name, value, minimum=minimum)
        return n, n
    if isinstance(value, (tuple, list)) and len(value) == 2:
        pair = [v for v in value if isinstance(v, numbers.Integral) and not isinstance(v, bool)]
        if len(pair) == 2 and (minimum is None or all(int(v) >= minimum for v in pair)):
            return int(pair[0]), int(pair[1])
    msg = f"expected {name} to be {_int_phrase(minimum)} or a pair of them, got {shown(value)}"
    raise ValueError(msg)


def is_flag(value: object) -> bool:
    """Whether ``value`` is True, False or a NumPy bool (``np.True_``), not a truthy stand-in."""
    return (
        value is True
        or value is False
        or (
            type(value).__name__ == "bool" and type(value).__module__ == "numpy"  # np.bool_
        )
    )


def check_flag(name: str, value: object) -> bool:
    """``value`` as a bool: True, False or a NumPy bool; never a truthy stand-in like 1 or "no"."""
    if is_flag(value):
        return bool(value)
    msg = f"expected {name} to be True or False, got {shown(value)}"
    raise ValueError(msg)


def check_dtype(name: str, dtype: object, *, xp: Namespace, kind: str = "real floating") -> DType:
    """Raise TypeError unless ``dtype`` is a dtype of ``xp`` of this kind; return it.

    Strings (``"float32"``), ``None`` and another library's dtype objects are
    refused here rather than failing inside the library.
    """
    lib = xp.__name__.removeprefix("array_api_compat.")
    ok = False
    if not isinstance(dtype, str) and dtype is not None:
        try:
            with warnings.catch_warnings():  # numpy warns when handed a foreign dtype
                warnings.simplefilter("ignore")
                ok = bool(xp.isdtype(dtype, kind))
        except Exception:  # each library fails differently on a foreign object
            ok = False
    if not ok:
        shown_dtype = dtype_name(dtype) if not isinstance(dtype, str) else repr(dtype)
        owner = dtype if isinstance(dtype, type) else type(dtype)
        mod = owner.__module__.split(".", 1)[0]
        origin = "" if isinstance(dtype, str) or dtype is None else f" (from {mod})"
        msg = (
            f"expected {name} to be a {kind} dtype of {lib}, such as {lib}.float32, "
            f"got {shown_dtype}{origin}"
        )
        raise TypeError(msg)
    return dtype


def int_shape(x: Array) -> tuple[int, ...]:
    """``x``'s shape as Python ints, for messages: a ``torch.Size`` prints as a plain tuple."""
    return tuple(int(n) for n in x.shape)


def broadcastable(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` and ``target`` broadcast together (NumPy rules, from the right)."""
    return all(m == n or 1 in (m, n) for m, n in zip(shape[::-1], target[::-1], strict=False))


def check_weights(named: Sequence[tuple[str, Array | None]], *, xp: Namespace) -> None:
    """A layer's weights: real floating, the ``w*`` ones 2-D matrices (``b*`` may be None)."""
    for name, a in named:
        if a is not None:
            check_floating(name, a, xp=xp)
        if name[0] == "w" and a is not None and a.ndim != 2:
            msg = f"expected {name} to be a 2-D matrix, got shape {int_shape(a)}"
            raise ValueError(msg)


def check_shapes(
    named: Sequence[tuple[str, Array | None]], want: Sequence[tuple[int, ...]], *, why: str
) -> None:
    """Each array present of its wanted shape, or an error naming ``why`` (what decides it)."""
    for (name, a), shape in zip(named, want, strict=True):
        if a is not None and int_shape(a) != shape:
            msg = f"expected {name} of shape {shape} ({why}), got shape {int_shape(a)}"
            raise ValueError(msg)


def check_width(name: str, a: Array | None, width: int, axes: str, *, xp: Namespace) -> None:
    """A layer's tokens ``a``, if given: real floating, of shape (..., ``axes``) = ``width``."""
    if a is None:
        return
    check_floating(name, a, xp=xp)
    if a.ndim < 2 or int(a.shape[-1]) != width:
        msg = f"expected {name} of shape (..., {axes}={width}), got shape {int_shape(a)}"
        raise ValueError(msg)
