"""Context parallelism on a JAX mesh axis, inside ``jax.shard_map``.

Imported only for JAX arrays. The rank is ``lax.axis_index(axis_name)``, a
traced value, while each pair's positions must be known when the program is
built; so every step is a ``lax.switch`` over the ranks, whose branch ``r``
is rank ``r``'s static schedule for that step. Shards move with
``lax.ppermute`` (ring), ``lax.all_gather`` or ``lax.all_to_all`` (Ulysses).

The gradient is JAX's own: each pair runs the blockwise ``custom_vjp``, and
JAX transposes the merges and the collectives (a ``ppermute`` backward is
the reverse ``ppermute``). This keeps every step's key/value shard for the
backward, O(L) per rank rather than the torch ring's O(L/P).

A ``score_mod`` that captures a replicated array (ALiBi slopes given with
``in_specs`` ``P()``) needs ``jax.shard_map(..., check_vma=False)``: inside
the blockwise ``custom_vjp`` the array meets scores that vary along the axis,
which the check refuses. The gradient is then still the full one (tested).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jax import lax

from .._core._merge import merge_attention
from .._core._prepare import prepare
from .._core._problem import Problem
from .._grad._autodiff import blockwise_attention
from .._lib._precision import narrow
from .._lib._typing import Array, Namespace
from ._layout import shard, unshard
from ._options import Setup
from ._schedule import Stats, check_ulysses, ring_setup, shard_mods
from ._steps import Call, assemble, fold_sink, forward_source

__all__ = ["jax_attention"]

# JAX leaves these collectives untyped.
_ppermute: Any = lax.ppermute
_all_to_all: Any = lax.all_to_all


def _axis(axis_name: Any) -> tuple[int, Array]:
    """The mesh axis's size and this device's index on it, or an error naming the remedy."""
    if axis_name is None:
        msg = (
            "expected axis_name= for JAX arrays: the jax.shard_map mesh axis the sequence is "
            "split along, got None"
        )
        raise ValueError(msg)
    try:
        return int(lax.axis_size(axis_name)), lax.axis_index(axis_name)
    except NameError as e:
        msg = (
            f"expected axis_name to name a mesh axis of the enclosing jax.shard_map, "
            f"got {axis_name!r} ({e})"
        )
        raise ValueError(msg) from None


def jax_attention(
    q: Array, k: Array, v: Array, o: Setup, axis_name: Any, xp: Namespace
) -> tuple[Array, Array]:
    """This device's output and lse shard; differentiable with ``jax.grad``."""
    world, rank = _axis(axis_name)
    if o.strategy == "ulysses":
        return _ulysses(q, k, v, o, axis_name, world, rank, xp)
    base, sched = ring_setup(q, k, v, o, world, 0, xp=xp)
    call = Call(sched, base, o.block_size, Stats(), int(k.shape[-1]), int(k.shape[-3]))
    kv = xp.concat([xp.astype(k, base.q.dtype), xp.astype(v, base.q.dtype)], axis=-1)
    if o.strategy == "allgather":
        every = lax.all_gather(kv, axis_name)  # (P, B, Hkv, n, d + dv)
    acc = None
    for t in range(world):
        if o.strategy == "ring" and t:
            kv = _ppermute(kv, axis_name, [(i, (i + 1) % world) for i in range(world)])
        held = kv if o.strategy == "ring" else every
        branches = [
            _varying(_step(call, r, (r - t) % world, o.strategy, int(v.shape[-1]), xp), axis_name)
            for r in range(world)
        ]
        out, lse = lax.switch(rank, branches, base.q, held)
        acc = (out, lse) if acc is None else merge_attention([acc[0], out], [acc[1], lse])
    assert acc is not None
    out, lse = acc
    if base.sink is not None:
        out, lse = fold_sink(out, lse, base.sink, xp=xp)
    return narrow(out, base.out_dtype, xp=xp), lse


def _varying(fn: Callable[..., tuple[Array, Array]], axis_name: Any) -> Callable[..., Any]:
    """``fn`` whose results vary along the mesh axis, as ``lax.switch`` needs of every branch.

    A branch whose pairs are all hidden returns fresh zeros and ``-inf``,
    which JAX types as the same on every device; the others' results vary.
    """

    def run(*args: Array) -> tuple[Array, ...]:
        outs = fn(*args)
        # + a zero that varies (from the axis index) makes any result vary, and is exact.
        zero = lax.axis_index(axis_name) * 0
        return tuple(x + zero.astype(x.dtype) for x in outs)

    return run


def _step(
    call: Call, rank: int, src: int, strategy: str, dv: int, xp: Namespace
) -> Callable[[Array, Array], tuple[Array, Array]]:
    """Rank ``rank``'s share of one step: its queries against ``src``'s keys."""
    c = dataclasses.replace(call, schedule=dataclasses.replace(call.schedule, rank=rank))

    def kernel(p: Problem) -> tuple[Array, Array]:
        return blockwise_attention(p, block_size=c.block_size, xp=xp)

    def run(q: Array, held: Array) -> tuple[Array, Array]:
        kv = held if strategy == "ring" else held[src]
        acc: list[Any] = [None] * len(c.schedule.chunks(rank))
        acc = forward_source(c, src, q, kv, acc, kernel=kernel, xp=xp)
        return assemble(c, acc, dv, xp=xp)

    return run


def _ulysses(
    q: Array,
    k: Array,
    v: Array,
    o: Setup,
    axis_name: Any,
    world: int,
    rank: Array,
    xp: Namespace,
) -> tuple[Array, Array]:
    """All-to-all to head sharding, attention on the whole sequence, all-to-all back."""
    h, _ = check_ulysses(q, k, world, o.layout)

    def to_heads(x: Array) -> Array:
        y = _all_to_all(x, axis_name, 1, 2, tiled=True)  # (B, Hx/P, P·n, d), rank order
        n = int(x.shape[-2])
        return unshard([y[..., s * n : (s + 1) * n, :] for s in range(world)], layout=o.layout)

    qh, kh, vh = (to_heads(x) for x in (q, k, v))
    branches = [_varying(_heads_branch(o, r, world, h, xp), axis_name) for r in range(world)]
    out, lse = lax.switch(rank, branches, qh, kh, vh)
    both = xp.concat([out, lse[..., None]], axis=-1)
    parts = [shard(both, rank=s, world=world, layout=o.layout) for s in range(world)]
    back = _all_to_all(xp.concat(parts, axis=-2), axis_name, 2, 1, tiled=True)
    return narrow(back[..., :-1], q.dtype, xp=xp), back[..., -1]


def _heads_branch(
    o: Setup, rank: int, world: int, h: int, xp: Namespace
) -> Callable[[Array, Array, Array], tuple[Array, Array]]:
    h0, h1 = rank * h // world, (rank + 1) * h // world
    variant = o.variant.for_heads(h0, h1, h)

    def run(q: Array, k: Array, v: Array) -> tuple[Array, Array]:
        p = prepare(q, k, v, variant.without_flex(), scale=o.scale, xp=xp)
        mods = shard_mods(p, variant, int(q.shape[-2]), (h0, h))
        p = dataclasses.replace(p, variant=dataclasses.replace(p.variant, mods=mods))
        return blockwise_attention(p, block_size=o.block_size, xp=xp)

    return run
