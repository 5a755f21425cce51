"""Context parallelism on ``torch.distributed``: ring and all-gather, and DeepSpeed-Ulysses.

Imported only for torch tensors. Nothing here assumes a backend: gloo on
CPU is what the tests run, and the same calls (``batch_isend_irecv``,
``all_gather``, ``all_to_all_single``) are NCCL's too (untested here).

Ring and all-gather are one :class:`torch.autograd.Function`,
:class:`ContextParallel`, whose backward is the ring-flash-attention one:
each rank keeps its own ``dQ``, and the ``dK``/``dV`` accumulators of every
key shard travel the ring with that shard, gathering each rank's share, until
they arrive back at their owner. All-gather sends the same shards at once,
and returns the gradients with one all-to-all.

A rank that dies makes the others' waits fail within the process group's
timeout (``init_process_group(timeout=...)``); gloo usually notices a closed
connection at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from .._core._prepare import prepare
from .._core._problem import Problem
from .._grad._autodiff import blockwise_attention
from .._grad._backward import ScoreVjp
from .._grad._torch import captured_tensors, score_vjp
from .._lib._precision import narrow
from .._lib._typing import Array, Namespace
from ._layout import Layout, shard, unshard
from ._options import Setup
from ._schedule import Stats, check_ulysses, ring_setup, shard_mods, tiles_of
from ._steps import (
    Call,
    Cotangents,
    add_captures,
    assemble,
    backward_source,
    d_sink,
    fold_sink,
    forward_source,
)

__all__ = ["ContextParallel", "torch_attention"]


def _members(group: Any) -> tuple[Any, int, int]:
    """The group (``None``: the default one), this process's rank in it and its size."""
    if not dist.is_available() or not dist.is_initialized():
        msg = (
            "portattn.parallel.attention on torch tensors needs an initialised process group "
            "(torch.distributed.init_process_group), got none"
        )
        raise RuntimeError(msg)
    g = dist.group.WORLD if group is None else group
    rank = dist.get_rank(g)
    if rank < 0:
        msg = (
            "expected group to be a torch.distributed group this process belongs to, "
            "got one it does not"
        )
        raise ValueError(msg)
    return g, rank, dist.get_world_size(g)


def _same_shapes(group: Any, world: int, q: Array, k: Array, v: Array) -> None:
    """Every rank's shards must have one shape: one small all-gather, refused with all of them."""
    if world == 1:
        return
    mine = torch.tensor([*q.shape, *k.shape, *v.shape], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    if any(not torch.equal(x, mine) for x in every):
        nq = q.ndim
        rows = [int(x[nq - 2]) for x in every]
        shapes = [tuple(int(n) for n in x[:nq]) for x in every]
        msg = (
            "expected every rank's shards to have one shape (the sequence cut evenly), got "
            f"query shard lengths {rows} by rank (query shapes {shapes})"
        )
        raise ValueError(msg)


class _Exchange:
    """How key/value shards reach this rank: around the ring, or gathered at once."""

    def __init__(self, group: Any, rank: int, world: int, strategy: str, stats: Stats) -> None:
        self.group, self.rank, self.world, self.ring = group, rank, world, strategy == "ring"
        self.stats = stats
        self.next = dist.get_global_rank(group, (rank + 1) % world)
        self.prev = dist.get_global_rank(group, (rank - 1) % world)

    def start(
        self, send: Array, *, backward: bool = False, tag: int = 0
    ) -> tuple[Array, list[Any]]:
        """Send ``send`` to the next rank and receive the previous rank's (asynchronous).

        ``tag`` 1 marks a gradient accumulator, which may be in flight beside a shard.
        """
        recv = torch.empty_like(send)
        ops = [
            dist.P2POp(dist.isend, send, self.next, self.group, tag),
            dist.P2POp(dist.irecv, recv, self.prev, self.group, tag),
        ]
        self._count(send, backward)
        return recv, list(dist.batch_isend_irecv(ops))

    def _count(self, x: Array, backward: bool, copies: int = 1) -> None:
        n = x.numel() * x.element_size() * copies
        if backward:
            self.stats.backward_bytes_sent += n
        else:
            self.stats.bytes_sent += n

    @staticmethod
    def wait(works: list[Any]) -> None:
        for w in works:
            w.wait()  # bounded by the process group's timeout

    def sources(self, kv: Array, *, backward: bool = False) -> Iterator[tuple[int, Array]]:
        """``(src, src's kv)`` for src = rank, rank-1, ...: the ring overlaps the next transfer."""
        if not self.ring:
            parts = self.gather(kv, backward=backward)
            for t in range(self.world):
                src = (self.rank - t) % self.world
                yield src, parts[src]
            return
        buf = kv
        for t in range(self.world):
            works: list[Any] = []
            if t < self.world - 1:
                nxt, works = self.start(buf, backward=backward)
            yield (self.rank - t) % self.world, buf
            if works:
                self.wait(works)
                buf = nxt

    def gather(self, kv: Array, *, backward: bool = False) -> list[Array]:
        if self.world == 1:
            return [kv]
        parts = [torch.empty_like(kv) for _ in range(self.world)]
        dist.all_gather(parts, kv.contiguous(), group=self.group)
        self._count(kv, backward, self.world - 1)
        return parts

    def scatter_sum(self, grads: list[Array]) -> Array:
        """Each source's gradient back to its owner, summed there in rank order (all-to-all)."""
        if self.world == 1:
            return grads[0]
        send = torch.stack(grads)  # (P, ...): row s goes to rank s
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        self._count(grads[0], True, self.world - 1)
        total = recv[0]
        for s in range(1, self.world):
            total = total + recv[s]
        return total


@dataclasses.dataclass
class _Frame:
    call: Call
    exchange: _Exchange
    xp: Namespace
    captures: int  # how many captured tensors follow the sink among the inputs


class ContextParallel(torch.autograd.Function):
    """Ring / all-gather attention of this rank's shard; inputs are ``prepare``'s arrays."""

    @staticmethod
    def forward(
        ctx: Any, f: _Frame, q: Array, k: Array, v: Array, sink: Array | None, *captures: Array
    ) -> tuple[Array, Array]:
        c, xp = f.call, f.xp
        kv = torch.cat([k, v], dim=-1).contiguous()  # one message per step
        acc: list[Any] = [None] * len(c.schedule.chunks(c.schedule.rank))
        for src, buf in f.exchange.sources(kv):
            acc = forward_source(c, src, q, buf, acc, xp=xp)
        out, lse = assemble(c, acc, v.shape[-1], xp=xp)
        if sink is not None:
            out, lse = fold_sink(out, lse, sink, xp=xp)
        ctx.save_for_backward(q, k, v, sink, out, lse, *captures)
        ctx.frame = f
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: Array | None, d_lse: Array | None) -> tuple[Any, ...]:
        f: _Frame = ctx.frame
        q, k, v, sink, out, lse, *caps = ctx.saved_tensors
        if d_out is None:
            d_out = torch.zeros_like(out)
        t = Cotangents(q, out, lse, d_out, d_lse)
        dq, dkv, d_caps = _ring_backward(f, t, torch.cat([k, v], dim=-1).contiguous(), caps)
        d = k.shape[-1]
        d_s = None if sink is None else d_sink(sink, out, lse, d_out, d_lse, xp=f.xp)
        d_caps = d_caps or [torch.zeros_like(x) for x in caps]
        return None, dq, dkv[..., :d], dkv[..., d:], d_s, *d_caps


def _vjp_maker(f: _Frame, caps: list[Array]) -> Callable[[Problem], ScoreVjp] | None:
    mods = f.call.base.mods
    if mods is None or mods.score_mod is None:
        return None
    return lambda p: score_vjp(p.mods, caps, xp=f.xp)  # type: ignore[arg-type]


def _ring_backward(
    f: _Frame, t: Cotangents, kv: Array, caps: list[Array]
) -> tuple[Array, Array, list[Array]]:
    """``dQ`` here; every key shard's ``dK``/``dV`` built up on the ranks and returned home."""
    c, ex, xp = f.call, f.exchange, f.xp
    vjp = _vjp_maker(f, caps)
    dq = torch.zeros_like(t.q)
    d_caps: list[Array] = []
    mine: list[Array] = []
    pending: tuple[Array, list[Any]] | None = None  # the accumulator coming from rank - 1
    for src, buf in ex.sources(kv, backward=True):
        rows, dkv, parts = backward_source(c, src, t, buf, vjp, xp=xp)
        for (a, b), g in rows:
            dq[..., a:b, :] += g
        d_caps = add_captures(d_caps, parts)
        if not ex.ring:
            mine.append(dkv)
            continue
        if pending is not None:  # what earlier ranks added for this source, then this one's share
            ex.wait(pending[1])
            dkv = pending[0] + dkv
        pending = ex.start(dkv.contiguous(), backward=True, tag=1) if ex.world > 1 else (dkv, [])
    if not ex.ring:
        by_source = [
            mine[(ex.rank - s) % ex.world] for s in range(ex.world)
        ]  # sources in rank order
        return dq, ex.scatter_sum(by_source), d_caps
    assert pending is not None
    ex.wait(pending[1])
    return dq, pending[0], d_caps


def torch_attention(
    q: Array, k: Array, v: Array, o: Setup, group: Any, xp: Namespace
) -> tuple[Array, Array, Stats]:
    """This rank's output and lse shard (work dtype for lse) and what it did."""
    g, rank, world = _members(group)
    _same_shapes(g, world, q, k, v)
    if o.strategy == "ulysses":
        return _ulysses(q, k, v, o, g, rank, world, xp)
    base, sched = ring_setup(q, k, v, o, world, rank, xp=xp)
    stats = Stats()
    call = Call(
        sched, base.without_arrays(), o.block_size, stats, int(k.shape[-1]), int(k.shape[-3])
    )
    kw, vw = (x if x.dtype == base.q.dtype else x.to(base.q.dtype) for x in (k, v))
    caps = captured_tensors(base)
    frame = _Frame(call, _Exchange(g, rank, world, o.strategy, stats), xp, len(caps))
    out, lse = _apply(ContextParallel, frame, base.q, kw, vw, base.sink, *caps)
    return narrow(out, base.out_dtype, xp=xp), lse, stats


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` on a (P, ...) tensor; its adjoint is the same exchange."""

    @staticmethod
    def forward(ctx: Any, group: Any, stats: Stats, x: Array) -> Array:
        ctx.group, ctx.stats = group, stats
        return _a2a(group, stats, x, backward=False)

    @staticmethod
    def backward(ctx: Any, dy: Array) -> tuple[Any, ...]:
        return None, None, _a2a(ctx.group, ctx.stats, dy, backward=True)


def _a2a(group: Any, stats: Stats, x: Array, *, backward: bool) -> Array:
    x = x.contiguous()
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x, group=group)
    n = x.numel() * x.element_size() * (x.shape[0] - 1) // x.shape[0]
    if backward:
        stats.backward_bytes_sent += n
    else:
        stats.bytes_sent += n
    return y


def _to_heads(x: Array, group: Any, stats: Stats, world: int, layout: Layout) -> Array:
    """(B, Hx, n, d) sequence shard -> (B, Hx/P, L, d): this rank's heads, whole sequence."""
    b, hx, n, d = x.shape
    y = _apply(_AllToAll, group, stats, x.reshape(b, world, hx // world, n, d).movedim(1, 0))
    return unshard([y[s] for s in range(world)], layout=layout)  # (B, Hx/P, L, d)


def _to_sequence(y: Array, group: Any, stats: Stats, world: int, layout: Layout) -> Array:
    """The inverse of :func:`_to_heads`: (B, Hx/P, L, d) -> (B, Hx, n, d)."""
    parts = [shard(y, rank=s, world=world, layout=layout) for s in range(world)]
    z = _apply(_AllToAll, group, stats, torch.stack(parts))  # (P, B, Hx/P, n, d)
    b, h, n, d = z.shape[1:]
    return z.movedim(0, 1).reshape(b, world * h, n, d)


def _ulysses(
    q: Array, k: Array, v: Array, o: Setup, g: Any, rank: int, world: int, xp: Namespace
) -> tuple[Array, Array, Stats]:
    """All-to-all to head sharding, attention on the whole sequence, all-to-all back."""
    h, _ = check_ulysses(q, k, world, o.layout)
    stats = Stats()
    qh, kh, vh = (_to_heads(x, g, stats, world, o.layout) for x in (q, k, v))
    h0, h1 = rank * h // world, (rank + 1) * h // world
    variant = o.variant.for_heads(h0, h1, h)
    p = prepare(qh, kh, vh, variant.without_flex(), scale=o.scale, xp=xp)
    mods = shard_mods(p, variant, int(qh.shape[-2]), (h0, h))
    p = dataclasses.replace(p, variant=dataclasses.replace(p.variant, mods=mods))
    stats.pairs, stats.tiles = 1, tiles_of(p, o.block_size, xp=xp)
    out, lse = blockwise_attention(p, block_size=o.block_size, xp=xp)
    both = torch.cat([out, lse[..., None]], dim=-1)  # one exchange back
    back = _to_sequence(both, g, stats, world, o.layout)
    return narrow(back[..., :-1], p.out_dtype, xp=xp), back[..., -1], stats


def _apply(fn: type[torch.autograd.Function], *args: Any) -> Any:
    """``fn.apply(*args)``: torch leaves ``apply`` untyped."""
    apply: Any = fn.apply
    return apply(*args)
