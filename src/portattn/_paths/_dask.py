"""Attention on Dask arrays: a task per chunk, and sequence parallelism by exact merges.

:func:`~portattn.attention` sends dask arrays here once :func:`prepare` has
validated them (lazily: nothing is computed). The schedule is a graph of
three kinds of task, built with dask's public ``HighLevelGraph`` and
``dask.array.Array``:

- **pair** ``(attention-pair-<token>, *batch_block, i, j)``: query chunk ``i``
  against key chunk ``j`` of one batch block, run by portattn's own kernel on
  the chunks' arrays (NumPy, CuPy, ...) and returning a partial output and its
  log-sum-exp. Pairs that ``causal``/``window`` hide entirely get no task:
  :meth:`Structure.key_range` says which key chunks a query chunk may see.
- **merge** ``(attention-merge-<token>, *batch_block, i, level, g)``: a tree
  reduction of those partials with :func:`~portattn.merge_attention`, at most
  :data:`FAN_IN_CONFIG` of them per task. The merge is exact:
  ``o = sum_c exp(l_c - l) o_c`` with ``l = log sum_c exp(l_c)``.
- the output chunks, which follow the query's chunks (batch axes and ``Lq``);
  with one key chunk the pair task writes the output chunk itself, so batch
  and head parallelism costs one task per chunk.

The reduction's fan-in is the only knob, and it lives in dask's own
configuration, ``dask.config.set({"portattn.merge-fan-in": 8})``.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from typing import Any

import dask
import dask.array
import dask.array.utils
import dask.base
import dask.highlevelgraph

from .._core._flex import EMPTY
from .._core._masks import Structure
from .._core._merge import merge_attention
from .._core._problem import Problem, Variant, expand
from .._core._softmax import no_keys
from .._core._variant import SINK
from .._lib._compat import array_namespace, device_of, namespace_library
from .._lib._typing import Array, Namespace
from ._auto import auto_impl
from ._blockwise import blockwise_attention
from ._materialize import materialize_attention

# dask's own annotations are partial; its objects are used as Any here.
da: Any = dask.array
meta_from_array: Any = dask.array.utils.meta_from_array
tokenize: Any = dask.base.tokenize
HighLevelGraph: Any = dask.highlevelgraph.HighLevelGraph

__all__ = [
    "DEFAULT_FAN_IN",
    "FAN_IN_CONFIG",
    "MERGE_PREFIX",
    "PAIR_PREFIX",
    "dask_attention",
    "visible_pairs",
]

#: ``dask.config`` key for how many partial results one merge task combines.
FAN_IN_CONFIG = "portattn.merge-fan-in"
#: Used when the key is not set: a depth of log4(key chunks) merges, each cheap.
DEFAULT_FAN_IN = 4
#: Key names of the tasks, so tests and the docs can find them in the graph.
PAIR_PREFIX = "attention-pair-"
MERGE_PREFIX = "attention-merge-"


def _fan_in() -> int:
    value = dask.config.get(FAN_IN_CONFIG, DEFAULT_FAN_IN)
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        msg = f"expected dask config {FAN_IN_CONFIG!r} to be an int >= 2, got {value!r}"
        raise ValueError(msg)
    return value


def _starts(chunks: tuple[int, ...]) -> list[int]:
    out, pos = [], 0
    for c in chunks:
        out.append(pos)
        pos += c
    return out


def visible_pairs(
    structure: Structure, q_chunks: tuple[int, ...], k_chunks: tuple[int, ...]
) -> Iterator[tuple[int, int]]:
    """The (query chunk, key chunk) pairs in which positions allow at least one pair.

    ``key_range`` of a query chunk is the union of its rows' ranges, which is
    one interval, so every chunk it meets holds a visible pair: the pairs
    skipped are exactly those ``causal``/``window`` hide entirely.
    """
    k_starts = _starts(k_chunks)
    for i, q0 in enumerate(_starts(q_chunks)):
        lo, hi = structure.key_range(q0, q0 + q_chunks[i])
        for j, k0 in enumerate(k_starts):
            k1 = k0 + k_chunks[j]
            if k0 < hi and k1 > lo and k1 > k0:
                yield i, j


@dataclass(frozen=True)
class _Tile:
    """What a pair task needs besides its chunks (small and picklable)."""

    index: tuple[int, int]  # (query chunk, key chunk): how tests and the docs read the grid
    structure: Structure  # positions of the tile, in its own coordinates
    q0: int  # where the chunks start in the whole sequences
    k0: int
    batch: tuple[int, ...]  # the output chunk's batch shape
    impl: str
    block_size: tuple[int, int] | None
    variant: Variant  # the call's variant without its arrays
    options: tuple[str, ...]  # the variant's arrays that the task's option chunks are, in order
    with_sink: bool = True  # one pair per query chunk adds the sink, so the merge counts it once
    groups: int = 1  # query heads per key/value head: the chunks keep the call's grouping


def _pair(q: Array, k: Array, v: Array, options: list[Array], tile: _Tile, final: bool) -> Any:
    """Attention of one query chunk over one key chunk: ``(out, lse)``, or ``out`` if final."""
    xp = array_namespace(q, k, v, *options)
    variant = tile.variant.with_arrays(zip(tile.options, options, strict=True))
    if not tile.with_sink:
        variant = variant.without_sink()
    p = Problem(
        q=q,
        k=k,
        v=v,
        variant=variant.from_offset(tile.q0, tile.k0),
        structure=tile.structure,
        batch=tile.batch,
        out_dtype=q.dtype,
        device=device_of(q),
        scale=1.0,  # prepare already scaled q
        groups=tile.groups,
    )
    out, lse = _kernel(p, impl=tile.impl, block_size=tile.block_size, xp=xp)
    return out if final else (out, lse)


def _kernel(
    p: Problem, *, impl: str, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    if impl == "auto":  # the entry's rule, on the chunks' own library; the merge needs the lse
        impl = auto_impl(p, lib=namespace_library(xp), want_lse=True, xp=xp)
    if impl == "materialize":
        out, lse = materialize_attention(p, want_lse=True, xp=xp)
        assert lse is not None
    else:
        out, lse = blockwise_attention(p, block_size=block_size, xp=xp)
    return expand(out, (*p.batch, p.lq, p.dv), xp=xp), expand(lse, (*p.batch, p.lq), xp=xp)


def _merge(parts: list[tuple[Array, Array]], final: bool) -> Any:
    out, lse = merge_attention([o for o, _ in parts], [x for _, x in parts])
    return out if final else (out, lse)


def _hidden(q: Array, batch: tuple[int, ...], dv: int, final: bool, sink: Any = None) -> Any:
    """A query chunk that sees no key at all: output 0, lse -inf (or the sink, its only logit)."""
    xp = array_namespace(q)
    out, lse = no_keys(batch, int(q.shape[-2]), dv, dtype=q.dtype, device=device_of(q), xp=xp)
    if sink is not None:
        lse = expand(sink[..., None], tuple(lse.shape), xp=xp)
    return out if final else (out, lse)


def _shifted(variant: Variant, origin: tuple[int, ...], q0: int, k0: int) -> Variant:
    """``variant`` whose mods see the tile's absolute positions: batch, head, query, key."""
    assert variant.mods is not None
    mods = variant.mods.shifted(origin[0], origin[1], q0, k0)
    return dataclasses.replace(variant, mods=mods)


def _lift(x: Any, ndim: int) -> Any:
    """Prepend unit axes so that ``x`` has ``ndim`` dimensions."""
    return x if x.ndim == ndim else x[(None,) * (ndim - x.ndim)]


@dataclass(frozen=True)
class _Grid:
    """The problem's arrays as dask arrays, chunked on the output's grid."""

    q: Any
    k: Any
    v: Any
    options: dict[str, Any]  # the problem's array options present, by field name
    batch_chunks: tuple[tuple[int, ...], ...]
    q_chunks: tuple[int, ...]
    k_chunks: tuple[int, ...]

    def arrays(self) -> list[Any]:
        return [self.q, self.k, self.v, *self.options.values()]

    def block(self, x: Any, bb: tuple[int, ...], *tail: int) -> Any:
        """The key of ``x``'s block for batch block ``bb`` (block 0 where it broadcasts)."""
        nb = len(self.batch_chunks)
        head = tuple(b if x.numblocks[a] > 1 else 0 for a, b in enumerate(bb))
        seq = tuple(t if x.numblocks[nb + n] > 1 else 0 for n, t in enumerate(tail))
        return (x.name, *head, *seq)

    def option_blocks(self, bb: tuple[int, ...], i: int, j: int) -> list[Any]:
        """The keys of every option's block for query chunk ``i`` and key chunk ``j``."""
        return [
            self.block(x, bb, i, j)
            if Variant.ARRAYS[name].layout == "scores"
            else self.block(x, bb)
            for name, x in self.options.items()
        ]


def _grid(p: Problem) -> _Grid:
    """Lift and rechunk ``p``'s arrays so that their blocks line up with the output's chunks."""
    nb = len(p.batch)
    q, k, v = (_lift(da.asarray(x), nb + 2) for x in (p.q, p.k, p.v))
    options = {name: da.asarray(x) for name, x in p.variant.arrays()}

    # Output chunks: each batch axis is chunked as the first operand that
    # has its full size there (the query, unless it broadcasts); Lq as q.
    everyone = [q, k, v, *options.values()]
    batch_chunks: list[tuple[int, ...]] = []
    for a, size in enumerate(p.batch):
        src = next((x for x in everyone if x.shape[a] == size and size != 1), None)
        batch_chunks.append((size,) if src is None else tuple(src.chunks[a]))
    q_chunks, k_chunks = tuple(q.chunks[-2]), tuple(k.chunks[-2])
    kv_chunks = list(batch_chunks)
    if p.groups > 1:  # a chunk of heads holds whole groups, and its keys' heads
        batch_chunks[-1] = _whole_groups(batch_chunks[-1], p.groups)
        kv_chunks[-1] = tuple(c // p.groups for c in batch_chunks[-1])

    def fit(x: Any, tail: tuple[tuple[int, ...], ...], chunks: list[Any] = batch_chunks) -> Any:
        """Rechunk ``x`` to the output's batch chunks (1 where it broadcasts) and ``tail``."""
        head = tuple(chunks[a] if x.shape[a] != 1 else (1,) for a in range(nb))
        return x.rechunk(head + tail)

    def seq_axis(x: Any, axis: int, chunks: tuple[int, ...]) -> tuple[int, ...]:
        return (1,) if x.shape[axis] == 1 and sum(chunks) != 1 else chunks

    for name, x in options.items():
        scores = Variant.ARRAYS[name].layout == "scores"
        seq = (seq_axis(x, -2, q_chunks), seq_axis(x, -1, k_chunks)) if scores else ()
        options[name] = fit(x, seq)
    return _Grid(
        fit(q, (q_chunks, (q.shape[-1],))),
        fit(k, (k_chunks, (k.shape[-1],)), kv_chunks),
        fit(v, (k_chunks, (v.shape[-1],)), kv_chunks),
        options,
        tuple(batch_chunks),
        q_chunks,
        k_chunks,
    )


def _whole_groups(chunks: tuple[int, ...], groups: int) -> tuple[int, ...]:
    """``chunks`` of the query's heads merged until each ends on a group's edge."""
    out, run = [], 0
    for c in chunks:
        run += c
        if run % groups == 0:
            out.append(run)
            run = 0
    return tuple(out)


def _reduce(
    dsk: dict[Any, Any], partials: list[Any], *, name: str, at: tuple[int, ...], fan_in: int
) -> list[Any]:
    """Merge ``partials`` in a tree of at most ``fan_in`` per task, until ``fan_in`` are left."""
    level = 0
    while len(partials) > fan_in:
        groups = [partials[g : g + fan_in] for g in range(0, len(partials), fan_in)]
        partials = []
        for g, group in enumerate(groups):
            if len(group) == 1:
                partials.append(group[0])
                continue
            mkey = (name, *at, level, g)
            dsk[mkey] = (_merge, list(group), False)
            partials.append(mkey)
        level += 1
    return partials


@dataclass(frozen=True)
class _Names:
    """The names of one call's task families, from a token of everything the graph depends on."""

    token: str

    @property
    def pair(self) -> str:
        return PAIR_PREFIX + self.token

    @property
    def merge(self) -> str:
        return MERGE_PREFIX + self.token

    @property
    def out(self) -> str:
        return "attention-out-" + self.token

    @property
    def lse(self) -> str:
        return "attention-lse-" + self.token

    @property
    def final(self) -> str:
        return "attention-final-" + self.token


def _tasks(
    p: Problem,
    g: _Grid,
    names: _Names,
    *,
    impl: str,
    block_size: tuple[int, int] | None,
    return_lse: bool,
    fan_in: int,
) -> dict[Any, Any]:
    """Every task of the graph: pairs, merges, and the output chunks (with their lse)."""
    visits = _visits(p, g)
    static = p.variant.without_arrays()
    q_starts, k_starts = _starts(g.q_chunks), _starts(g.k_chunks)
    batch_starts = [_starts(c) for c in g.batch_chunks]
    dsk: dict[Any, Any] = {}
    for bb in product(*(range(len(c)) for c in g.batch_chunks)):
        batch = tuple(g.batch_chunks[a][b] for a, b in enumerate(bb))
        origin = tuple(batch_starts[a][b] for a, b in enumerate(bb))
        for i, q0 in enumerate(q_starts):
            tiles = []
            for j in visits[i]:
                k0 = k_starts[j]
                s = p.structure
                tiles.append(
                    _Tile(
                        index=(i, j),
                        structure=Structure(
                            g.q_chunks[i], g.k_chunks[j], s.offset + q0 - k0, s.causal, s.window
                        ),
                        q0=q0,
                        k0=k0,
                        batch=batch,
                        impl=impl,
                        block_size=block_size,
                        variant=static if p.mods is None else _shifted(static, origin, q0, k0),
                        options=tuple(g.options),
                        with_sink=j == visits[i][0],
                        groups=p.groups,
                    )
                )
            _emit(dsk, g, names, (*bb, i), tiles, dv=p.dv, return_lse=return_lse, fan_in=fan_in)
    return dsk


def _visits(p: Problem, g: _Grid) -> dict[int, list[int]]:
    """The plan: the key chunks each query chunk reads, those positions and the block mask show."""
    q_starts, k_starts = _starts(g.q_chunks), _starts(g.k_chunks)
    visits: dict[int, list[int]] = {i: [] for i in range(len(g.q_chunks))}
    for i, j in visible_pairs(p.structure, g.q_chunks, g.k_chunks):
        q0, k0 = q_starts[i], k_starts[j]
        if p.kind(q0, q0 + g.q_chunks[i], k0, k0 + g.k_chunks[j]) != EMPTY:  # the block mask's
            visits[i].append(j)
    return visits


def _emit(
    dsk: dict[Any, Any],
    g: _Grid,
    names: _Names,
    at: tuple[int, ...],
    tiles: list[_Tile],
    *,
    dv: int,
    return_lse: bool,
    fan_in: int,
) -> None:
    """The tasks of one output chunk ``at`` (batch chunks, query chunk): its pairs, merged."""
    bb, i = at[:-1], at[-1]
    final_key = (names.out, *at, 0) if not return_lse else (names.final, *at)
    partials = []
    for tile in tiles:
        j = tile.index[1]
        # A query chunk that sees one key chunk needs no merge: its
        # pair task is the output chunk (one task per chunk).
        alone = len(tiles) == 1
        pkey = final_key if alone else (names.pair, *at, j)
        dsk[pkey] = (
            _pair,
            g.block(g.q, bb, i, 0),
            g.block(g.k, bb, j, 0),
            g.block(g.v, bb, j, 0),
            g.option_blocks(bb, i, j),
            tile,
            alone and not return_lse,
        )
        partials.append(pkey)
    if not partials:
        sink = g.options.get(SINK)
        sink_key = None if sink is None else g.block(sink, bb)
        batch = tuple(g.batch_chunks[a][b] for a, b in enumerate(bb))
        dsk[final_key] = (_hidden, g.block(g.q, bb, i, 0), batch, dv, not return_lse, sink_key)
    elif len(partials) > 1:
        partials = _reduce(dsk, partials, name=names.merge, at=at, fan_in=fan_in)
        dsk[final_key] = (_merge, partials, not return_lse)
    if return_lse:
        out_key = (names.out, *at, 0)
        dsk[out_key] = (operator.getitem, final_key, 0)


def dask_attention(
    p: Problem,
    *,
    impl: str,
    block_size: tuple[int, int] | None,
    return_lse: bool,
) -> tuple[Array, Array | None]:
    """Output (..., Lq, dv) and, if asked, lse (..., Lq) of ``p`` as lazy dask arrays.

    ``p`` holds dask arrays; nothing is computed here. Output chunks follow
    the query's chunks along the batch axes and ``Lq``.
    """
    if impl in ("native", "invariant"):  # invariant: chunks merged by lse are not
        msg = (
            f"impl={impl!r} does not run on the chunks of dask arrays; "
            "use impl='auto', 'blockwise' or 'materialize'"
        )
        raise NotImplementedError(msg)
    fan_in = _fan_in()
    g = _grid(p)
    # Everything the graph depends on goes into its name (dask's convention).
    token = tokenize(
        "portattn",
        *g.arrays(),
        tuple(g.options),
        p.structure,
        p.variant.without_arrays(),
        impl,
        block_size,
        return_lse,
        fan_in,
    )
    names = _Names(token)
    dsk = _tasks(
        p, g, names, impl=impl, block_size=block_size, return_lse=return_lse, fan_in=fan_in
    )
    graph = HighLevelGraph.from_collections(names.out, dsk, dependencies=g.arrays())
    ndim, dtype = len(p.batch) + 2, g.q.dtype
    out = da.Array(
        graph,
        names.out,
        (*g.batch_chunks, g.q_chunks, (p.dv,)),
        meta=meta_from_array(g.q._meta, ndim=ndim, dtype=dtype),
    )
    if not return_lse:
        return out, None
    lse_dsk = {
        (names.lse, *bb, i): (operator.getitem, (names.final, *bb, i), 1)
        for bb in product(*(range(len(c)) for c in g.batch_chunks))
        for i in range(len(g.q_chunks))
    }
    lse_graph = HighLevelGraph.from_collections(names.lse, lse_dsk, dependencies=[out])
    lse = da.Array(
        lse_graph,
        names.lse,
        (*g.batch_chunks, g.q_chunks),
        meta=meta_from_array(g.q._meta, ndim=ndim - 1, dtype=dtype),
    )
    return out, lse
