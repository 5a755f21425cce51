"""The torch adapter of the blockwise backward: a module-level ``torch.autograd.Function``.

Imported only for torch tensors (torch is optional). Defined at module level
so that torch.compile traces ``apply`` without meeting a class statement.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .._core._problem import Problem
from .._lib._typing import Array, Namespace
from .._paths._blockwise import blockwise_attention as _plain_blockwise
from ._backward import blockwise_backward

__all__ = ["BlockwiseAttention"]


def _frame(p: Problem) -> Problem:
    """``p`` without the differentiable arrays, to keep beside what the library saves."""
    return dataclasses.replace(p, q=None, k=None, v=None, bias=None)


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
