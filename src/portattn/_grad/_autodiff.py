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

from typing import Any

from .._core._problem import Problem
from .._lib._compat import namespace_library
from .._lib._typing import Array, Namespace
from .._paths._blockwise import blockwise_attention as _plain_blockwise
from ._backward import blockwise_backward

__all__ = ["blockwise_attention"]


def blockwise_attention(
    p: Problem, *, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """The blockwise path as the entry runs it: differentiable in O(N) memory where needed."""
    lib = namespace_library(xp)
    if lib == "torch" and _torch_wants_grad(p):
        # Self-attention passes one tensor as key and value: torch.compile
        # refuses a tensor given twice to Function.apply, so the repeat goes
        # in as a view (its gradient flows back to the same tensor).
        arrays: list[Array | None] = []
        for x in p.arrays():
            if x is not None and any(x is y for y in arrays):
                x = x.view_as(x)
            arrays.append(x)
        out, lse = _torch_function().apply(p.without_arrays(), block_size, xp, *arrays)
        return out, lse
    if lib == "jax":
        return _jax_blockwise(p, block_size=block_size, xp=xp)
    return _plain_blockwise(p, block_size=block_size, xp=xp)


# --- torch -----------------------------------------------------------------


def _torch_wants_grad(p: Problem) -> bool:
    import torch

    if not torch.is_grad_enabled():
        return False
    return any(x is not None and x.requires_grad for x in (p.q, p.k, p.v, p.variant.bias))


def _torch_function() -> Any:
    """The ``torch.autograd.Function``, from a module that imports torch (an optional dependency).

    The class is defined at module level there, not built on first use:
    torch.compile cannot trace a class statement (nor sees through a
    ``functools.cache``), and would refuse ``fullgraph=True``.
    """
    from ._torch import BlockwiseAttention

    return BlockwiseAttention


# --- JAX -------------------------------------------------------------------


def _jax_blockwise(
    p: Problem, *, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """One ``jax.custom_vjp`` per call, closing over nothing but static options."""
    import jax

    frame = p.without_arrays()

    @jax.custom_vjp
    def run(*args: Array) -> tuple[Array, Array]:
        return _plain_blockwise(frame.with_arrays(args), block_size=block_size, xp=xp)

    def fwd(*args: Array) -> tuple[tuple[Array, Array], tuple[Any, ...]]:
        out, lse = _plain_blockwise(frame.with_arrays(args), block_size=block_size, xp=xp)
        return (out, lse), (args, out, lse)

    def bwd(res: tuple[Any, ...], cts: tuple[Array, Array]) -> tuple[Array | None, ...]:
        args, out, lse = res
        d_out, d_lse = cts
        g = blockwise_backward(
            frame.with_arrays(args), out, lse, d_out, d_lse, block_size=block_size, xp=xp
        )
        return g.as_inputs()  # masks and lengths: no gradient

    run.defvjp(fwd, bwd)
    out, lse = run(*p.arrays())
    return out, lse
