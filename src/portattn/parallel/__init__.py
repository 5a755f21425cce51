"""Context parallelism: attention over a sequence split across ranks, with an exact backward.

Each rank holds a shard of the queries, keys and values along the sequence
(:func:`shard`, in a ``layout``), and :func:`attention` returns its shard of
the output. The ranks are a ``torch.distributed`` process group (torch
tensors) or a named mesh axis inside ``jax.shard_map`` (JAX arrays). Three
strategies:

- ``"ring"``: key/value shards travel around the ring, each transfer
  overlapped with the attention of the shard already there; the backward
  sends the key/value gradients around the ring back to their owners;
- ``"allgather"``: every key/value shard is gathered at once (O(L) memory);
- ``"ulysses"``: an all-to-all from sequence to head sharding, attention on
  the whole sequence for H/P heads, and back (P must divide H and Hkv).

Positions are global: causal, a window, a ``score_mod`` and a block mask
built for the whole sequence (:func:`portattn.create_block_mask`, the same
on every rank) mean what they mean in :func:`portattn.attention` on the
whole sequence, and with one rank the call equals it. A (query chunk, key
chunk) pair that they hide entirely is never computed.

Gradients of arrays every rank holds whole (``sinks``, tensors a
``score_mod`` captures) are each rank's *partial* gradient on torch, from
its own query rows: sum them across the group (as data parallelism sums a
model's weights' gradients). Inside ``jax.shard_map`` with a replicated
``in_specs`` entry, JAX's own transpose sums them, so ``jax.grad`` outside
gives the full gradient.

torch and JAX are imported only when their arrays arrive.
"""

from __future__ import annotations

from typing import Any, Literal, overload

from .._core._variant import Variant, variant_from
from .._lib._checks import check_finite_scale, check_flag, check_int_pair
from .._lib._compat import array_namespace, namespace_library
from .._lib._typing import Array, Namespace
from ._layout import Layout, check_layout, positions, shard, unshard
from ._options import Setup
from ._schedule import Stats

__all__ = ["STRATEGIES", "Stats", "attention", "last_stats", "positions", "shard", "unshard"]

#: The strategies :func:`attention` knows.
STRATEGIES: tuple[str, ...] = ("ring", "allgather", "ulysses")

_LAST: list[Stats] = []


def last_stats() -> Stats | None:
    """What the last torch call on this process did: pairs and tiles computed, bytes sent.

    Backward counts are added when the backward runs. ``None`` before any call.
    """
    return _LAST[-1] if _LAST else None


# The type checkers' view: the return type follows return_lse (an array, or the
# (output, lse) pair), so `out.shape` and `out, lse = ...` both check.
@overload
def attention(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    group: Any = None,
    axis_name: Any = None,
    strategy: str = "ring",
    layout: Layout = "zigzag",
    causal: bool = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: Any = None,
    block_mask: Any = None,
    sinks: Array | None = None,
    return_lse: Literal[False] = False,
    block_size: int | tuple[int, int] | None = None,
) -> Array: ...


@overload
def attention(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    group: Any = None,
    axis_name: Any = None,
    strategy: str = "ring",
    layout: Layout = "zigzag",
    causal: bool = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: Any = None,
    block_mask: Any = None,
    sinks: Array | None = None,
    return_lse: Literal[True],
    block_size: int | tuple[int, int] | None = None,
) -> tuple[Array, Array]: ...


@overload
def attention(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    group: Any = None,
    axis_name: Any = None,
    strategy: str = "ring",
    layout: Layout = "zigzag",
    causal: bool = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: Any = None,
    block_mask: Any = None,
    sinks: Array | None = None,
    return_lse: bool = False,
    block_size: int | tuple[int, int] | None = None,
) -> Array | tuple[Array, Array]: ...


def attention(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    group: Any = None,
    axis_name: Any = None,
    strategy: str = "ring",
    layout: Layout = "zigzag",
    causal: bool = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: Any = None,
    block_mask: Any = None,
    sinks: Array | None = None,
    return_lse: bool = False,
    block_size: int | tuple[int, int] | None = None,
) -> Array | tuple[Array, Array]:
    """Attention of this rank's query shard over the whole, sharded sequence.

    Parameters
    ----------
    q : array, shape (B, H, L/P, d)
        This rank's query rows, in ``layout``.
    k, v : arrays, shape (B, Hkv, L/P, d) and (B, Hkv, L/P, dv)
        This rank's key and value rows; ``Hkv`` divides ``H`` (GQA).
    group : torch.distributed group, optional
        torch tensors only; ``None`` means the default group.
    axis_name : hashable, optional
        JAX arrays only, and required there: the mesh axis of ``jax.shard_map``.
    strategy : {"ring", "allgather", "ulysses"}
        ``"ring"`` passes the K/V shards around the ranks, overlapped with compute;
        ``"allgather"`` gathers K/V whole (O(N) memory for them); ``"ulysses"``
        switches from sequence to head sharding and back (P must divide H and Hkv).
    layout : {"zigzag", "contiguous"}
        How the sequence was cut (:func:`shard`). Zigzag needs ``L`` divisible by ``2P``.
    causal, window, scale, softcap, score_mod, block_mask, sinks, block_size
        As in :func:`portattn.attention`, over global positions. ``block_mask``
        is built for the whole sequence.
    return_lse : bool
        Also return this rank's rows of the log-sum-exp.

    Returns
    -------
    out : array, shape (B, H, L/P, dv)
        This rank's rows of the output; ``(out, lse)`` with ``return_lse``.

    Examples
    --------
    >>> from portattn import parallel
    >>> parallel.positions(8, rank=0, world=2).tolist()
    [0, 1, 6, 7]
    """
    xp = array_namespace(q, k, v)
    lib = namespace_library(xp)
    if strategy not in STRATEGIES:
        msg = f"expected strategy to be one of {STRATEGIES}, got {strategy!r}"
        raise ValueError(msg)
    if causal is not True and causal is not False:
        msg = f"expected causal to be True or False (positions are global), got {causal!r}"
        raise ValueError(msg)
    variant = variant_from(locals())
    setup = _setup(strategy, layout, variant, scale, block_size)
    want_lse = check_flag("return_lse", return_lse)
    out, lse = _run(q, k, v, setup, group, axis_name, lib=lib, xp=xp)
    return (out, lse) if want_lse else out


def _run(
    q: Array,
    k: Array,
    v: Array,
    setup: Setup,
    group: Any,
    axis_name: Any,
    *,
    lib: str,
    xp: Namespace,
) -> tuple[Array, Array]:
    """The call on its library's collectives: a torch.distributed group, or a JAX mesh axis."""
    if lib == "torch":
        if axis_name is not None:
            msg = (
                "expected axis_name=None for torch tensors (their ranks are a torch.distributed "
                f"group=), got axis_name={axis_name!r}"
            )
            raise ValueError(msg)
        from ._torch import torch_attention

        out, lse, stats = torch_attention(q, k, v, setup, group, xp)
        _LAST[:] = [stats]
    elif lib == "jax":
        if group is not None:
            msg = (
                "expected group=None for JAX arrays (their ranks are a mesh axis, axis_name=), "
                f"got group={group!r}"
            )
            raise ValueError(msg)
        from ._jax import jax_attention

        out, lse = jax_attention(q, k, v, setup, axis_name, xp)
    else:
        msg = (
            "portattn.parallel.attention needs torch tensors (with a torch.distributed group) "
            f"or JAX arrays (inside jax.shard_map, with axis_name=), got {lib} arrays"
        )
        raise TypeError(msg)
    return out, lse


def _setup(
    strategy: object, layout: object, variant: Variant, scale: object, block_size: object
) -> Setup:
    """The call's own arguments checked, beside its options (the variant, checked already)."""
    return Setup(
        strategy=str(strategy),
        layout=check_layout(layout),
        variant=variant,
        scale=None if scale is None else check_finite_scale(scale),
        block_size=None
        if block_size is None
        else check_int_pair("block_size", block_size, minimum=1),
    )
