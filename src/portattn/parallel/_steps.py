"""One rank's share of ring attention, per source rank: forward merges, backward gradients.

Written against the array API: the communication (torch.distributed, JAX
collectives) lives in the adapters, which hand these functions the key/value
shard of one source rank at a time.

Forward, the pairs of this rank's query chunks with ``src``'s key chunks run
the blockwise kernel and are merged by log-sum-exp into running
accumulators; a sink is folded in once at the end, as one more logit per row.

Backward, each pair runs :func:`~portattn._grad._backward.blockwise_backward`
with the *whole* call's output and lse for its rows (what FlashAttention-2's
backward needs: ``P = exp(s - lse)`` and ``D = rowsum(dO ∘ O)`` are global
row facts), so the gradients of the pairs add up to the exact gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .._core._merge import merge_attention
from .._core._problem import Problem
from .._core._softmax import no_keys, row_shift
from .._grad._backward import ScoreVjp, blockwise_backward, sink_grad
from .._lib._typing import Array, Namespace
from .._paths._blockwise import blockwise_attention as plain_blockwise
from ._schedule import Schedule, Stats, group_heads, pair_problem, tiles_of

__all__ = [
    "Call",
    "add_captures",
    "assemble",
    "backward_source",
    "d_sink",
    "fold_sink",
    "forward_source",
]

Partial = tuple[Array, Array] | None


@dataclass
class Call:
    """What every step of one call reads: schedule, the validated problem (arrays aside), knobs."""

    schedule: Schedule
    base: Problem  # prepare's problem on the local shards: options, batch, dtypes, device
    block_size: tuple[int, int] | None
    stats: Stats
    d: int  # key feature size: a key/value buffer is k and v side by side along the last axis
    hkv: int  # key/value heads


Kernel = Callable[[Problem], tuple[Array, Array]]


def forward_source(
    c: Call,
    src: int,
    q: Array,
    kv: Array,
    acc: list[Partial],
    *,
    kernel: Kernel | None = None,
    xp: Namespace,
) -> list[Partial]:
    """Merge the pairs of this rank's queries with ``src``'s keys ``kv`` into ``acc``.

    ``kernel`` runs one pair; by default the blockwise forward, untracked
    (torch's backward is this module's); JAX passes its differentiable one.
    """
    for pair in c.schedule.pairs(src, c.stats):
        (qa, qb), (ka, kb) = pair.q_rows, pair.k_rows
        k, v = kv[..., ka:kb, : c.d], kv[..., ka:kb, c.d :]
        p = pair_problem(c.base, pair, q[..., qa:qb, :], k, v, xp=xp)
        tiles = tiles_of(p, c.block_size, xp=xp)
        c.stats.pairs += 1
        c.stats.tiles += tiles
        c.stats.per_source[src] = c.stats.per_source.get(src, 0) + tiles
        if kernel is None:
            o, lse = plain_blockwise(p, block_size=c.block_size, xp=xp)
        else:
            o, lse = kernel(p)
        prev = acc[pair.q_chunk]
        acc[pair.q_chunk] = (
            (o, lse) if prev is None else merge_attention([prev[0], o], [prev[1], lse])
        )
    return acc


def assemble(c: Call, acc: list[Partial], dv: int, *, xp: Namespace) -> tuple[Array, Array]:
    """The merged chunks as the shard's output and lse; a chunk no key reached is 0 and -inf."""
    outs, lses = [], []
    for part, (_, _, rows) in zip(acc, c.schedule.chunks(c.schedule.rank), strict=True):
        if part is None:
            base = c.base
            part = no_keys(base.batch, rows, dv, dtype=base.q.dtype, device=base.device, xp=xp)
        outs.append(part[0])
        lses.append(part[1])
    if len(outs) == 1:
        return outs[0], lses[0]
    return xp.concat(outs, axis=-2), xp.concat(lses, axis=-1)


def fold_sink(out: Array, lse: Array, sink: Array, *, xp: Namespace) -> tuple[Array, Array]:
    """One more logit per row, of value 0 (``sink``, a column): a merge with a zero output."""
    col = xp.broadcast_to(sink[..., 0], tuple(lse.shape))  # (..., 1): the batch axes
    return merge_attention([out, xp.zeros_like(out)], [lse, col])


def d_sink(
    sink: Array, out: Array, lse: Array, d_out: Array, d_lse: Array | None, *, xp: Namespace
) -> Array:
    """The gradient of the ``sink`` column from this rank's rows (``dSink = -Σ P_sink · D``)."""
    delta = xp.sum(d_out * out, axis=-1, keepdims=True)  # (..., n, 1)
    if d_lse is not None:
        delta = delta - d_lse[..., None]
    return sink_grad(sink, delta, row_shift(lse, xp=xp)[..., None], xp=xp)


@dataclass
class Cotangents:
    """This rank's rows of the forward's results and of their cotangents."""

    q: Array
    out: Array
    lse: Array
    d_out: Array
    d_lse: Array | None


def backward_source(
    c: Call,
    src: int,
    t: Cotangents,
    kv: Array,
    vjp: Callable[[Problem], ScoreVjp] | None,
    *,
    xp: Namespace,
) -> tuple[list[tuple[tuple[int, int], Array]], Array, list[Array]]:
    """The gradients of the pairs with ``src``'s keys: ``dq`` per row range, ``d(kv)``, captures."""
    dkv = xp.zeros_like(kv)
    dq: list[tuple[tuple[int, int], Array]] = []
    caps: list[Array] = []
    for pair in c.schedule.pairs(src):
        (qa, qb), (ka, kb) = pair.q_rows, pair.k_rows
        k, v = kv[..., ka:kb, : c.d], kv[..., ka:kb, c.d :]
        p = pair_problem(c.base, pair, t.q[..., qa:qb, :], k, v, xp=xp)
        c.stats.backward_pairs += 1
        g = blockwise_backward(
            p,
            t.out[..., qa:qb, :],
            t.lse[..., qa:qb],
            t.d_out[..., qa:qb, :],
            None if t.d_lse is None else t.d_lse[..., qa:qb],
            block_size=c.block_size,
            want_bias=False,
            score_vjp=None if vjp is None else vjp(p),
            xp=xp,
        )
        dq.append(((qa, qb), g.q))
        grads = xp.concat([group_heads(g.k, c.hkv, xp=xp), group_heads(g.v, c.hkv, xp=xp)], axis=-1)
        dkv = _add_rows(dkv, ka, kb, grads, xp=xp)
        caps = add_captures(caps, g.captures)
    return dq, dkv, caps


def _add_rows(x: Array, a: int, b: int, part: Array, *, xp: Namespace) -> Array:
    """``x`` with ``part`` added to rows ``[a, b)`` (a new array: JAX arrays are immutable)."""
    pieces = [x[..., :a, :], x[..., a:b, :] + part, x[..., b:, :]]
    return xp.concat([y for y in pieces if y.shape[-2]], axis=-2)


def add_captures(total: list[Array], part: list[Array]) -> list[Array]:
    """Running sums of the captured arrays' gradients; ``[]`` means none yet (or none here)."""
    if not part:
        return total
    if not total:
        return list(part)
    return [a + b for a, b in zip(total, part, strict=True)]
