"""The JAX adapter of the blockwise backward: one ``jax.custom_vjp`` per call.

Imported only for JAX arrays (JAX is optional). A ``custom_vjp`` may not
close over values JAX is tracing, and a ``score_mod`` often does (ALiBi
slopes being learned, a table under ``jax.jit``). So the mod goes through
:func:`jax.closure_convert`, which hoists those values out as explicit
arguments; they travel through the ``custom_vjp`` beside ``q``, ``k`` and
``v``, and the backward differentiates the converted mod per tile with
:func:`jax.vjp`, summing the hoisted values' cotangents tile by tile.

``closure_convert`` traces the mod for one tile shape. Tiles at the edges
are smaller, so every tile is padded to that shape for the mod and the
result cut back: the mod is elementwise, and gathers at padded positions
(clamped by JAX) land only in the part cut away.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._core._flex import Mods
from .._core._problem import Problem
from .._lib._compat import is_concrete
from .._lib._typing import Array, Namespace
from .._paths._blockwise import blockwise_attention as _plain_blockwise
from .._paths._blockwise import problem_block_sizes, traced_block_sizes
from ._backward import Pullback, ScoreVjp, blockwise_backward

__all__ = ["jax_blockwise"]

Indices = tuple[Array, Array, Array, Array]


def _converted(
    p: Problem, block_size: tuple[int, int] | None, *, xp: Namespace
) -> tuple[Callable[..., Array] | None, list[Array], tuple[int, int]]:
    """The closure-converted score_mod, the values it hoisted, and the tile shape it takes."""
    bq, bk = problem_block_sizes(p, block_size, xp=xp)
    if not is_concrete(p.q):
        bq, bk = traced_block_sizes(bq, bk, p.lq, p.lk, mods=p.mods)
    tq, tk = min(bq, p.lq), min(bk, p.lk)
    if p.mods is None or p.mods.score_mod is None:
        return None, [], (tq, tk)
    idx = p.mods.indices(p.batch, 0, tq, 0, tk, xp=xp, device=p.device)
    s = jnp.zeros((*p.batch, tq, tk), dtype=p.q.dtype)
    fn, consts = jax.closure_convert(p.mods.score_mod, s, *idx)
    return fn, list(consts), (tq, tk)


def _padded(fn: Callable[..., Array], consts: list[Array], tile: tuple[int, int]) -> Any:
    """A score_mod for any tile up to ``tile``, through ``fn`` traced for exactly ``tile``."""
    tq, tk = tile

    def mod(s: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        rows, cols = s.shape[-2], s.shape[-1]
        if (rows, cols) == (tq, tk):
            return fn(s, b, h, q_idx, kv_idx, *consts)
        s = jnp.pad(s, ((0, 0), (0, 0), (0, tq - rows), (0, tk - cols)))
        q_idx = q_idx[..., :1, :] + jnp.arange(tq, dtype=q_idx.dtype)[:, None]
        kv_idx = kv_idx[..., :1] + jnp.arange(tk, dtype=kv_idx.dtype)
        return fn(s, b, h, q_idx, kv_idx, *consts)[..., :rows, :cols]

    return mod


def _score_vjp(mods: Mods, fn: Any, consts: list[Array], tile: tuple[int, int]) -> ScoreVjp:
    """``jax.vjp`` of the converted mod on one tile, to the tile and the floating hoisted values."""
    floating = [i for i, c in enumerate(consts) if jnp.issubdtype(c.dtype, jnp.inexact)]

    def vjp(s: Array, idx: Indices) -> tuple[Array, Pullback]:
        def f(s_: Array, *wrt: Array) -> Array:
            vals = list(consts)
            for i, c in zip(floating, wrt, strict=True):
                vals[i] = c
            return mods_with(mods, fn, vals, tile).score(s_, idx, xp=jnp)

        out, pull = jax.vjp(f, s, *(consts[i] for i in floating))

        def pullback(ds: Array) -> tuple[Array, list[Array]]:
            got = pull(ds)
            return got[0], list(got[1:])

        return out, pullback

    return vjp


def mods_with(mods: Mods, fn: Any, consts: list[Array], tile: tuple[int, int]) -> Mods:
    padded = _padded(fn, consts, tile)
    # Errors about the mod's result name the user's mod, not this wrapper.
    padded.__name__ = getattr(mods.score_mod, "__name__", type(mods.score_mod).__name__)
    return dataclasses.replace(mods, score_mod=padded)


def jax_blockwise(
    p: Problem, *, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """One ``jax.custom_vjp`` per call, closing over nothing JAX traces."""
    fn, consts, tile = _converted(p, block_size, xp=xp)
    frame = p.without_arrays()
    given = len(p.arrays())
    floating = [i for i, c in enumerate(consts) if jnp.issubdtype(c.dtype, jnp.inexact)]

    def rebuild(args: tuple[Array, ...]) -> Problem:
        prob = frame.with_arrays(args[:given])
        if fn is None:
            return prob
        assert prob.mods is not None
        mods = mods_with(prob.mods, fn, list(args[given:]), tile)
        return dataclasses.replace(prob, variant=dataclasses.replace(prob.variant, mods=mods))

    @jax.custom_vjp
    def run(*args: Array) -> tuple[Array, Array]:
        return _plain_blockwise(rebuild(args), block_size=block_size, xp=xp)

    def fwd(*args: Array) -> tuple[tuple[Array, Array], tuple[Any, ...]]:
        out, lse = _plain_blockwise(rebuild(args), block_size=block_size, xp=xp)
        return (out, lse), (args, out, lse)

    def bwd(res: tuple[Any, ...], cts: tuple[Array, Array]) -> tuple[Array | None, ...]:
        args, out, lse = res
        d_out, d_lse = cts
        vjp = None
        if fn is not None:
            assert frame.mods is not None
            vjp = _score_vjp(frame.mods, fn, list(args[given:]), tile)
        g = blockwise_backward(
            rebuild(args), out, lse, d_out, d_lse, block_size=block_size, score_vjp=vjp, xp=xp
        )
        hoisted: list[Array | None] = [None] * len(consts)  # integer values: no cotangent
        for n, i in enumerate(floating):
            hoisted[i] = g.captures[n] if g.captures else jnp.zeros_like(args[given + i])
        return (*g.as_inputs(), *hoisted)  # masks and lengths: no gradient

    run.defvjp(fwd, bwd)
    out, lse = run(*p.arrays(), *consts)
    return out, lse
