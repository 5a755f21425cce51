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
The exception: a ``score_mod`` that captures tensors requiring grad, whose
per-tile vjp a second differentiation cannot see; that is refused.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from .._core._flex import Mods
from .._core._problem import Problem, Variant
from .._lib._captures import captured
from .._lib._precision import torch_autocast_off
from .._lib._typing import Array, Namespace
from .._paths._blockwise import blockwise_attention as _plain_blockwise
from ._backward import Pullback, ScoreVjp, blockwise_backward

__all__ = ["BlockwiseAttention", "captured_tensors", "score_vjp"]

# The bias's position among forward's inputs: after p, block_size, xp, then
# the problem's arrays in Problem.arrays order (q, k, v, then the variant's).
_BIAS = 3 + 3 + tuple(Variant.ARRAYS).index("bias")
# The problem's own arrays among forward's inputs; the score_mod's captures follow.
_GIVEN = 3 + len(Variant.ARRAYS)


def captured_tensors(p: Problem) -> list[Array]:
    """The tensors requiring grad that ``p``'s score_mod captures, in a fixed order."""
    if p.mods is None or p.mods.score_mod is None:
        return []
    return captured(
        p.mods.score_mod, lambda x: isinstance(x, torch.Tensor) and bool(x.requires_grad)
    )


def score_vjp(mods: Mods, captures: list[Array], *, xp: Namespace) -> ScoreVjp:
    """The score_mod's vjp on one tile, to the tile's scores and to the captured tensors.

    With captures, ``torch.autograd.grad`` on the mod re-evaluated under
    ``enable_grad``: it reaches the tensors the mod reads from its closure,
    which are the very objects passed to the Function as extra inputs.
    Without, ``torch.func.vjp``, which torch.compile traces.
    """

    def vjp(s: Array, idx: tuple[Array, Array, Array, Array]) -> tuple[Array, Pullback]:
        if not captures:
            got = torch.func.vjp(lambda x: mods.score(x, idx, xp=xp), s)
            out, pull = got[0], got[1]
            return out, lambda ds: (pull(ds)[0], [])
        with torch.enable_grad():
            x = s.detach().requires_grad_(True)
            out = mods.score(x, idx, xp=xp)

        def pullback(ds: Array) -> tuple[Array, list[Array]]:
            wrt = [x, *captures]
            got = torch.autograd.grad(out, wrt, ds, allow_unused=True)
            grads = [torch.zeros_like(w) if g is None else g for g, w in zip(got, wrt, strict=True)]
            return grads[0], grads[1:]

        return out.detach(), pullback

    return vjp


class BlockwiseAttention(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(
        p: Problem, block_size: tuple[int, int] | None, xp: Namespace, *arrays: Array | None
    ) -> tuple[Array, Array]:
        return _plain_blockwise(p.with_arrays(arrays[:_GIVEN]), block_size=block_size, xp=xp)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Array, Array]) -> None:
        p, block_size, xp, *arrays = inputs
        ctx.save_for_backward(*arrays[:_GIVEN], *output)
        ctx.captures = captured_tensors(p)
        ctx.frame = p
        ctx.block_size = block_size
        ctx.xp = xp

    @staticmethod
    def backward(ctx: Any, d_out: Array | None, d_lse: Array | None) -> tuple[Any, ...]:
        *arrays, out, lse = ctx.saved_tensors
        if ctx.captures and torch.is_grad_enabled():
            # The mod's per-tile vjp reaches its captured tensors through a
            # graph of its own, which a second differentiation does not see:
            # the result would be silently wrong, so it is refused here.
            msg = (
                "double backward (create_graph=True, or a torch.func transform) through the "
                "blockwise path is not supported for a score_mod that captures tensors "
                "requiring grad; use impl='materialize' for that call, or capture constants"
            )
            raise NotImplementedError(msg)
        if d_out is None:
            d_out = torch.zeros_like(out)
        full = ctx.frame.with_arrays(tuple(arrays))
        vjp = None
        if full.mods is not None and full.mods.score_mod is not None:
            vjp = score_vjp(full.mods, ctx.captures, xp=ctx.xp)
        # A backward run inside torch.autocast computes as the forward did.
        with torch_autocast_off(out.device) or contextlib.nullcontext():
            g = blockwise_backward(
                full,
                out,
                lse,
                d_out,
                d_lse,
                block_size=ctx.block_size,
                want_bias=bool(ctx.needs_input_grad[_BIAS]),
                score_vjp=vjp,
                xp=ctx.xp,
            )
        caps = g.captures or [torch.zeros_like(c) for c in ctx.captures]
        return None, None, None, *g.as_inputs(), *caps
