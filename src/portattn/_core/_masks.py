"""Masks that follow from positions alone: causal triangles, sliding windows, padding.

Each is described by index arithmetic rather than stored, so the blockwise path
can build just the tile it needs, and skip tiles that are entirely hidden
without ever reading them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from .._lib._checks import check_flag, check_int, check_int_pair, is_flag
from .._lib._compat import namespace_library, resolve_namespace
from .._lib._typing import Array, Device, Namespace
from ._modspec import index_dtype

__all__ = [
    "Align",
    "Causal",
    "Structure",
    "causal_mask",
    "length_mask",
    "normalize_causal",
    "normalize_window",
    "window_mask",
]

Align = Literal["top_left", "bottom_right"]
Causal = bool | Literal["top_left", "bottom_right"]
_ALIGNS = ("top_left", "bottom_right")


def _offset(lq: int, lk: int, align: str) -> int:
    if align not in _ALIGNS:
        msg = f"expected align to be 'top_left' or 'bottom_right', got {align!r}"
        raise ValueError(msg)
    return lk - lq if align == "bottom_right" else 0


def _check_length(name: str, n: object) -> int:
    return check_int(name, n, minimum=0)


def normalize_window(window: object) -> tuple[int, int] | None:
    """``w`` means ``(w, w)``; negative sizes are refused."""
    if window is None:
        return None
    return check_int_pair("window", window, minimum=0)


def normalize_causal(causal: object) -> bool | Align:
    """``causal=`` as exactly ``False``, ``True`` or an alignment; nothing else is guessed at.

    Run before anything is cached on it: ``1 == True`` hashes alike, so a
    cache in front of this check would accept ``causal=1`` once ``True`` had
    been seen.
    """
    if is_flag(causal):
        return bool(causal)
    if isinstance(causal, str) and causal in _ALIGNS:
        return "top_left" if causal == "top_left" else "bottom_right"
    msg = (
        "expected causal to be False, True, 'top_left' or 'bottom_right', "
        f"got {type(causal).__name__} {causal!r}"
    )
    raise ValueError(msg)


def _clamp_window(window: tuple[int, int], lq: int, lk: int) -> tuple[int, int]:
    """A window wider than ``lq + lk`` hides nothing more; clamping keeps index sums in int64."""
    return min(window[0], lq + lk), min(window[1], lq + lk)


@dataclass(frozen=True)
class Structure:
    """Which (query, key) pairs positions allow: key ``j`` is aligned with query ``i + offset``.

    ``causal`` hides ``j > i + offset``; ``window=(left, right)`` keeps
    ``i + offset - left <= j <= i + offset + right``.
    """

    lq: int
    lk: int
    offset: int = 0
    causal: bool = False
    window: tuple[int, int] | None = None

    @classmethod
    def build(
        cls, lq: int, lk: int, causal: bool | Align, window: tuple[int, int] | None
    ) -> Structure:
        """Resolve ``causal=`` and ``window=`` into one structure, refusing to guess alignment.

        Both as checked already (:func:`normalize_causal`, :func:`normalize_window`).
        """
        c = causal
        if c is True and lq != lk:
            msg = (
                f"causal=True is ambiguous when Lq != Lk (got Lq={lq}, Lk={lk}): pass "
                "causal='top_left' (torch/JAX convention: query i sees keys j <= i) or "
                "causal='bottom_right' (KV-cache decoding: query i sees keys "
                "j <= i + Lk - Lq)"
            )
            raise ValueError(msg)
        is_causal = c is not False
        align = None if c is False else ("top_left" if c is True else c)
        if window is not None and align is None:
            if lq != lk:
                msg = (
                    f"a window with Lq != Lk is ambiguous (got Lq={lq}, Lk={lk}): pass "
                    "causal='top_left' or causal='bottom_right' to align it, or build the "
                    "mask yourself with portattn.window_mask(..., align=...)"
                )
                raise ValueError(msg)
            align = "top_left"
        offset = _offset(lq, lk, align) if align is not None else 0
        # Causality that hides no pair (a decode query sees every key) is none:
        # the fused kernels then take no mask, and no path builds one.
        is_causal = is_causal and offset < lk - 1
        sizes = None if window is None else _clamp_window(window, lq, lk)  # 2**63 fits int64 now
        return cls(lq, lk, offset, is_causal, sizes)

    @property
    def trivial(self) -> bool:
        """True when positions hide nothing."""
        return not self.causal and self.window is None

    @property
    def every_query_sees_a_key(self) -> bool:
        """True when positions leave no query row empty (a window is not looked into)."""
        return self.lk > 0 and self.window is None and (not self.causal or self.offset >= 0)

    def key_range(self, q0: int, q1: int) -> tuple[int, int]:
        """The half-open range of keys that any query in ``[q0, q1)`` may see."""
        lo, hi = 0, self.lk
        if q1 <= q0:
            return 0, 0
        if self.causal:
            hi = min(hi, q1 - 1 + self.offset + 1)
        if self.window is not None:
            left, right = self.window
            lo = max(lo, q0 + self.offset - left)
            hi = min(hi, q1 - 1 + self.offset + right + 1)
        return lo, max(lo, hi)

    def tile_is_full(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        """True when every pair in the tile is allowed, so no mask need be built."""
        if self.causal and k1 - 1 > q0 + self.offset:
            return False
        if self.window is not None:
            left, right = self.window
            if k0 < q1 - 1 + self.offset - left or k1 - 1 > q0 + self.offset + right:
                return False
        return True

    def shared_tile(
        self, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace, device: Device
    ) -> Array:
        """:meth:`tile`; on NumPy, small tiles are memoised and shared, so never write to them.

        Only NumPy's tiles are kept: they are host data that no trace or
        autograd graph can hold. Other libraries get a fresh tile each call.
        """
        if (q1 - q0) * (k1 - k0) > _SHARED_TILE_MAX or namespace_library(xp) != "numpy":
            return self.tile(q0, q1, k0, k1, xp=xp, device=device)
        # Keyed by plain values: hashing them costs no Python call, hashing self would.
        return _numpy_tile(self.lq, self.lk, self.offset, self.causal, self.window, q0, q1, k0, k1)

    def tile(self, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace, device: Device) -> Array:
        """The boolean mask of the tile ``[q0, q1) x [k0, k1)``, True where allowed."""
        ints = index_dtype(xp=xp, device=device)  # int64; int32 under JAX without x64
        qi = xp.arange(q0, q1, dtype=ints, device=device)[:, None] + self.offset
        kj = xp.arange(k0, k1, dtype=ints, device=device)[None, :]
        if self.causal:
            allowed = kj <= qi
        else:
            allowed = xp.ones((q1 - q0, k1 - k0), dtype=xp.bool, device=device)
        if self.window is not None:
            left, right = self.window
            allowed = xp.logical_and(allowed, xp.logical_and(kj >= qi - left, kj <= qi + right))
        return allowed


# Small position masks are rebuilt on every call of a decoding loop; keeping
# the last few (at most 64 KiB of booleans each) saves the arange arithmetic.
_SHARED_TILE_MAX = 1 << 16


@functools.lru_cache(maxsize=64)
def _numpy_tile(
    lq: int,
    lk: int,
    offset: int,
    causal: bool,
    window: tuple[int, int] | None,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
) -> Array:
    s = Structure(lq, lk, offset, causal, window)
    tile = s.tile(q0, q1, k0, k1, xp=_np_xp(), device="cpu")
    tile.flags.writeable = False
    return tile


def _np_xp() -> Namespace:
    import array_api_compat.numpy as np_xp

    return np_xp


def causal_mask(
    lq: int,
    lk: int,
    /,
    *,
    align: Align = "bottom_right",
    xp: Namespace | None = None,
    device: Device | None = None,
) -> Array:
    """Boolean causal mask of shape ``(lq, lk)``, True where query ``i`` may attend to key ``j``.

    Parameters
    ----------
    lq, lk : int
        Number of queries and keys.
    align : {"bottom_right", "top_left"}, optional
        ``"bottom_right"`` (the default) lets query ``i`` see keys
        ``j <= i + (lk - lq)``: the last query sees every key, as in KV-cache
        decoding. ``"top_left"`` lets query ``i`` see ``j <= i``, the torch and
        JAX convention. The two agree when ``lq == lk``.
    xp : namespace or module, optional
        Array library for the result; ``None`` means NumPy.
    device : optional
        Device for the result, in ``xp``'s terms.

    Returns
    -------
    array
        Boolean array of shape ``(lq, lk)``.

    Examples
    --------
    >>> import portattn as pa
    >>> pa.causal_mask(2, 3).tolist()
    [[True, True, False], [True, True, True]]
    >>> pa.causal_mask(2, 3, align="top_left").tolist()
    [[True, False, False], [True, True, False]]
    """
    lq, lk = _check_length("lq", lq), _check_length("lk", lk)
    offset = _offset(lq, lk, align)
    ns = resolve_namespace(xp)
    s = Structure(lq, lk, offset, causal=True)
    return s.tile(0, lq, 0, lk, xp=ns, device=device)


def window_mask(
    lq: int,
    lk: int,
    /,
    *,
    window: int | tuple[int, int],
    causal: bool = False,
    align: Align = "bottom_right",
    xp: Namespace | None = None,
    device: Device | None = None,
) -> Array:
    """Boolean sliding-window mask of shape ``(lq, lk)``, True where attention is allowed.

    Query ``i`` sees keys ``i' - left <= j <= i' + right`` where ``i' = i``
    (``align="top_left"``) or ``i' = i + lk - lq`` (``align="bottom_right"``),
    the semantics of ``jax.nn.dot_product_attention``'s ``local_window_size``.

    Parameters
    ----------
    lq, lk : int
        Number of queries and keys.
    window : int or (int, int)
        ``(left, right)`` window sizes; an int ``w`` means ``(w, w)``.
    causal : bool, optional
        Also hide keys after the aligned position (a Mistral-style window).
        ``True`` or ``False`` only.
    align : {"bottom_right", "top_left"}, optional
        How queries line up with keys when ``lq != lk``.
    xp, device : optional
        As in :func:`causal_mask`.

    Returns
    -------
    array, shape (lq, lk)
        Boolean: True where the window (and ``causal``) lets query ``i`` see key ``j``.

    Examples
    --------
    >>> import portattn as pa
    >>> pa.window_mask(4, 4, window=(1, 0)).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    lq, lk = _check_length("lq", lq), _check_length("lk", lk)
    is_causal = check_flag("causal", causal)
    sizes = normalize_window(window)
    if sizes is None:
        msg = "expected window to be a non-negative int or a pair of them, got None"
        raise ValueError(msg)
    offset = _offset(lq, lk, align)
    ns = resolve_namespace(xp)
    s = Structure(lq, lk, offset, causal=is_causal, window=_clamp_window(sizes, lq, lk))
    return s.tile(0, lq, 0, lk, xp=ns, device=device)


def length_mask(
    lengths: Array, n: int, start: int, stop: int, *, xp: Namespace, device: Device
) -> Array:
    """``positions[start:stop] < lengths``, shaped ``lengths.shape + (stop - start,)``."""
    pos = xp.arange(start, stop, dtype=lengths.dtype, device=device)
    return pos < lengths[..., None]
