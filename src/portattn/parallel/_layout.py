"""How a sequence is cut across ``world`` ranks: which global rows each rank holds.

Two layouts, as ring-flash-attn names them:

- ``"contiguous"``: rank ``r`` holds rows ``[r·L/P, (r+1)·L/P)``, one chunk;
- ``"zigzag"``: the sequence is cut into ``2P`` chunks and rank ``r`` holds
  chunks ``r`` and ``2P-1-r``, in that order. Under a causal mask the early
  chunk sees little and the late one much, so every rank does the same work.

Everything here is integers and slicing (array API): no communication.
"""

from __future__ import annotations

from typing import Literal

from .._core._modspec import index_dtype
from .._lib._checks import check_int
from .._lib._compat import array_namespace, resolve_namespace
from .._lib._typing import Array, Device, Namespace

__all__ = ["LAYOUTS", "Layout", "check_layout", "chunk_ids", "positions", "shard", "unshard"]

Layout = Literal["zigzag", "contiguous"]
LAYOUTS: tuple[str, ...] = ("zigzag", "contiguous")


def check_layout(layout: object) -> Layout:
    if layout not in LAYOUTS:
        msg = f"expected layout to be one of {LAYOUTS}, got {layout!r}"
        raise ValueError(msg)
    return layout  # type: ignore[return-value]


def chunks_per_rank(layout: Layout) -> int:
    return 2 if layout == "zigzag" else 1


def chunk_ids(rank: int, world: int, layout: Layout) -> tuple[int, ...]:
    """The global chunk numbers rank ``rank`` holds, in the order it holds them."""
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def _check_rank_world(rank: object, world: object) -> tuple[int, int]:
    w = check_int("world", world, minimum=1)
    r = check_int("rank", rank, minimum=0)
    if r >= w:
        msg = f"expected rank in [0, world={w}), got rank={r}"
        raise ValueError(msg)
    return r, w


def chunk_size(length: int, world: int, layout: Layout) -> int:
    """Rows per chunk; refuses a length the layout cannot cut evenly."""
    n = world * chunks_per_rank(layout)
    if length % n:
        what = f"2P = {n}" if layout == "zigzag" else f"P = {n}"
        msg = (
            f"layout={layout!r} with P={world} ranks needs a sequence length divisible by "
            f"{what}, got {length}; pad the sequence (and mask the padding) or use another P"
        )
        raise ValueError(msg)
    return length // n


def _axis(x: Array, axis: object) -> int:
    a = check_int("axis", axis)
    if not -x.ndim <= a < x.ndim:
        shape = tuple(x.shape)
        msg = f"expected axis in [-{x.ndim}, {x.ndim}) for an array of shape {shape}, got {a}"
        raise ValueError(msg)
    return int(a % x.ndim)


def _take(x: Array, axis: int, start: int, stop: int) -> Array:
    index = (slice(None),) * axis + (slice(start, stop),)
    return x[index]


def shard(
    x: Array, /, *, rank: int, world: int, layout: Layout = "zigzag", axis: int = -2
) -> Array:
    """Rank ``rank``'s shard of ``x`` along the sequence axis ``axis``.

    Examples
    --------
    >>> import numpy as np
    >>> from portattn import parallel
    >>> parallel.shard(np.arange(8)[:, None], rank=0, world=2)[:, 0].tolist()
    [0, 1, 6, 7]
    """
    r, w = _check_rank_world(rank, world)
    kind = check_layout(layout)
    xp = array_namespace(x)
    a = _axis(x, axis)
    c = chunk_size(int(x.shape[a]), w, kind)
    parts = [_take(x, a, i * c, (i + 1) * c) for i in chunk_ids(r, w, kind)]
    return parts[0] if len(parts) == 1 else xp.concat(parts, axis=a)


def unshard(shards: list[Array], /, *, layout: Layout = "zigzag", axis: int = -2) -> Array:
    """The whole array from every rank's shard, in rank order (the inverse of :func:`shard`).

    Examples
    --------
    >>> import numpy as np
    >>> from portattn import parallel
    >>> x = np.arange(8)[:, None]
    >>> parts = [parallel.shard(x, rank=r, world=2) for r in range(2)]
    >>> bool((parallel.unshard(parts) == x).all())
    True
    """
    kind = check_layout(layout)
    if not isinstance(shards, (list, tuple)) or not shards:
        msg = f"expected a non-empty list of every rank's shard, got {type(shards).__name__}"
        raise TypeError(msg)
    xp = array_namespace(*shards)
    a = _axis(shards[0], axis)
    lengths = [int(s.shape[a]) for s in shards]
    if len(set(lengths)) != 1:
        msg = f"expected every shard to have the same length along axis {axis}, got {lengths}"
        raise ValueError(msg)
    w, per = len(shards), chunks_per_rank(kind)
    if lengths[0] % per:
        msg = f"layout={kind!r} needs shards of even length, got {lengths[0]}"
        raise ValueError(msg)
    c = lengths[0] // per
    pieces: dict[int, Array] = {}
    for r, s in enumerate(shards):
        for j, i in enumerate(chunk_ids(r, w, kind)):
            pieces[i] = _take(s, a, j * c, (j + 1) * c)
    return xp.concat([pieces[i] for i in range(w * per)], axis=a)


def row_starts(length: int, rank: int, world: int, layout: Layout) -> list[tuple[int, int, int]]:
    """``(local start, global start, rows)`` of each chunk rank ``rank`` holds."""
    c = chunk_size(length, world, layout)
    return [(j * c, i * c, c) for j, i in enumerate(chunk_ids(rank, world, layout))]


def positions(
    length: int,
    /,
    *,
    rank: int,
    world: int,
    layout: Layout = "zigzag",
    xp: Namespace | None = None,
    device: Device | None = None,
) -> Array:
    """The global positions of rank ``rank``'s rows: for RoPE and ``position_ids``.

    int64 (int32 under JAX without x64), on ``device``.

    Examples
    --------
    >>> from portattn import parallel
    >>> parallel.positions(8, rank=1, world=2).tolist()
    [2, 3, 4, 5]
    """
    n = check_int("length", length, minimum=0)
    r, w = _check_rank_world(rank, world)
    kind = check_layout(layout)
    ns = resolve_namespace(xp)
    ints = index_dtype(xp=ns, device=device)
    parts = [
        ns.arange(g, g + rows, dtype=ints, device=device)
        for _, g, rows in row_starts(n, r, w, kind)
    ]
    return parts[0] if len(parts) == 1 else ns.concat(parts)
