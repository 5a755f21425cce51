"""The single point through which portattn reaches ``array-api-compat``.

Everything else in the package imports from here, so the compat layer can be
swapped or vendored in one place, and tests can count namespace lookups by
patching :func:`array_namespace`.
"""

from __future__ import annotations

import contextlib
import math
import sys
from types import ModuleType
from typing import Any

import array_api_compat
import numpy as _np
from array_api_compat import (
    device,
    is_array_api_obj,
    is_array_api_strict_namespace,
    is_cupy_namespace,
    is_dask_namespace,
    is_jax_namespace,
    is_lazy_array,
    is_numpy_namespace,
    is_torch_namespace,
    is_writeable_array,
    to_device,
)

from ._shown import shown

__all__ = [
    "all_finite",
    "array_namespace",
    "at_least",
    "clipped_exp",
    "device",
    "device_of",
    "host_float",
    "is_array_api_obj",
    "is_array_api_strict_namespace",
    "is_concrete",
    "is_cupy_namespace",
    "is_dask_namespace",
    "is_jax_namespace",
    "is_lazy_array",
    "is_numpy_namespace",
    "is_torch_namespace",
    "is_writeable_array",
    "library_name",
    "matmul",
    "matrix_transpose",
    "max_last",
    "namespace_library",
    "refuse_non_array",
    "resolve_namespace",
    "sum_last",
    "to_device",
]


_NAMESPACE_BY_TYPES: dict[tuple[type, ...], ModuleType] = {}


def array_namespace(*arrays: Any, names: tuple[str, ...] = ()) -> ModuleType:
    """Return the array API namespace shared by ``arrays`` (``None`` entries ignored).

    The answer depends only on the arrays' types, so it is cached by the
    tuple of types (as einops does): a repeat call costs one dict lookup.
    ``names`` are the arguments' names, in order, for the error messages.

    Raises
    ------
    TypeError
        If the arrays come from different libraries (both are named), or an
        argument is not an array at all, or is a ``numpy.ma.MaskedArray``
        (its mask would be ignored).
    """
    key = tuple(map(type, arrays))  # NoneType marks an absent argument
    cached = _NAMESPACE_BY_TYPES.get(key)
    if cached is not None:
        return cached
    traced = _traced_torch_namespace(arrays)
    if traced is not None:
        return traced
    present = []
    for i, a in enumerate(arrays):
        if a is not None:
            refuse_non_array(names[i] if i < len(names) else "an argument", a)
            present.append(a)
    try:
        xp = array_api_compat.array_namespace(*present)
    except TypeError:
        libs = sorted({library_name(a) for a in present})
        msg = (
            "expected all arrays to come from one library, got arrays from "
            f"{' and '.join(libs)}; convert them to one library first"
        )
        raise TypeError(msg) from None
    _NAMESPACE_BY_TYPES[key] = xp
    return xp


def _traced_torch_namespace(arrays: tuple[Any, ...]) -> ModuleType | None:
    """array-api-compat's torch namespace while dynamo traces torch tensors, else None.

    torch's ``flex_attention`` traces a mod inside a higher-order op even in
    eager mode, and since torch 2.15 that op refuses any write to state from
    outside it ("Unsafe side effect"): both the cache above and
    array-api-compat's own lookup write some. While tracing, tensors are all
    there can be, and their namespace needs no lookup. Looked up in
    ``sys.modules`` only: tracing implies torch.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.compiler.is_compiling():
        return None
    if not all(a is None or isinstance(a, torch.Tensor) for a in arrays):
        return None
    from array_api_compat import torch as compat_torch

    return compat_torch


def refuse_non_array(name: str, x: Any) -> None:
    """TypeError naming ``name`` unless ``x`` is an array portattn reads as it is.

    A ``numpy.ma.MaskedArray`` is an array to every check, but every array
    operation would silently ignore its mask: refused wherever arrays enter.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return  # without array-api-compat's lru_cache'd check, which dynamo warns about
    if not is_array_api_obj(x):
        msg = (
            f"expected {name} to be an array, got {shown(x)}; portattn reads arrays of an "
            "array API library (numpy, torch, cupy, jax, array_api_strict, ...)"
        )
        raise TypeError(msg)
    if isinstance(x, _np.ma.MaskedArray):
        msg = (
            f"expected {name} to be a plain array, got a numpy.ma.MaskedArray: its mask would "
            "be ignored; pass its data (x.data or x.filled(...)) and express the mask "
            "with mask= or key_lengths= where the function has them"
        )
        raise TypeError(msg)


def device_of(x: Any) -> Any:
    """The device of ``x``: its standard ``.device`` attribute, or array-api-compat's answer."""
    dev = getattr(x, "device", None)
    if dev is None or callable(dev):
        return device(x)
    return dev


def on_accelerator(device: Any) -> bool:
    """Whether ``device`` (as :func:`device_of` returns it) is a GPU or other non-CPU device.

    torch names a kind (``device.type``), JAX a platform; CuPy's devices are
    all GPUs; NumPy, array-api-strict and dask say ``cpu`` in their names.
    """
    if device is None:
        return False
    kind = getattr(device, "type", None) or getattr(device, "platform", None) or device
    return "cpu" not in str(kind).lower()


def is_concrete(x: Any) -> bool:
    """True when the values of ``x`` may be read on the host now, cheaply and outside any trace.

    False for anything a host read would break or silently slow down: JAX
    tracers (``jit``, ``grad``, ``vmap``), torch tensors while
    ``torch.compile`` traces (and meta, fake or ``torch.func``-wrapped
    tensors, which hold no values), and lazy arrays (dask, ndonnx), as
    array-api-compat's ``is_lazy_array`` tells them. Concrete JAX arrays are
    concrete, although ``is_lazy_array`` errs on the side of calling every
    JAX array lazy. Library modules are looked up in ``sys.modules`` only: an
    array of a library implies the library is imported.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        # Checked first: under dynamo nothing below may be traced into.
        if torch.compiler.is_compiling() or x.device.type == "meta":
            return False
        if type(x) is not torch.Tensor and not isinstance(x, torch.nn.Parameter):
            return False  # FakeTensor, FunctionalTensor and other value-less subclasses
        functorch = getattr(torch._C, "_functorch", None)
        wrapped = getattr(functorch, "is_functorch_wrapped_tensor", None)
        return wrapped is None or not wrapped(x)
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        return not isinstance(x, jax.core.Tracer)
    return not is_lazy_array(x)


def host_float(x: Any) -> float:
    """The value of a concrete 0-d array as a Python float, read outside any autograd graph.

    A torch tensor that requires grad is detached first: the read is a bound
    or a size, never part of the maths (torch warns on ``float()`` of it).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach()
    return float(x)


def all_finite(x: Any, *, xp: ModuleType) -> bool:
    """Whether every element of the concrete, real floating ``x`` is finite, from its sum.

    A sum is finite only where every term is: NaN spreads, and an inf gives
    inf, or NaN beside an inf of the other sign. So a finite sum proves it;
    a non-finite one is either a non-finite term or an overflow, a false
    alarm that callers answer by taking a slower path. Summed in float32 at
    least (float64 stays float64), so that half types rarely overflow. One
    reduction and a host read, where ``all(isfinite(x))`` also writes a
    boolean array as large as ``x`` (a prefill's keys, 32 MB: 36 ms against 0.8).
    """
    wide = xp.float64 if x.dtype == xp.float64 else xp.float32
    quiet = namespace_library(xp) in _WARNS  # inf - inf and overflows asked, not warned of
    with _np.errstate(over="ignore", invalid="ignore") if quiet else contextlib.nullcontext():
        return math.isfinite(host_float(xp.sum(x, dtype=wide)))


def matmul(a: Any, b: Any, *, xp: ModuleType) -> Any:
    """``a @ b``, without the "invalid" flag that NumPy's BLAS may raise wrongly.

    NumPy's bundled OpenBLAS (0.3.31, with its AVX-512 kernels) now and then
    sets the floating-point "invalid" flag in a small product of finite
    numbers whose result is finite and correct; older releases did too
    (numpy/numpy#24067). NumPy reports it, and a caller who made that flag an
    error (``np.errstate(invalid="raise")``, or warnings as errors) would get
    it from portattn. A real invalid operation in a product (inf times 0, inf
    minus inf) leaves a NaN in its result, and NaN survives every later sum.
    So when the product raises for an invalid value, it is computed again
    with the flag ignored, and the error stands only if that result holds a
    NaN. Nothing else changes: other flags, and a caller who only warns, are
    answered as before. Costs nothing until NumPy raises; torch, JAX and
    CuPy never do.
    """
    try:
        return a @ b
    except (FloatingPointError, RuntimeWarning) as exc:
        if "invalid value" not in str(exc):
            raise
        with _np.errstate(invalid="ignore"):
            out = a @ b
        if bool(xp.any(xp.isnan(out))):
            raise  # a real one: the caller's request stands
        return out


# The libraries whose arithmetic is NumPy's, and warns of invalid values and overflows.
_WARNS = ("numpy", "array_api_strict")


def namespace_library(xp: ModuleType) -> str:
    """The library a namespace serves, as array-api-compat detects it.

    One of ``"numpy"``, ``"torch"``, ``"jax"``, ``"cupy"``, ``"dask"``,
    ``"array_api_strict"``, or ``"other"``.
    """
    key = getattr(xp, "__name__", None)
    hit = None if key is None else _LIBRARY_BY_NAMESPACE.get(key)
    if hit is None:
        hit = next((name for name, test in _DETECTORS if test(xp)), "other")
        if key is not None:
            _LIBRARY_BY_NAMESPACE[key] = hit
    return hit


# Every call asks, so memoise by the namespace's module name (a module itself
# as a dict key stops torch.compile's tracing: dynamo cannot compare modules).
# torch's names are known up front: a first call may come while dynamo traces,
# and dynamo warns at array-api-compat's functools.lru_cache-wrapped detectors.
_LIBRARY_BY_NAMESPACE: dict[str, str] = {"torch": "torch", "array_api_compat.torch": "torch"}


_DETECTORS = (
    ("numpy", is_numpy_namespace),
    ("torch", is_torch_namespace),
    ("jax", is_jax_namespace),
    ("cupy", is_cupy_namespace),
    ("dask", is_dask_namespace),
    ("array_api_strict", is_array_api_strict_namespace),
)


# The operations a small call cannot avoid, with NumPy's cheapest
# spelling: ``np.max``/``np.sum`` and array-api-compat's ``matrix_transpose``
# reach the same ufunc reduction and the same view through a microsecond of
# Python wrappers each (``np.sum`` is ``np.add.reduce`` and ``np.max`` is
# ``np.maximum.reduce``, so results are identical). At the chapter's size
# (6 tokens, d=8) those wrappers were a fifth of a call. The test is on the
# array's exact type, which costs no call; subclasses and every other library
# get the standard functions.


def max_last(x: Any, *, xp: ModuleType) -> Any:
    """``xp.max(x, axis=-1, keepdims=True)``."""
    if type(x) is _np.ndarray:
        return _np.maximum.reduce(x, axis=-1, keepdims=True)
    return xp.max(x, axis=-1, keepdims=True)


def sum_last(x: Any, *, xp: ModuleType) -> Any:
    """``xp.sum(x, axis=-1, keepdims=True)`` (floating ``x``: no dtype promotion to decide)."""
    if type(x) is _np.ndarray:
        return _np.add.reduce(x, axis=-1, keepdims=True)
    return xp.sum(x, axis=-1, keepdims=True)


def at_least(x: Any, floor: float, *, xp: ModuleType) -> Any:
    """``x`` with entries below ``floor`` raised to it (``-inf`` included).

    ``xp.clip(x, min=floor)``, which torch.compile traces: array-api-compat's
    ``maximum`` with a Python scalar asks ``torch.result_type``, which it
    cannot. NumPy gets the ufunc, cheaper than its ``clip``.
    """
    if type(x) is _np.ndarray:
        return _np.maximum(x, floor)
    return xp.clip(x, min=floor)


def clipped_exp(x: Any, floor: float, *, xp: ModuleType, overwrite: bool = False) -> Any:
    """``exp(max(x, floor))``; with ``overwrite``, computed into ``x`` itself where it can be.

    ``overwrite`` says ``x`` is the caller's scratch (a tile nothing else
    holds, not saved by autograd): NumPy and torch then allocate no new
    tile, which on torch CPU saves a page fault per 4 KiB of a tile above
    glibc's heap threshold. Other libraries get new arrays.
    """
    if overwrite:
        if type(x) is _np.ndarray:
            _np.maximum(x, floor, out=x)
            return _np.exp(x, out=x)
        torch = sys.modules.get("torch")
        if torch is not None and type(x) is torch.Tensor and not x.requires_grad:
            return x.clamp_(min=floor).exp_()
    return xp.exp(at_least(x, floor, xp=xp))


def shifted_exp(x: Any, floor: float, *, xp: ModuleType) -> tuple[Any, Any, Any]:
    """``(exp(max(x - m, floor)), m, sum)`` over the last axis, ``m`` the row max (axes kept).

    The softmax of scores with nothing hidden (no ``-inf``, so no empty
    row), as :func:`max_last`, :func:`clipped_exp` on the fresh difference
    and :func:`sum_last` compute it; NumPy's four ufunc passes are spelled
    here (a decode step paid about a microsecond per helper call).
    """
    if type(x) is _np.ndarray:
        m = _np.maximum.reduce(x, axis=-1, keepdims=True)
        e = x - m
        _np.maximum(e, floor, out=e)
        _np.exp(e, out=e)
        return e, m, _np.add.reduce(e, axis=-1, keepdims=True)
    m = max_last(x, xp=xp)
    e = clipped_exp(x - m, floor, xp=xp, overwrite=True)
    return e, m, sum_last(e, xp=xp)


def matrix_transpose(x: Any, *, xp: ModuleType) -> Any:
    """``xp.matrix_transpose(x)``: the last two axes swapped (a view on NumPy)."""
    if type(x) is _np.ndarray:
        return x.mT
    return xp.matrix_transpose(x)


def library_name(x: Any) -> str:
    """The top-level package that defines ``type(x)``, e.g. ``"numpy"`` or ``"torch"``."""
    return type(x).__module__.split(".", 1)[0]


_COMPAT_WRAPPED = {
    "numpy": "array_api_compat.numpy",
    "torch": "array_api_compat.torch",
    "cupy": "array_api_compat.cupy",
    "dask.array": "array_api_compat.dask.array",
}


def resolve_namespace(xp: Any) -> ModuleType:
    """Turn what a user passes as ``xp=`` into an array API namespace.

    ``None`` means NumPy. A library module (``numpy``, ``torch``, ``cupy``) is
    mapped to its ``array-api-compat`` wrapper; a namespace that already
    follows the standard (``array_api_strict``, a compat wrapper,
    ``jax.numpy``) is returned as it is.
    """
    if xp is None:
        import array_api_compat.numpy as np_compat

        return np_compat
    if not isinstance(xp, ModuleType):
        msg = f"expected xp to be an array namespace or library module, got {type(xp).__name__}"
        raise TypeError(msg)
    wrapped = _COMPAT_WRAPPED.get(xp.__name__)
    if wrapped is not None:
        __import__(wrapped)
        return sys.modules[wrapped]
    if hasattr(xp, "__array_api_version__") or xp.__name__.startswith("array_api_compat."):
        return xp
    msg = (
        f"expected xp to be numpy, torch, cupy or a module that follows the array API "
        f"standard, got module {xp.__name__!r}"
    )
    raise TypeError(msg)
