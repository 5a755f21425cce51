"""Blockwise attention with an online softmax (Rabe & Staats 2021; FlashAttention).

Queries are cut into blocks of ``bq`` rows and keys into blocks of ``bk``.
Each query block keeps a running row maximum ``m``, a running sum ``l`` of
``exp(s - m)`` and a running output ``acc``; when a new key block raises the
maximum, the old sum and output are rescaled by ``exp(m_old - m_new)``. The
(Lq, Lk) score matrix is never formed: extra memory is a few (bq, bk) tiles
per batch entry, plus the output.

Key blocks that ``causal``/``window`` hide entirely are never read, which
halves the work for causal attention and keeps causality bit-exact even if
later values are inf. Tiles that nothing hides build no mask at all.

Everything here is plain array API code (it runs on ``array_api_strict``).
The per-tile work is kept to the passes the algorithm needs: one matmul for
the scores, a row max, one subtraction, one ``exp``, a row sum and one matmul
into the accumulator.
"""

from __future__ import annotations

import math

import numpy as np

from .._core._flex import EMPTY, Mods
from .._core._groups import grouped_matmul
from .._core._problem import Problem, empty_result, expand
from .._core._softmax import (
    add_sink,
    exp_floor,
    floored_exp,
    lse_from,
    no_keys,
    nonzero,
    row_shift,
    safe_exp,
)
from .._lib._checks import check_int_pair
from .._lib._compat import (
    device_of,
    host_float,
    is_concrete,
    is_writeable_array,
    namespace_library,
    on_accelerator,
)
from .._lib._threads import map_blocks, pool_workers
from .._lib._typing import Array, Namespace

__all__ = ["block_sizes", "blockwise_attention", "exp_cannot_underflow", "problem_block_sizes"]

# Per library: (key block, elements per score tile, row sums in the matmul).
# The query block is chosen so that one (batch..., bq, bk) score tile holds
# about that many elements. Measured on a 2-core AMD EPYC (AVX2), B=1, H=8,
# d=64, float32, N=512 and 2048 (benchmarks/run.py records the run): torch is
# fastest with tiles of at most 2 MiB, because larger ones fall out of glibc's
# heap and every tile then pays ~1000 page faults for fresh memory (31k
# faults per call at 4 MiB tiles, 0.5k at 2 MiB). NumPy, once its row sums
# ride in the value matmul, is fastest with 2 MiB tiles too (64 x 1024 at
# H=8: 0.78x SDPA against 0.75x with 4 MiB tiles at N=2048, 0.98x against
# 0.87x causal, 15 rounds interleaved): each pool worker's tile then stays
# in cache between its passes. NumPy's row sum is a single-threaded pass
# over the tile that costs more than widening the value matmul by one
# column of ones (see _sum_in_matmul); torch's sum is multi-threaded and
# cheaper than the wider matmul.
_DEFAULTS = {"torch": (512, 1 << 19, False), "numpy": (1024, 1 << 19, True)}
_FALLBACK = (512, 1 << 19, False)
# On a GPU the tiles above are launch-bound: measured on an H200 (torch 2.11,
# CuPy 14.2, B=1, H=8, N=8192, d=64, float32), 128 x 512 tiles took 180 ms
# (torch) and 347 ms (CuPy) against SDPA's 4.1 ms, 11,655 kernel launches
# per call; 1024 x 4096 tiles took 10.7 and 13.7 ms, 2048 x 8192 8.7 and
# 11.4 ms. A tile of 2^25 elements (128 MiB in float32) keeps memory O(N)
# with room on any current GPU.
_ACCELERATOR = (4096, 1 << 25, False)
_QUERY_BLOCK_RANGE = (16, 1024)

# Under a trace (jax.jit, torch.compile, an ndonnx export) the Python loop
# is unrolled: every tile becomes its own operations in the compiled
# program, and compile time grows with the number of tiles (jax.jit at
# N=2048 with 64 tiles: 11 s; N=16384 with default tiles would be 4096).
# There, blocks grow so that each axis has at most this many of them, which
# bounds the program whatever N is; the tiles stay O(N^2 / 64) elements.
_TRACED_BLOCKS_PER_AXIS = 8


def block_sizes(
    block_size: object,
    *,
    xp: Namespace,
    batch: tuple[int, ...] = (),
    device: object = None,
) -> tuple[int, int]:
    """Resolve ``block_size=`` to ``(query_block, key_block)``, with a tuned default per library.

    On a GPU (``device``), the default tiles are larger for every library.
    """
    if block_size is None:
        default = _ACCELERATOR if on_accelerator(device) else None
        bk, tile, _ = default or _DEFAULTS.get(namespace_library(xp), _FALLBACK)
        lo, hi = _QUERY_BLOCK_RANGE
        bq = max(lo, min(hi, tile // (bk * max(1, math.prod(batch)))))
        return 1 << (bq.bit_length() - 1), bk  # a power of two: BLAS-friendly
    return check_int_pair("block_size", block_size, minimum=1)


def blockwise_attention(
    p: Problem, *, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """Output (..., Lq, dv) and log-sum-exp (..., Lq) of ``p``, one query block at a time."""
    bq, bk = problem_block_sizes(p, block_size, xp=xp)
    if p.lk == 0 or p.lq == 0 or math.prod(p.batch) == 0:
        return empty_result(p, xp=xp)
    concrete = is_concrete(p.q)
    # namespace_library, memoised by name: dynamo warns at every call of
    # array-api-compat's functools.lru_cache-wrapped is_*_namespace.
    lib = namespace_library(xp)
    if not concrete and lib != "dask":
        bq, bk = traced_block_sizes(bq, bk, p.lq, p.lk, mods=p.mods)
    k_t = xp.matrix_transpose(p.k)  # (..., d, Lk)
    v = _with_ones_column(p.v, xp=xp) if _sum_in_matmul(p, xp=xp) else p.v
    floor = None if exp_cannot_underflow(p, xp=xp) else exp_floor(p.q.dtype, xp=xp)
    spans = tile_spans(0, p.lq, bq, phase=_phase(p, 0, bq))
    if len(spans) == 1:
        out, lse = _query_block(p, 0, p.lq, k_t, v, bk, floor=floor, xp=xp)
        return expand(out, (*p.batch, p.lq, p.dv), xp=xp), expand(lse, (*p.batch, p.lq), xp=xp)
    # Each block is written into place, which also broadcasts it to the full
    # batch shape (a mask or lengths may carry batch axes the inputs lack).
    # Immutable arrays (JAX) and lazy or traced ones get the blocks
    # concatenated: a graph then keeps the inputs' chunks (dask) and holds no
    # scatter into a fresh buffer. So do blocks that are not concrete while q
    # is: torch.func.vmap over k, v, a bias, a sink or a tensor a mod captures
    # batches them, and a buffer built like q could not take them.
    in_place = concrete and is_writeable_array(p.q)
    out = lse = None
    outs, lses = [], []
    ends = dict(spans)
    starts = [q0 for q0, _ in spans]

    def one(q0: int) -> tuple[Array, Array]:
        return _query_block(p, q0, ends[q0], k_t, v, bk, floor=floor, xp=xp)

    # NumPy only: eager, no autograd, and its ufuncs run on one core (_lib._threads).
    workers = 1
    if lib == "numpy":
        work = math.prod(p.batch) * p.lq * p.lk * (p.q.shape[-1] + p.dv)
        workers = pool_workers(len(starts), work)
    for q0, (out_blk, lse_blk) in zip(
        starts, map_blocks(one, starts, workers=workers), strict=True
    ):
        q1 = ends[q0]
        if in_place and out is None:
            in_place = is_concrete(out_blk)
            if in_place:
                out = xp.empty((*p.batch, p.lq, p.dv), dtype=p.q.dtype, device=p.device)
                lse = xp.empty((*p.batch, p.lq), dtype=p.q.dtype, device=p.device)
        if in_place:
            assert out is not None
            assert lse is not None
            out[..., q0:q1, :] = out_blk
            lse[..., q0:q1] = lse_blk
        else:
            outs.append(expand(out_blk, (*p.batch, q1 - q0, p.dv), xp=xp))
            lses.append(expand(lse_blk, (*p.batch, q1 - q0), xp=xp))
    if out is None or lse is None:
        return xp.concat(outs, axis=-2), xp.concat(lses, axis=-1)
    return out, lse


def tile_spans(lo: int, hi: int, size: int, *, phase: int | None) -> list[tuple[int, int]]:
    """``[t0, t1)`` tiles of ``size`` over ``[lo, hi)``: from ``lo`` on, or (``phase`` given)
    with edges where ``(t + phase) % size == 0``, a block mask's own edges."""
    if phase is None:
        return [(t0, min(t0 + size, hi)) for t0 in range(lo, hi, size)]
    out, t0 = [], lo
    while t0 < hi:
        t1 = min(hi, t0 + size - (t0 + phase) % size)
        out.append((t0, t1))
        t0 = t1
    return out


def _phase(p: Problem, axis: int, size: int) -> int | None:
    """Where a block mask's tile edges fall, for tiles of its own ``size``; ``None`` without one.

    A problem may start inside the call (dask's pair tasks): tiles then
    still start at the mask's edges, so each is one entry of its table and
    an EMPTY one is never read.
    """
    mods = p.mods
    if mods is None or mods.table is None or mods.block[axis] != size:
        return None
    return mods.origin[2 + axis] % size


def problem_block_sizes(
    p: Problem, block_size: tuple[int, int] | None, *, xp: Namespace
) -> tuple[int, int]:
    """:func:`block_sizes`, except that a block mask's own blocks are the default tiles.

    Tiles then line up with the mask's table, so each is one entry of it:
    EMPTY ones are skipped and FULL ones never call ``mask_mod``.
    """
    if block_size is None and p.mods is not None and p.mods.table is not None:
        return p.mods.block
    return block_sizes(block_size, xp=xp, batch=p.batch, device=p.device)


def _sum_in_matmul(p: Problem, *, xp: Namespace) -> bool:
    """Whether each row's sum of weights rides in the value matmul as a column of ones.

    Per library (``_DEFAULTS``), and only for eager arrays with no autograd
    (NumPy's, dask's NumPy chunks): the widened values are a new array that
    a gradient would have to flow through.
    """
    return _DEFAULTS.get(namespace_library(xp), _FALLBACK)[2] and is_concrete(p.v)


def _with_ones_column(v: Array, *, xp: Namespace) -> Array:
    """``v`` (..., Lk, dv) with a column of ones appended: (..., Lk, dv + 1)."""
    ones = xp.ones((*v.shape[:-1], 1), dtype=v.dtype, device=device_of(v))
    return xp.concat([v, ones], axis=-1)


def traced_block_sizes(bq: int, bk: int, lq: int, lk: int, *, mods: Mods | None) -> tuple[int, int]:
    """Blocks for a trace, which unrolls every tile: at most about 8 x 8 tiles visited.

    Blocks grow to at least ``1/8`` of each length. A block mask's own
    tiles are kept while at most 64 of them are visited, so they line up
    with its table and empty ones are never read, as in eager; beyond that
    the blocks grow by whole mask blocks, so each traced tile covers whole
    mask tiles, and its empty ones are masked out as such
    (:meth:`~portattn._core._flex.Mods.tile_allowed`) but read.
    """
    n = _TRACED_BLOCKS_PER_AXIS
    grown = max(bq, -(-lq // n)), max(bk, -(-lk // n))
    if mods is None or mods.table is None or (bq, bk) != mods.block:
        return grown
    if mods.visited(0, lq, 0, lk) <= n * n:
        return bq, bk
    return -(-grown[0] // bq) * bq, -(-grown[1] // bk) * bk


def exp_cannot_underflow(p: Problem, *, xp: Namespace) -> bool:
    """True when no visible score can sit so far below its row's max that ``exp`` underflows.

    By Cauchy-Schwarz, ``|q_i . k_j| <= |q_i| |k_j|``, so within a row the
    visible scores span at most ``2 max|q| max|k|`` plus the spread of the
    bias. When that is below ``-exp_floor`` (about 57 for float32), every
    ``exp(s - max)`` is a normal number and the clamp that
    :func:`~portattn._core._softmax.floored_exp` applies (a ``max`` and a
    subtraction over every tile) changes nothing, so it is skipped. Hidden
    entries are ``-inf``, whose ``exp`` is an exact 0 that raises no flag.
    Costs O((Lq + Lk) d) and two host syncs per call; inf or NaN anywhere
    makes the bound fail, and then the clamp runs. Only
    reads concrete arrays (:func:`~portattn._lib._compat.is_concrete`):
    lazy and traced ones (dask, ndonnx, JAX tracers, torch.compile, meta
    tensors) are never read, and the clamp runs for them.
    """
    if not all(is_concrete(x) for x in (p.q, p.k, p.variant.bias) if x is not None):
        return False
    if p.mods is not None and p.mods.score_mod is not None:
        return False  # a score_mod may move scores anywhere, -inf included
    return _score_spread(p, xp=xp) + 1.0 < -exp_floor(p.q.dtype, xp=xp)


def _score_spread(p: Problem, *, xp: Namespace) -> float:
    """The bound on a row's visible score spread, read on the host (concrete arrays only)."""
    # Only the bound is computed here, so no floating-point flag it could
    # raise (tiny squares underflowing, huge ones overflowing) may escape:
    # either way the bound just fails and the clamp runs.
    try:
        with np.errstate(all="ignore"):
            q_sq = host_float(xp.max(xp.vecdot(p.q, p.q)))  # no (..., L, d) temporary
            k_sq = host_float(xp.max(xp.vecdot(p.k, p.k)))
            bias_spread = 0.0
            bias = p.variant.bias
            if bias is not None and math.prod(bias.shape) > 0:
                bias_spread = host_float(xp.max(bias)) - host_float(xp.min(bias))
    except (RuntimeError, NotImplementedError):  # no values to read (torch "meta" tensors)
        return math.inf  # no bound: the clamp runs
    spread = 2.0 * math.sqrt(q_sq) * math.sqrt(k_sq)
    if p.variant.softcap is not None:
        spread = min(spread, 2.0 * p.variant.softcap)  # soft-capped scores lie in (-cap, cap)
    # The caller adds a margin of 1 for rounding in the matmul and the
    # subtraction; NaN (from inf or NaN inputs) fails its comparison, as it should.
    return spread + bias_spread


def _subtract_in_place(s: Array, shift: Array) -> Array:
    """``s - shift`` written into ``s``: a tile nothing else holds (see :func:`_query_block`)."""
    s -= shift
    return s


def _query_block(
    p: Problem,
    q0: int,
    q1: int,
    k_t: Array,
    v: Array,
    bk: int,
    *,
    floor: float | None,
    xp: Namespace,
) -> tuple[Array, Array]:
    """Online softmax over the key blocks that ``[q0, q1)`` may see.

    ``v`` is the values, or (:func:`_sum_in_matmul`) the values with a
    column of ones appended, whose product column then carries each row's
    sum of weights through the same matmul and the same rescaling.
    ``floor is None`` means the scores are proven finite and their spread
    within a row small (:func:`exp_cannot_underflow`): ``exp`` then needs no
    clamp anywhere, and a tile that hides nothing has a finite row max.
    """
    qb = p.q[..., q0:q1, :]  # (..., bq, d)
    lo, hi = p.structure.key_range(q0, q1)
    ones_column = v.shape[-1] > p.dv
    m = total = acc = None
    # The row max may be subtracted in place on real, writeable tiles that
    # autograd has not saved (checked per tile: s.requires_grad).
    mutable = is_concrete(qb) and is_writeable_array(qb)
    # A score_mod's result may be a read-only broadcast, or an array it
    # captured: the tile is ours to overwrite only once xp.where made it anew.
    foreign = p.mods is not None and p.mods.score_mod is not None
    for k0, k1 in tile_spans(lo, hi, bk, phase=_phase(p, 1, bk)):
        kind = p.kind(q0, q1, k0, k1)
        if kind == EMPTY:  # the block mask hides the tile: its keys are never read
            continue
        s = p.scores(qb, k_t[..., k0:k1], q0, q1, k0, k1, xp=xp)  # (..., bq, bk)
        allowed = p.allowed(q0, q1, k0, k1, xp=xp)
        if allowed is not None:
            s = xp.where(allowed, s, -math.inf)
        tile_max = xp.max(s, axis=-1, keepdims=True)  # (..., bq, 1)
        m_new = tile_max if m is None else xp.maximum(m, tile_max)
        # A row that has seen nothing yet keeps m = -inf (only possible when
        # something hides pairs, or when the scores are not proven finite).
        hides = floor is not None or allowed is not None
        shift = row_shift(m_new, xp=xp) if hides else m_new
        # In place only on a tile autograd cannot have saved (it may keep s
        # for the row max's gradient): NumPy's, or a tensor needing no grad.
        scratch = mutable and not (foreign and allowed is None)
        scratch = scratch and not getattr(s, "requires_grad", False)
        s = _subtract_in_place(s, shift) if scratch else s - shift
        # exp may only see values it can take without an underflow flag
        # (see _softmax.exp_floor); floor is None when a bound proves it.
        e = xp.exp(s) if floor is None else floored_exp(s, floor, xp=xp, overwrite=scratch)
        ev = grouped_matmul(e, v[..., k0:k1, :], p.groups, xp=xp)  # (..., bq, dv[+1])
        if m is None:
            acc = ev
            if not ones_column:
                total = xp.sum(e, axis=-1, keepdims=True)  # (..., bq, 1)
        else:
            # rescales what earlier key blocks contributed; (..., bq, 1), so cheap
            diff = m - shift
            alpha = xp.exp(diff) if floor is None else safe_exp(diff, floor, xp=xp)
            acc = acc * alpha + ev
            if not ones_column:
                total = total * alpha + xp.sum(e, axis=-1, keepdims=True)
        m = m_new
    if m is None:  # positions or the block mask hide every key from this query block
        out, lse = no_keys(p.batch, q1 - q0, p.dv, dtype=p.q.dtype, device=p.device, xp=xp)
        if p.sink is not None:  # the sink is the row's only logit
            lse = expand(p.sink[..., 0], (*p.batch, q1 - q0), xp=xp)
        return out, lse
    assert acc is not None
    if ones_column:
        acc, total = acc[..., : p.dv], acc[..., p.dv :]
    assert total is not None
    if p.sink is not None:
        acc, total, m = add_sink(acc, total, m, p.sink, xp=xp)
    out = acc / nonzero(total, xp=xp)
    return out, lse_from(m, total, xp=xp)
