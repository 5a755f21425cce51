"""Checks for the arrays a ready-made mod captures (ids, lengths, slopes, tables)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from .._core._modspec import sized
from .._lib._checks import check_array, dtype_name, has_kind
from .._lib._compat import array_namespace
from .._lib._typing import Array, Namespace

__all__ = ["captured", "module_level", "too_short"]


def captured(name: str, x: object, *, kind: str, ranks: tuple[int, ...]) -> tuple[Array, Namespace]:
    """``x`` checked: an array of ``kind`` ("integral", "real floating") and a rank in ``ranks``."""
    check_array(name, x)
    xp = array_namespace(x)
    arr: Array = x
    if not has_kind(arr.dtype, kind, xp=xp):
        want = "an integer" if kind == "integral" else "a real floating"
        msg = f"expected {name} to be {want} array, got {dtype_name(arr.dtype)}"
        raise TypeError(msg)
    if arr.ndim not in ranks:
        shapes = " or ".join(f"{r}-D" for r in ranks)
        msg = f"expected {name} to be {shapes}, got shape {tuple(arr.shape)}"
        raise ValueError(msg)
    return arr, xp


def too_short(mod: str, name: str, got: int, want: str) -> None:
    """Refuse a captured array of the wrong size for the call, before any tile is indexed.

    JAX would clamp an index past the end and answer wrongly; NumPy and
    torch would raise a bare IndexError naming neither the mod nor the size.
    """
    msg = f"expected the {name} captured by {mod} to have {want}, got {got}"
    raise ValueError(msg)


def module_level(
    fn: Callable[..., Array],
    *args: object,
    name: str,
    check: Callable[..., None] | None = None,
) -> Callable[..., Array]:
    """``fn`` with ``args`` bound first, as a ``functools.partial`` named ``name``.

    ``fn`` (and ``check``, which gets the same ``args`` then ``B, H, Lq,
    Lk``) are module-level functions, so the mod and a block mask built
    from it pickle with the standard library (multiprocessing,
    ``torch.save``); a closure would not.
    """
    mod = functools.partial(fn, *args)
    mod.__name__ = name  # type: ignore[attr-defined]
    if check is None:
        return mod
    return sized(mod, functools.partial(check, *args))
