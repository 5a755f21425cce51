"""Register the blockwise backward with each library's own autodiff: thin adapters only.

Differentiating through the blockwise loop would make torch and JAX store
every score tile, which is O(Lq · Lk) memory again. Instead the forward runs
untracked and the backward is :func:`~portattn._blockwise_grad.blockwise_backward`,
recomputing tiles from the saved log-sum-exp:

- torch: a :class:`torch.autograd.Function` whose inputs are the problem's
  ``q`` (already scaled), ``k``, ``v`` and ``bias``, so that autograd carries
  the gradients back through ``prepare``'s scale, cast and reshapes;
- JAX: a :func:`jax.custom_vjp` over the same arrays plus the mask and the
  lengths, which get no cotangent (``None``).

It saves ``q``, ``k``, ``v``, ``bias``, the output and the lse: nothing of
size (Lq, Lk) beyond a bias the caller passed. All the maths lives in the
generic modules; nothing here computes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ._blockwise import blockwise_attention as _plain_blockwise
from ._blockwise_grad import blockwise_backward
from ._lib._compat import namespace_library
from ._lib._typing import Array, Namespace
from ._problem import Problem

__all__ = ["blockwise_attention"]


def blockwise_attention(
    p: Problem, *, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """The blockwise path as the entry runs it: differentiable in O(N) memory where needed."""
    lib = namespace_library(xp)
    if lib == "torch" and _torch_wants_grad(p):
        out, lse = _torch_function().apply(p, block_size, xp, p.q, p.k, p.v, p.bias)
        return out, lse
    if lib == "jax":
        return _jax_blockwise(p, block_size=block_size, xp=xp)
    return _plain_blockwise(p, block_size=block_size, xp=xp)


def _frame(p: Problem) -> Problem:
    """``p`` without the differentiable arrays, to keep beside what the library saves."""
    return dataclasses.replace(p, q=None, k=None, v=None, bias=None)


# --- torch -----------------------------------------------------------------


def _torch_wants_grad(p: Problem) -> bool:
    import torch

    if not torch.is_grad_enabled():
        return False
    return any(x is not None and x.requires_grad for x in (p.q, p.k, p.v, p.bias))


@functools.cache
def _torch_function() -> Any:
    """The ``torch.autograd.Function`` (built on first use: torch is an optional dependency)."""
    import torch
    from torch.autograd.function import once_differentiable

    class BlockwiseAttention(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            p: Problem,
            block_size: tuple[int, int] | None,
            xp: Namespace,
            q: Array,
            k: Array,
            v: Array,
            bias: Array | None,
        ) -> tuple[Array, Array]:
            full = dataclasses.replace(p, q=q, k=k, v=v, bias=bias)
            out, lse = _plain_blockwise(full, block_size=block_size, xp=xp)
            ctx.save_for_backward(q, k, v, bias, out, lse)
            ctx.frame = _frame(p)
            ctx.block_size = block_size
            ctx.xp = xp
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, d_out: Array | None, d_lse: Array | None) -> tuple[Any, ...]:
            q, k, v, bias, out, lse = ctx.saved_tensors
            full = dataclasses.replace(ctx.frame, q=q, k=k, v=v, bias=bias)
            if d_out is None:
                d_out = torch.zeros_like(out)
            g = blockwise_backward(
                full,
                out,
                lse,
                d_out,
                d_lse,
                block_size=ctx.block_size,
                want_bias=bool(ctx.needs_input_grad[6]),
                xp=ctx.xp,
            )
            return None, None, None, g.q, g.k, g.v, g.bias

    return BlockwiseAttention


# --- JAX -------------------------------------------------------------------


def _jax_blockwise(
    p: Problem, *, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """One ``jax.custom_vjp`` per call, closing over nothing but static options."""
    import jax

    frame = dataclasses.replace(_frame(p), mask=None, key_lengths=None, query_lengths=None)

    def rebuild(args: tuple[Array, ...]) -> Problem:
        q, k, v, bias, mask, key_lengths, query_lengths = args
        return dataclasses.replace(
            frame,
            q=q,
            k=k,
            v=v,
            bias=bias,
            mask=mask,
            key_lengths=key_lengths,
            query_lengths=query_lengths,
        )

    @jax.custom_vjp
    def run(*args: Array) -> tuple[Array, Array]:
        return _plain_blockwise(rebuild(args), block_size=block_size, xp=xp)

    def fwd(*args: Array) -> tuple[tuple[Array, Array], tuple[Any, ...]]:
        out, lse = _plain_blockwise(rebuild(args), block_size=block_size, xp=xp)
        return (out, lse), (args, out, lse)

    def bwd(res: tuple[Any, ...], cts: tuple[Array, Array]) -> tuple[Array | None, ...]:
        args, out, lse = res
        d_out, d_lse = cts
        g = blockwise_backward(rebuild(args), out, lse, d_out, d_lse, block_size=block_size, xp=xp)
        return g.q, g.k, g.v, g.bias, None, None, None  # masks and lengths: no gradient

    run.defvjp(fwd, bwd)
    out, lse = run(p.q, p.k, p.v, p.bias, p.mask, p.key_lengths, p.query_lengths)
    return out, lse
