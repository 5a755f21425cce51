"""Which (query chunk, key chunk) pairs a rank computes, and the sub-problem of each.

A rank holds one chunk of rows (contiguous layout) or two (zigzag), of the
whole sequence of length ``L = P · n``. Attention of the rank's queries over
the keys of rank ``src`` is a sum, by exact log-sum-exp merges, over the pairs
of its query chunks and ``src``'s key chunks. Each pair is a
:class:`~portattn._core._problem.Problem` of its own whose positions and mods
are the whole call's, shifted to where the chunks sit (as the dask path's pair
tasks): causal, a window, ``score_mod`` and a block mask built for the whole
sequence all see global positions.

A pair that positions or the block mask hide entirely is dropped here: it
costs no compute and no tile, which :class:`Stats` counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .._core._flex import EMPTY, Mods
from .._core._groups import kv_groups
from .._core._masks import Structure
from .._core._prepare import prepare
from .._core._problem import Problem
from .._core._variant import Variant
from .._lib._typing import Array, Namespace
from .._paths._blockwise import problem_block_sizes
from ._layout import Layout, chunk_size, row_starts
from ._options import Setup

__all__ = [
    "Pair",
    "Schedule",
    "Stats",
    "check_ulysses",
    "group_heads",
    "pair_problem",
    "ring_setup",
    "shard_mods",
    "tiles_of",
]


@dataclass(frozen=True)
class Pair:
    """One visible pair: rows ``q_rows`` of this rank's shard against ``k_rows`` of ``src``'s."""

    q_chunk: int  # which of this rank's chunks (0, or 0/1 in zigzag)
    q_rows: tuple[int, int]
    k_rows: tuple[int, int]
    structure: Structure  # positions of the pair, in its own coordinates
    mods: Mods | None  # the call's mods, shifted to the pair's global start


@dataclass
class Stats:
    """What one call did on this rank: counted as it runs, for tests and the bench.

    ``bytes_sent`` counts the payload this rank hands to the communication
    library (K/V shards forward; K/V and their gradients backward), not the
    library's own framing.
    """

    pairs: int = 0  # (query chunk, key chunk) pairs computed
    hidden: int = 0  # pairs skipped because positions or the block mask hide them entirely
    tiles: int = 0  # blockwise tiles visited inside the computed pairs
    bytes_sent: int = 0
    backward_pairs: int = 0
    backward_bytes_sent: int = 0
    per_source: dict[int, int] = field(default_factory=dict)  # tiles per source rank


@dataclass(frozen=True)
class Schedule:
    """The pairs of one call on one rank: the whole call's positions and mods, and the layout."""

    world: int
    rank: int
    layout: Layout
    n: int  # rows per rank
    structure: Structure  # the whole call's positions, (L, L)
    mods: Mods | None  # the whole call's mods (global origin)

    @property
    def length(self) -> int:
        return self.n * self.world

    def chunks(self, rank: int) -> list[tuple[int, int, int]]:
        """``(local start, global start, rows)`` of each chunk ``rank`` holds."""
        return row_starts(self.length, rank, self.world, self.layout)

    def pairs(self, src: int, stats: Stats | None = None) -> list[Pair]:
        """The visible pairs of this rank's queries against ``src``'s keys, in a fixed order."""
        s, out = self.structure, []
        for qc, (qa, q0, nq) in enumerate(self.chunks(self.rank)):
            for ka, k0, nk in self.chunks(src):
                sub = Structure(nq, nk, s.offset + q0 - k0, s.causal, s.window)
                mods = None if self.mods is None else self.mods.shifted(0, 0, q0, k0)
                lo, hi = sub.key_range(0, nq)
                hidden = hi <= lo or (mods is not None and mods.kind(0, nq, 0, nk) == EMPTY)
                if hidden:
                    if stats is not None:
                        stats.hidden += 1
                    continue
                out.append(Pair(qc, (qa, qa + nq), (ka, ka + nk), sub, mods))
        return out


def pair_problem(
    base: Problem, pair: Pair, q: Array, k: Array, v: Array, *, xp: Namespace
) -> Problem:
    """The pair's problem: ``base``'s options (the sink aside) on the chunks ``q``, ``k``, ``v``.

    ``q`` is already scaled and ``k``, ``v`` in the compute dtype; ``k`` and
    ``v`` may have fewer heads than ``q`` (GQA): they travel the ring with
    their own heads, and the pair's problem reads them as ``attention`` does
    (:mod:`portattn._core._groups`): never repeated.
    A sink is folded in once per row after the merge, not per pair.
    """
    variant = dataclasses.replace(base.variant.without_sink(), mods=pair.mods)
    groups = kv_groups(q, k, v)
    return Problem(q, k, v, variant, pair.structure, base.batch, q.dtype, base.device, 1.0, groups)


def tiles_of(p: Problem, block_size: tuple[int, int] | None, *, xp: Namespace) -> int:
    """How many tiles the blockwise loop visits for ``p`` (the same walk as its forward)."""
    bq, bk = problem_block_sizes(p, block_size, xp=xp)
    count = 0
    for q0 in range(0, p.lq, bq):
        q1 = min(q0 + bq, p.lq)
        lo, hi = p.structure.key_range(q0, q1)
        for k0 in range(lo, hi, bk):
            if p.kind(q0, q1, k0, min(k0 + bk, hi)) != EMPTY:
                count += 1
    return count


def group_heads(x: Array, heads: int, *, xp: Namespace) -> Array:
    """A gradient over ``H`` query heads summed back to ``heads`` key/value heads (GQA)."""
    h = x.shape[-3]
    if h == heads:
        return x
    lead, tail = tuple(x.shape[:-3]), tuple(x.shape[-2:])
    grouped = xp.reshape(x, (*lead, heads, h // heads, *tail))
    return xp.sum(grouped, axis=-3)


def shard_mods(p: Problem, variant: Variant, length: int, heads: tuple[int, int]) -> Mods | None:
    """The call's mods for the whole sequence, checked against it (a block mask for ``L``).

    ``heads`` is ``(h0, H)``: this problem's first query head, and how many the call has.
    """
    mods = variant.flex(batch=(p.batch[0], heads[1]), lq=length, lk=length)
    return None if mods is None else mods.shifted(0, heads[0], 0, 0)


def check_ulysses(q: Array, k: Array, world: int, layout: Layout) -> tuple[int, int]:
    """``(H, Hkv)`` of (B, H, L/P, d) shards that Ulysses can re-shard by heads, or an error."""
    h, hkv = int(q.shape[-3]), int(k.shape[-3])
    if q.ndim != 4 or h % world or hkv % world:
        msg = (
            f"strategy='ulysses' needs P={world} to divide the query heads H={h} and the "
            f"key/value heads Hkv={hkv} of (B, H, L/P, d) shards; use strategy='ring'"
        )
        raise ValueError(msg)
    chunk_size(int(q.shape[-2]) * world, world, layout)
    return h, hkv


def ring_setup(
    q: Array, k: Array, v: Array, o: Setup, world: int, rank: int, *, xp: Namespace
) -> tuple[Problem, Schedule]:
    """The shards prepared (dtypes, scale, GQA, the sink) with the call's mods, and the schedule.

    Positions and mods are the whole sequence's: the schedule cuts them per pair.
    """
    n = int(q.shape[-2])
    if o.layout == "zigzag" and n % 2:
        msg = (
            f"layout='zigzag' needs an even shard length (2P chunks in all), got {n} rows per rank"
        )
        raise ValueError(msg)
    p = prepare(q, k, v, o.variant.without_positions(), scale=o.scale, xp=xp)
    length = n * world
    mods = shard_mods(p, o.variant, length, (0, int(q.shape[-3])))
    sched = Schedule(world, rank, o.layout, n, o.variant.structure(length, length), mods)
    return dataclasses.replace(p, variant=dataclasses.replace(p.variant, mods=mods)), sched
