"""The torch adapter of the blockwise backward: a module-level ``torch.autograd.Function``.

Imported only for torch tensors (torch is optional). Defined at module level
so that torch.compile traces ``apply`` without meeting a class statement.

It has the ``setup_context`` form, which ``torch.func`` transforms require
(``grad``, ``vjp``, ``vmap``), and ``generate_vmap_rule``: the forward and
the backward are array API code without host reads under a transform
(:func:`~portattn._lib._compat.is_concrete`), so vmap can batch them as
they are. For the same reason every array of the problem is an input, masks
and lengths included: a ``Function`` must not close over tensors that a
transform may have wrapped.

The backward is itself differentiable: under ``create_graph=True`` the
recomputation it does is recorded like any other torch code, so double
backward (gradient penalties, Hessian-vector products) works. Only the first
backward keeps O(Lq + Lk) memory; the graph of the second holds its tiles.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from .._core._problem import Problem, Variant
from .._lib._precision import torch_autocast_off
from .._lib._typing import Array, Namespace
from .._paths._blockwise import blockwise_attention as _plain_blockwise
from ._backward import blockwise_backward

__all__ = ["BlockwiseAttention"]

# The bias's position among forward's inputs: after p, block_size, xp, then
# the problem's arrays in Problem.arrays order (q, k, v, then the variant's).
_BIAS = 3 + 3 + tuple(Variant.ARRAYS).index("bias")


class BlockwiseAttention(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(
        p: Problem, block_size: tuple[int, int] | None, xp: Namespace, *arrays: Array | None
    ) -> tuple[Array, Array]:
        return _plain_blockwise(p.with_arrays(arrays), block_size=block_size, xp=xp)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Array, Array]) -> None:
        p, block_size, xp, *arrays = inputs
        ctx.save_for_backward(*arrays, *output)
        ctx.frame = p
        ctx.block_size = block_size
        ctx.xp = xp

    @staticmethod
    def backward(ctx: Any, d_out: Array | None, d_lse: Array | None) -> tuple[Any, ...]:
        *arrays, out, lse = ctx.saved_tensors
        if d_out is None:
            d_out = torch.zeros_like(out)
        # A backward run inside torch.autocast computes as the forward did.
        with torch_autocast_off(out.device) or contextlib.nullcontext():
            g = blockwise_backward(
                ctx.frame.with_arrays(tuple(arrays)),
                out,
                lse,
                d_out,
                d_lse,
                block_size=ctx.block_size,
                want_bias=bool(ctx.needs_input_grad[_BIAS]),
                xp=ctx.xp,
            )
        return None, None, None, *g.as_inputs()
