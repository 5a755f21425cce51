"""The mod protocol: small user functions that program attention, as FlexAttention's do.

A ``score_mod(score, b, h, q_idx, kv_idx)`` returns the modified score; a
``mask_mod(b, h, q_idx, kv_idx)`` returns True where a query may attend. The
index arguments are integer arrays of the inputs' namespace and device that
broadcast to the score tile (batch, heads, queries, keys): ``b`` is
(Tb, 1, 1, 1), ``h`` (1, Th, 1, 1), ``q_idx`` (1, 1, Tq, 1), ``kv_idx``
(1, 1, 1, Tk), each holding absolute positions. A mod is therefore ordinary
elementwise array code, and one written with operators and indexing of
captured arrays alone runs unchanged under torch's ``flex_attention``, whose
``vmap`` hands it scalars instead.
"""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Callable

from .._lib._captures import captured
from .._lib._checks import dtype_name, has_kind
from .._lib._compat import library_name
from .._lib._typing import Array, Device, DType, Namespace
from .._lib._vocabulary import check_mod_arity

__all__ = [
    "MaskMod",
    "ScoreMod",
    "and_masks",
    "apply_mask_mod",
    "apply_score_mod",
    "check_libraries",
    "check_sizes",
    "index_dtype",
    "mod_library",
    "or_masks",
    "sized",
    "tile_indices",
]

MaskMod = Callable[[Array, Array, Array, Array], Array]
ScoreMod = Callable[[Array, Array, Array, Array, Array], Array]

Indices = tuple[Array, Array, Array, Array]


# The attribute a mod carries to check the arrays it captures against a
# call's sizes: JAX clamps an out-of-range index instead of raising, so the
# check runs before any tile is indexed, on every library.
_SIZES = "_portattn_check_sizes"
SizeCheck = Callable[[int, int, int, int], None]


def sized(mod: Callable[..., Array], check: SizeCheck) -> Callable[..., Array]:
    """``mod``, carrying ``check(B, H, Lq, Lk)``, which raises where a captured array is short."""
    setattr(mod, _SIZES, check)
    return mod


def check_sizes(mod: object, *, batch: int, heads: int, lq: int, lk: int) -> None:
    """Run the size check ``mod`` carries (:func:`sized`), if any, for a call of these sizes."""
    check = getattr(mod, _SIZES, None)
    if check is not None:
        check(batch, heads, lq, lk)


def _is_captured_array(x: object) -> bool:
    """An array a mod may index (rank 1 or more); a 0-d array or NumPy scalar acts as a number."""
    shape = getattr(x, "shape", None)
    return (
        not isinstance(x, type)
        and isinstance(shape, tuple)
        and len(shape) > 0
        and hasattr(x, "dtype")
    )


def mod_library(x: Array) -> str:
    """The library a call's mods compute in: the inputs', or their chunks' for a dask array."""
    top = _library(x)
    meta = getattr(x, "_meta", None)  # a dask array runs its mods on chunks
    return _library(meta) if top == "dask" and meta is not None else top


def check_libraries(mod: Callable[..., object], *, what: str, library: str, against: str) -> None:
    """Refuse an array ``mod`` captures that is not of ``library``, before any tile is formed.

    A mod computes in the library of the index arguments it is handed, which
    is the inputs' (``against`` says which call fixed it). A captured array
    of another library failed deep inside the mod, differently per path:
    NumPy slopes under JAX ran on materialize and broke blockwise and
    ``jit``; NumPy ids indexed by tensors returned NumPy. Every path now
    refuses it the same way, once per call, naming the mod and both libraries.
    Under ``torch.compile`` the walk is skipped: dynamo cannot trace it, and
    traces the mod itself (NumPy included) instead.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        return
    for x in captured(mod, _is_captured_array):
        have = _library(x)
        if have == library:
            continue
        shape = tuple(getattr(x, "shape", ()))
        make = "jax.numpy" if library == "jax" else library
        msg = (
            f"expected the arrays that {what} {_name_of(mod)} captures to be {library} arrays, "
            f"{against}, got a {type(x).__module__}.{type(x).__name__} of shape {shape} "
            f"({have}): convert it ({make}.asarray) and build the mod, and any block mask "
            "built from it, again"
        )
        raise TypeError(msg)


def index_dtype(*, xp: Namespace, device: Device = None) -> DType:
    """The namespace's default integer dtype: int64, or int32 under JAX without x64.

    Asking the namespace rather than naming int64 keeps JAX from warning that
    it truncated a requested int64 (and from paying a conversion per tile).
    """
    info = getattr(xp, "__array_namespace_info__", None)
    if info is None:
        return xp.int64
    return info().default_dtypes(device=device)["integral"]


def _span(name: str, span: range) -> range:
    if not isinstance(span, range) or span.step != 1:
        msg = f"expected {name} to be a range with step 1, got {span!r}"
        raise TypeError(msg)
    if span.start < 0:
        msg = f"expected {name} to start at a non-negative position, got {span!r}"
        raise ValueError(msg)
    return span


def tile_indices(
    batch: range, heads: range, queries: range, keys: range, *, xp: Namespace, device: Device
) -> Indices:
    """The ``(b, h, q_idx, kv_idx)`` a mod sees for one tile, as absolute positions.

    Each argument is the ``range`` of positions the tile covers along that
    axis; the arrays come back shaped (Tb,1,1,1), (1,Th,1,1), (1,1,Tq,1),
    (1,1,1,Tk) in the namespace's default integer dtype on ``device``.
    """
    dtype = index_dtype(xp=xp, device=device)
    spans = (
        _span("batch", batch),
        _span("heads", heads),
        _span("queries", queries),
        _span("keys", keys),
    )
    out = []
    for axis, span in enumerate(spans):
        shape = [1, 1, 1, 1]
        shape[axis] = len(span)
        r = xp.arange(span.start, span.stop, dtype=dtype, device=device)
        out.append(xp.reshape(r, tuple(shape)))
    return out[0], out[1], out[2], out[3]


def _tile_shape(idx: Indices) -> tuple[int, int, int, int]:
    b, h, q, kv = idx
    return int(b.shape[0]), int(h.shape[1]), int(q.shape[2]), int(kv.shape[3])


def _broadcastable(got: tuple[int, ...], to: tuple[int, ...]) -> bool:
    if len(got) > len(to):
        return False
    return all(g in (1, t) for g, t in zip(reversed(got), reversed(to), strict=False))


def _name_of(mod: object) -> str:
    return getattr(mod, "__name__", type(mod).__name__)


def _check_library(what: str, mod: object, got: object, idx: Indices) -> None:
    """Refuse a result from another library than the mod's index arguments.

    The usual cause: ids or a table captured as NumPy while attention runs
    on torch (NumPy then indexes with the tensors and quietly returns NumPy),
    or captured as torch while a block mask is built with NumPy. Either
    would fail deep inside the path, far from the mod that caused it.
    """
    if not hasattr(got, "shape"):
        return  # not an array at all: the dtype check names it
    have, want = _library(got), _library(idx[2])
    if have != want:
        msg = (
            f"expected {what} {_name_of(mod)} to return an array of {want}, the library of "
            f"its index arguments, got {type(got).__module__}.{type(got).__name__}: capture "
            f"{want} arrays in the mod (ids, slopes, tables), or build the block mask "
            f"with xp= the library of the arrays it captures"
        )
        raise TypeError(msg)


def _library(x: object) -> str:
    """The top-level package an array's type comes from (jaxlib's arrays count as JAX's)."""
    top = library_name(x)
    return "jax" if top == "jaxlib" else top


def _called(what: str, mod: object, idx: Indices, fn: Callable[..., Array], *args: Array) -> Array:
    """``fn(*args)``; an IndexError (a captured array too short) becomes a ValueError naming it."""
    try:
        return fn(*args)
    except IndexError as e:
        b, h, q, kv = _tile_shape(idx)
        msg = (
            f"expected every array that {what} {_name_of(mod)} captures to cover the positions "
            "of the axis that indexes it (B, H, Lq or Lk), got an index past the end on a tile "
            f"of {b} batch entries, {h} heads, {q} queries and {kv} keys ({e})"
        )
        raise ValueError(msg) from e


def _result(
    what: str,
    mod: Callable[..., Array],
    idx: Indices,
    args: tuple[Array, ...],
    *,
    kind: str,
    wanted: str,
    note: str = "",
    xp: Namespace,
) -> Array:
    """``mod(*args)``, checked as both mods' results are: its library, then its dtype's kind."""
    got = _called(what, mod, idx, mod, *args)
    _check_library(what, mod, got, idx)
    dtype = getattr(got, "dtype", None)
    if dtype is None or not has_kind(dtype, kind, xp=xp):
        name = type(got).__name__ if dtype is None else dtype_name(dtype)
        msg = f"expected {what} {_name_of(mod)} to return {wanted}, got {name}{note}"
        raise TypeError(msg)
    return got


def apply_mask_mod(mask_mod: MaskMod, idx: Indices, *, xp: Namespace) -> Array:
    """``mask_mod(*idx)`` checked, as a 4-D boolean array that broadcasts to the tile.

    The result keeps its own (possibly smaller) shape: a mod that ignores
    ``b`` and ``h`` returns (1, 1, Tq, Tk), and callers may exploit that.
    """
    tile = _tile_shape(idx)
    wanted = "a boolean array (True where attention is allowed)"
    got = _result("mask_mod", mask_mod, idx, idx, kind="bool", wanted=wanted, xp=xp)
    shape = tuple(getattr(got, "shape", ()))
    if not _broadcastable(shape, tile):
        msg = (
            f"expected mask_mod {_name_of(mask_mod)} to return an array broadcastable "
            f"to the tile shape {tile}, got shape {shape}"
        )
        raise ValueError(msg)
    if len(shape) < 4:
        got = xp.reshape(got, (1,) * (4 - len(shape)) + shape)
    return got


def apply_score_mod(score_mod: ScoreMod, score: Array, idx: Indices, *, xp: Namespace) -> Array:
    """``score_mod(score, *idx)`` checked: the shape and dtype of ``score``.

    A real floating result that promoted the dtype (NumPy turns float32
    times int64 into float64) is cast back; one without the batch or head
    axes (a mod that ignores ``b`` or ``h`` and the score) is broadcast. An
    integer result, and one smaller than the tile along the query or key
    axis (its value would depend on how a path tiles the scores), are
    refused, naming the mod and the shape expected.
    """
    got = _result(
        "score_mod", score_mod, idx, (score, *idx), kind="real floating",
        wanted="a real array shaped like the score",
        note="; scores are floating (integers are refused)", xp=xp,
    )  # fmt: skip
    shape = tuple(got.shape)
    want = tuple(score.shape)
    if shape != want:
        padded = (1,) * (len(want) - len(shape)) + shape
        if not _broadcastable(shape, want) or padded[-2:] != want[-2:]:
            msg = (
                f"expected score_mod {_name_of(score_mod)} to return the score's shape "
                f"{want}, got shape {shape}: a result smaller than the tile along the query "
                "or key axis would depend on how each path tiles the scores"
            )
            raise ValueError(msg)
        got = xp.broadcast_to(got, want)
    if got.dtype != score.dtype:
        got = xp.astype(got, score.dtype)
    return got


def _check_mods(name: str, mods: tuple[object, ...]) -> None:
    for i, mod in enumerate(mods):
        if not callable(mod):
            msg = (
                f"expected every argument of {name} to be a mask_mod "
                f"(a callable (b, h, q_idx, kv_idx) -> bool array), got {type(mod).__name__} "
                f"at position {i}"
            )
            raise TypeError(msg)
        check_mod_arity("mask_mod", mod)


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    """A ``mask_mod`` that allows a pair only where every one of ``mask_mods`` does.

    Parameters
    ----------
    *mask_mods : callable
        Functions ``(b, h, q_idx, kv_idx) -> bool array``.

    Returns
    -------
    callable
        Their intersection, itself a ``mask_mod``. With no argument it allows
        every pair. It uses only ``&``, so it also serves torch's
        ``flex_attention``.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> causal = lambda b, h, q, kv: q >= kv
    >>> near = lambda b, h, q, kv: q - kv <= 1
    >>> both = pa.and_masks(causal, near)
    >>> q, kv = np.arange(4).reshape(4, 1), np.arange(4).reshape(1, 4)
    >>> both(0, 0, q, kv).astype(np.int8)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]], dtype=int8)
    """
    return _combined("and_masks", _and_mask, mask_mods)


def or_masks(*mask_mods: MaskMod) -> MaskMod:
    """A ``mask_mod`` that allows a pair wherever any one of ``mask_mods`` does.

    Parameters
    ----------
    *mask_mods : callable
        As in :func:`and_masks`.

    Returns
    -------
    callable
        Their union, itself a ``mask_mod``. With no argument it allows no
        pair. It uses only ``|``, so it also serves torch's ``flex_attention``.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> causal = lambda b, h, q, kv: q >= kv
    >>> first_key = lambda b, h, q, kv: kv == 0
    >>> either = pa.or_masks(causal, first_key)
    >>> q, kv = np.arange(3).reshape(3, 1), np.arange(3).reshape(1, 3)
    >>> either(0, 0, q, kv).astype(np.int8)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]], dtype=int8)
    """
    return _combined("or_masks", _or_mask, mask_mods)


# Module-level functions bound by functools.partial, not closures: a block
# mask built from a combination then pickles with the standard library.
def _combined(name: str, fn: Callable[..., Array], mask_mods: tuple[MaskMod, ...]) -> MaskMod:
    """``and_masks`` and ``or_masks`` alike: the mods checked, bound to ``fn``, and sized."""
    _check_mods(name, mask_mods)
    mods = tuple(mask_mods)
    mod = functools.partial(fn, mods)
    mod.__name__ = fn.__name__.lstrip("_")  # type: ignore[attr-defined]
    return sized(mod, functools.partial(_check_each, mods))


def _and_mask(mods: tuple[MaskMod, ...], b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
    if not mods:
        return q_idx == q_idx  # True everywhere, in the caller's library, by operators alone
    return _fold(operator.and_, mods, b, h, q_idx, kv_idx)


def _or_mask(mods: tuple[MaskMod, ...], b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
    if not mods:
        return q_idx != q_idx  # False everywhere
    return _fold(operator.or_, mods, b, h, q_idx, kv_idx)


def _fold(op: Callable[[Array, Array], Array], mods: tuple[MaskMod, ...], *idx: Array) -> Array:
    """The mods' masks at ``idx`` combined by ``op`` (``&`` or ``|``), left to right, in order."""
    result = mods[0](*idx)
    for mod in mods[1:]:
        result = op(result, mod(*idx))
    return result


def _check_each(mods: tuple[MaskMod, ...], nb: int, nh: int, lq: int, lk: int) -> None:
    for mod in mods:
        check_sizes(mod, batch=nb, heads=nh, lq=lq, lk=lk)
