"""Which precision to compute in, and how to come back from it without floating-point flags."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import Any

from ._compat import is_jax_namespace, is_torch_namespace
from ._typing import Array, Device, DType, Namespace

__all__ = ["autocast_kind", "autocast_on", "compute_dtype", "narrow", "torch_autocast_off"]


def compute_dtype(dtype: DType, *, xp: Namespace) -> DType:
    """float32 and float64 compute as themselves; anything narrower computes in float32."""
    if dtype == xp.float64 or dtype == xp.float32:
        return dtype
    return xp.float32


def narrow(x: Array, dtype: DType, *, xp: Namespace) -> Array:
    """Cast a float32 result back to ``dtype`` (a no-op when it already is).

    Going to half precision, magnitudes below the target's smallest normal
    number are flushed to zero first: a cast into the subnormal range raises
    numpy's underflow flag, and those values carry no precision worth the
    flag (they are below 6.1e-5 for float16, far under its 1e-3 resolution of
    an O(1) attention output). torch and JAX raise no such flag, and there the
    flush would cut the gradient of those entries (the ``where`` passes none
    through), so they cast directly.
    """
    if x.dtype == dtype:
        return x
    flags = not (is_torch_namespace(xp) or is_jax_namespace(xp))
    if flags and xp.finfo(dtype).bits < xp.finfo(x.dtype).bits and xp.finfo(dtype).bits <= 16:
        tiny = float(xp.finfo(dtype).smallest_normal)
        x = xp.where(xp.abs(x) < tiny, xp.zeros_like(x), x)
    return xp.astype(x, dtype)


def torch_autocast_off(device: Device) -> AbstractContextManager[Any] | None:
    """A context that turns ``torch.autocast`` off on ``device``; ``None`` where it is off.

    portattn chooses its own compute precision (:func:`compute_dtype`) and
    returns the inputs' dtype. Under autocast torch would instead run its
    matmuls in float16/bfloat16 and hand float32 code half-precision scores:
    each path would round differently, and ``where``/``concat`` meet mixed
    dtypes. Call for torch tensors only.
    """
    import torch

    kind = autocast_kind(device)
    if not kind or not torch.is_autocast_enabled(kind):
        return None  # meta tensors: no autocast at all
    return torch.autocast(kind, enabled=False)


def autocast_kind(device: Device) -> str:
    """The device type torch's autocast knows ``device`` by; ``""`` where it has none (meta).

    Fixed per device: asked once, then a dict lookup keyed on the device
    itself (reading ``device.type`` costs a decode step a microsecond).
    """
    kind = _AUTOCAST_KIND.get(device)
    if kind is None:
        import torch

        kind = device.type if torch.amp.is_autocast_available(device.type) else ""
        _AUTOCAST_KIND[device] = kind
    return kind


# Device -> its type where torch has autocast there, "" where not (meta tensors).
_AUTOCAST_KIND: dict[Device, str] = {}


def autocast_on(kind: str) -> bool:
    """Whether torch's autocast is on for the device type ``kind`` (:func:`autocast_kind`).

    ``""`` (no autocast there) is never on. For CPU and CUDA tensors torch is
    asked first whether any autocast is on, at half the price of naming the
    device type (parsing the string): a decode step asks on every call, and
    autocast is mostly off. That private query does not cover every device
    type (not MPS), so any other is asked by name.
    """
    if not kind:
        return False
    torch = sys.modules["torch"]
    if kind in _ANY_COVERS:
        any_on = getattr(torch._C, "_is_any_autocast_enabled", None)  # private, so asked for
        if any_on is not None and not any_on():
            return False
    return bool(torch.is_autocast_enabled(kind))


# The device types torch._C._is_any_autocast_enabled reads (torch 2.5 to 2.15).
_ANY_COVERS = ("cpu", "cuda")
