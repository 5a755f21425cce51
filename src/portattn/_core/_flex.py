"""Programmable attention on one tile: ``score_mod`` and a block mask's ``mask_mod``.

A :class:`Mods` is the part of a :class:`~portattn._core._problem.Problem`
that user functions decide. Every path asks it the same three questions about
a tile ``[q0, q1) x [k0, k1)`` of the score matrix:

- :meth:`Mods.kind`: is the tile EMPTY (skip it: no score, no key read),
  FULL (no ``mask_mod`` call) or PARTIAL, by the block mask's table;
- :meth:`Mods.score`: the scores after ``score_mod``;
- :meth:`Mods.allowed`: ``mask_mod``'s verdict on a PARTIAL tile.

Positions handed to the mods are absolute: ``origin`` says where this
problem's first batch entry, head, query and key sit in the whole call (a
dask chunk is a problem of its own, somewhere inside the call).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .._lib._checks import shown
from .._lib._typing import Array, Device, Namespace
from .._lib._vocabulary import check_mod_arity, foreign_block_mask
from ._block_mask import EMPTY, FULL, PARTIAL, BlockMask
from ._modspec import (
    MaskMod,
    ScoreMod,
    apply_mask_mod,
    apply_score_mod,
    check_libraries,
    check_sizes,
    tile_indices,
)

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "MaskMod",
    "Mods",
    "ScoreMod",
    "flex_mods",
]

Indices = tuple[Array, Array, Array, Array]
Table = tuple[tuple[int, ...], ...]  # a block mask's kinds, one row per query block


@dataclass(frozen=True, slots=True)
class Mods:
    """What a call's user functions decide; never holds a differentiable array itself.

    A block mask is held by its fields, not as the :class:`BlockMask`:
    ``table`` (:attr:`BlockMask.table`), ``mask_mod``, ``block`` and the
    ranges worth running apart. ``table`` is ``None`` when no block mask was
    given; ``mask_mod`` then is ``None`` too. ``origin`` is the absolute
    (batch, head, query, key) of this problem's first element.
    """

    score_mod: ScoreMod | None = None
    mask_mod: MaskMod | None = None
    table: Table | None = None  # the tile kinds, one row per query block
    block: tuple[int, int] = (128, 128)
    origin: tuple[int, int, int, int] = (0, 0, 0, 0)
    # (b0, b1, h0, h1, table) per (batch, head) range of the whole call worth
    # running apart (BlockMask.parts, on the call's (B, H)); () in a part,
    # and in any sub-problem.
    ranges: tuple[tuple[int, int, int, int, Table], ...] = ()

    def shifted(self, b0: int, h0: int, q0: int, k0: int) -> Mods:
        """The same mods for a sub-problem starting at ``(b0, h0, q0, k0)`` of this one."""
        o = self.origin
        return replace(self, origin=(o[0] + b0, o[1] + h0, o[2] + q0, o[3] + k0), ranges=())

    def parts(self) -> list[tuple[int, int, int, int, Mods]]:
        """``(b0, b1, h0, h1, mods)`` per (batch, head) range worth running apart, or ``[]``.

        Each range's mods read that range's own tile table
        (:attr:`BlockMask.parts`), so a tile empty for those batch entries
        and heads is skipped even where others need it.
        """
        o = self.origin
        return [
            (
                b0,
                b1,
                h0,
                h1,
                replace(self, table=t, origin=(o[0] + b0, o[1] + h0, *o[2:]), ranges=()),
            )
            for b0, b1, h0, h1, t in self.ranges
        ]

    def kinds_in(self, q0: int, q1: int, k0: int, k1: int) -> set[int]:
        """The kinds of the blocks the tile overlaps (FULL alone without a block mask)."""
        if self.table is None:
            return {FULL}
        if q1 <= q0 or k1 <= k0:
            return {EMPTY}
        i0, i1, j0, j1 = self._blocks(q0, q1, k0, k1)
        return {k for row in self.table[i0:i1] for k in row[j0:j1]}

    def visited(self, q0: int, q1: int, k0: int, k1: int) -> int:
        """How many of the blocks the tile overlaps are not EMPTY (by the table)."""
        if self.table is None or q1 <= q0 or k1 <= k0:
            return 0
        i0, i1, j0, j1 = self._blocks(q0, q1, k0, k1)
        return sum(k != EMPTY for row in self.table[i0:i1] for k in row[j0:j1])

    def _blocks(self, q0: int, q1: int, k0: int, k1: int) -> tuple[int, int, int, int]:
        """``[i0, i1) x [j0, j1)``: the query and key blocks the tile overlaps."""
        bq, bk = self.block
        oq, ok = self.origin[2] + q0, self.origin[3] + k0
        return oq // bq, -(-(oq + q1 - q0) // bq), ok // bk, -(-(ok + k1 - k0) // bk)

    def kind(self, q0: int, q1: int, k0: int, k1: int) -> int:
        """EMPTY, PARTIAL or FULL for the tile, from the blocks it overlaps (conservatively)."""
        if self.table is None:
            return FULL if self.mask_mod is None else PARTIAL
        if q1 <= q0 or k1 <= k0:
            return EMPTY
        i0, i1, j0, j1 = self._blocks(q0, q1, k0, k1)
        if i1 - i0 == 1 and j1 - j0 == 1:  # one block: the common case, no reduction
            return self.table[i0][j0]
        seen = {k for row in self.table[i0:i1] for k in row[j0:j1]}
        if seen == {EMPTY}:
            return EMPTY
        return FULL if seen == {FULL} else PARTIAL

    def indices(
        self,
        batch: tuple[int, ...],
        q0: int,
        q1: int,
        k0: int,
        k1: int,
        *,
        xp: Namespace,
        device: Device,
    ) -> tuple[Array, Array, Array, Array]:
        """The tile's index arrays, int64 on ``device``, in absolute positions.

        ``b`` (B, 1, 1, 1), ``h`` (1, H, 1, 1), ``q_idx`` (1, 1, Tq, 1) and
        ``kv_idx`` (1, 1, 1, Tk).
        """
        ob, oh, oq, ok = self.origin
        nb, nh = batch
        return tile_indices(
            range(ob, ob + nb),
            range(oh, oh + nh),
            range(oq + q0, oq + q1),
            range(ok + k0, ok + k1),
            xp=xp,
            device=device,
        )

    def score(self, s: Array, idx: Indices, *, xp: Namespace) -> Array:
        """``score_mod(s, b, h, q_idx, kv_idx)``, checked, in ``s``'s dtype and full tile shape."""
        assert self.score_mod is not None
        tile = (idx[0].shape[0], idx[1].shape[1], s.shape[-2], s.shape[-1])
        if tuple(s.shape) != tile:  # q or k broadcast over batch or heads: the mod sees them all
            s = xp.broadcast_to(s, tile)
        return apply_score_mod(self.score_mod, s, idx, xp=xp)

    def allowed(self, idx: Indices, *, xp: Namespace) -> Array:
        """``mask_mod(b, h, q_idx, kv_idx)``, checked: a boolean array broadcastable to the tile."""
        assert self.mask_mod is not None
        return apply_mask_mod(self.mask_mod, idx, xp=xp)

    def tile_allowed(
        self, idx: Indices, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace, device: Device
    ) -> Array | None:
        """What the block mask allows in the tile, read from its kinds as blockwise reads them.

        ``None`` on a FULL tile; all False on an EMPTY one; ``mask_mod`` on
        one PARTIAL block. A tile over several blocks (the materialising and
        native paths take the whole matrix as one tile; a trace may merge
        blocks) gets each block's own kind: False in EMPTY blocks, True in
        FULL ones, ``mask_mod`` in PARTIAL ones.
        """
        kind = self.kind(q0, q1, k0, k1)
        if kind == FULL or self.mask_mod is None:
            return None
        if kind == EMPTY:
            return xp.zeros((1, 1, q1 - q0, k1 - k0), dtype=xp.bool, device=device)
        m = self.allowed(idx, xp=xp)
        assert self.table is not None
        bq, bk = self.block
        oq, ok = self.origin[2] + q0, self.origin[3] + k0
        i0, i1, j0, j1 = self._blocks(q0, q1, k0, k1)
        table = [row[j0:j1] for row in self.table[i0:i1]]
        if all(k == PARTIAL for row in table for k in row):
            return m
        # Each element's block kind: the table's entries spread over the tile.
        ints = idx[2].dtype
        blocks = xp.asarray(table, dtype=xp.int8, device=device)
        rows = xp.arange(oq, oq + q1 - q0, dtype=ints, device=device) // bq - i0
        cols = xp.arange(ok, ok + k1 - k0, dtype=ints, device=device) // bk - j0
        kinds = xp.take(xp.take(blocks, rows, axis=0), cols, axis=1)
        kinds = xp.reshape(kinds, (1, 1, q1 - q0, k1 - k0))
        return xp.logical_and(xp.logical_or(m, kinds == FULL), kinds != EMPTY)


def flex_mods(
    score_mod: Any,
    block_mask: Any,
    *,
    batch: tuple[int, ...],
    lq: int,
    lk: int,
    library: str | None = None,
) -> Mods | None:
    """Validate ``score_mod=`` and ``block_mask=`` against the call's shapes and library.

    ``library`` is the one the mods compute in (:func:`~._modspec.mod_library`
    of the inputs); the arrays they capture must be of it. ``None`` skips
    that check (``portattn.parallel``, which checks per local call).
    """
    if score_mod is None and block_mask is None:
        return None
    if score_mod is not None and not callable(score_mod):
        msg = (
            "expected score_mod to be a function (score, b, h, q_idx, kv_idx), "
            f"got {shown(score_mod)}"
        )
        raise TypeError(msg)
    if score_mod is not None:
        check_mod_arity("score_mod", score_mod)
    if len(batch) != 2:
        msg = (
            "score_mod and block_mask need 4-D (B, H, L, d) inputs, as FlexAttention does, "
            f"got batch shape {batch} ({len(batch) + 2}-D)"
        )
        raise ValueError(msg)
    nb, nh = batch
    if score_mod is not None:
        _check_mod(score_mod, "score_mod", library)
        check_sizes(score_mod, batch=nb, heads=nh, lq=lq, lk=lk)
    if block_mask is None:
        return Mods(score_mod)
    if not isinstance(block_mask, BlockMask):
        msg = f"expected block_mask to be a portattn.BlockMask, {foreign_block_mask(block_mask)}"
        raise TypeError(msg)
    shape = tuple(block_mask.shape)
    fits = shape[-2:] == (lq, lk) and all(
        n is None or n == 1 or n == size for n, size in zip(shape[:2], batch, strict=True)
    )
    if not fits:
        msg = (
            "expected a block_mask built for (B, H, Lq, Lk) = "
            f"({batch[0]}, {batch[1]}, {lq}, {lk}) (B and H may be None), got one for {shape}"
        )
        raise ValueError(msg)
    _check_mod(block_mask.mask_mod, "mask_mod", library)
    check_sizes(block_mask.mask_mod, batch=nb, heads=nh, lq=lq, lk=lk)
    # A mask axis of 1 spans all of the call's.
    ranges = tuple(
        (
            *((0, nb) if shape[0] == 1 else (b0, b1)),
            *((0, nh) if shape[1] == 1 else (h0, h1)),
            table,
        )
        for b0, b1, h0, h1, table in block_mask.parts
    )
    return Mods(
        score_mod, block_mask.mask_mod, block_mask.table, block_mask.block_size, ranges=ranges
    )


def _check_mod(mod: Any, what: str, library: str | None) -> None:
    if library is not None:
        against = "the library of the inputs (of their chunks, for dask)"
        check_libraries(mod, what=what, library=library, against=against)
