"""Register the blockwise backward with each library's own autodiff: thin adapters only.

Differentiating through the blockwise loop would make torch and JAX store
every score tile, which is O(Lq · Lk) memory again. Instead the forward runs
untracked and the backward is :func:`~portattn._grad._backward.blockwise_backward`,
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

__all__ = ["blockwise_attention"]


def blockwise_attention(
    p: Problem, *, block_size: tuple[int, int] | None, xp: Namespace
) -> tuple[Array, Array]:
    """The blockwise path as the entry runs it: differentiable in O(N) memory where needed.

    A block mask whose tiles differ by batch entry or head, enough to pay
    (:meth:`~portattn._core._flex.Mods.parts`), runs as one call per range
    of them, each skipping its own empty tiles; the library's autodiff sees
    the cuts and the concatenation.
    """
    parts = [] if p.mods is None else p.mods.parts()
    if parts:
        rows: list[tuple[list[Array], list[Array]]] = []
        row_start = None
        for b0, b1, h0, h1, mods in parts:
            out, lse = blockwise_attention(
                p.part(b0, b1, h0, h1, mods, xp=xp), block_size=block_size, xp=xp
            )
            if b0 != row_start:  # a new range of batch entries
                rows.append(([], []))
                row_start = b0
            rows[-1][0].append(out)
            rows[-1][1].append(lse)
        outs = [o[0] if len(o) == 1 else xp.concat(o, axis=1) for o, _ in rows]
        lses = [s[0] if len(s) == 1 else xp.concat(s, axis=1) for _, s in rows]
        if len(rows) == 1:
            return outs[0], lses[0]
        return xp.concat(outs, axis=0), xp.concat(lses, axis=0)
    lib = namespace_library(xp)
    if lib == "torch" and _torch_enabled():
        if p.mods is not None and p.mods.score_mod is not None and _torch_compiling():
            # torch.compile traces neither the search for the mod's captures
            # nor torch.autograd.grad in the Function's backward; its own
            # autograd differentiates the loop instead (gradients reach the
            # captures, but the tiles are kept: O(Lq * Lk) memory).
            return _plain_blockwise(p, block_size=block_size, xp=xp)
        captures = _torch_captures(p)
        if _torch_wants_grad(p, captures):
            # Self-attention passes one tensor as key and value: torch.compile
            # refuses a tensor given twice to Function.apply, so the repeat goes
            # in as a view (its gradient flows back to the same tensor).
            arrays: list[Array | None] = []
            for x in (*p.arrays(), *captures):
                if x is not None and any(x is y for y in arrays):
                    x = x.view_as(x)
                arrays.append(x)
            out, lse = _torch_function().apply(p.without_arrays(), block_size, xp, *arrays)
            return out, lse
    if lib == "jax":
        return _jax_blockwise(p, block_size=block_size, xp=xp)
    return _plain_blockwise(p, block_size=block_size, xp=xp)


# --- torch -----------------------------------------------------------------


def _torch_enabled() -> bool:
    import torch

    return bool(torch.is_grad_enabled())


def _torch_compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


def _torch_captures(p: Problem) -> list[Array]:
    from ._torch import captured_tensors

    return captured_tensors(p)


def _torch_wants_grad(p: Problem, captures: list[Array]) -> bool:
    return any(x.requires_grad for x in (*p.grad_arrays(), *captures))


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
    from ._jax import jax_blockwise  # JAX is optional: imported for JAX arrays only

    return jax_blockwise(p, block_size=block_size, xp=xp)
