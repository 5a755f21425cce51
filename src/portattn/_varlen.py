"""Packed variable-length batches (flash-attn's layout) and paged K/V (vLLM's, FlashInfer's).

A packed batch concatenates S sequences along one axis: ``q`` is (Tq, H, d),
``k`` and ``v`` are (Tk, Hkv, d), and ``cu_seqlens_q`` / ``cu_seqlens_k``
(length S + 1, from 0) say where each sequence starts. Attention is a
documents mask over the packed axis, but one whose tiles are known from the
offsets alone: sequence ``i`` is the block ``[q_i, q_{i+1}) x [k_i, k_{i+1})``
and nothing outside it is visible. So no mask is built and no ``mask_mod``
is called: each sequence runs as its own problem, on its own tiles, through
the same paths (and the same blockwise forward and backward) as
:func:`~portattn.attention`, and the work is the sum of the sequences' own
tiles, never ``T^2``.

Tiles start at each sequence's first query and first key, not at packed
offsets, and a sequence's problem has the same shape whatever else is
packed with it. That is what makes a sequence's output rows bit-identical to
the same sequence computed alone, whatever its neighbours (see the Serving
page): a grid over the packed axis would cut a sequence's keys at
positions that depend on the sequences before it, and change the order of
its sums.

``batch_invariant=False`` trades that guarantee for speed where many short
sequences share a call (a decode step): the whole packed batch runs as one
call, with a dense block-diagonal mask whose blocks are each sequence's own
pattern (``Structure``, as its own call resolves it), and a paged batch's
pages are gathered with one ``take``. The values agree within rounding; the
bound on the mask (``_FUSED_MAX`` pairs) keeps it from growing as ``T^2``, and
a batch of long sequences, whose blocks leave most pairs out, runs per sequence
(``_worth_fusing``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from collections.abc import Sequence
from typing import Literal, cast, overload

import numpy as np

from ._attention import Impl, attend
from ._core._masks import Causal, Structure
from ._core._modspec import ScoreMod
from ._core._prepare import forget_kernel_masks
from ._core._variant import Variant, build_variant
from ._lib._checks import check_array, check_flag, check_int, dtype_name, shown
from ._lib._compat import (
    all_finite,
    array_namespace,
    device_of,
    is_concrete,
    namespace_library,
)
from ._lib._convert import to_numpy
from ._lib._precision import compute_dtype
from ._lib._typing import Array, Namespace

__all__ = ["attention_varlen", "host_offsets", "paged_attention", "varlen_heads_first"]

_NAMES = ("q", "k", "v", "sinks")


# The type checkers' view: the return type follows return_lse (an array, or the
# (output, lse) pair), so `out.shape` and `out, lse = ...` both check.
@overload
def attention_varlen(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: Causal = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: Literal[False] = False,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> Array: ...


@overload
def attention_varlen(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: Causal = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: Literal[True],
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> tuple[Array, Array]: ...


@overload
def attention_varlen(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: Causal = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: bool = False,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> Array | tuple[Array, Array]: ...


def attention_varlen(
    q: Array,
    k: Array,
    v: Array,
    /,
    *,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: Causal = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: bool = False,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> Array | tuple[Array, Array]:
    """Attention over a packed batch of sequences of different lengths (flash-attn's varlen).

    Sequence ``i`` holds query rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``
    and key rows ``cu_seqlens_k[i]:cu_seqlens_k[i+1]``, and attends only
    within itself, exactly as :func:`attention` on that sequence alone.

    Parameters
    ----------
    q : array, shape (Tq, H, d)
        The sequences' queries, concatenated.
    k : array, shape (Tk, Hkv, d)
        Their keys; ``H`` a multiple of ``Hkv`` (grouped-query attention).
    v : array, shape (Tk, Hkv, dv)
        Their values.
    cu_seqlens_q, cu_seqlens_k : integer array or sequence of ints, length S + 1
        Cumulative lengths: start at 0, non-decreasing, last entry ``Tq``
        (``Tk``). Read on the host (a JAX tracer is refused: pass them as
        static values under ``jax.jit``).
    max_seqlen_q, max_seqlen_k : int, optional
        flash-attn's bounds on the longest sequence; checked if given.
    causal : {False, True, "top_left", "bottom_right"}, optional
        As in :func:`attention`, per sequence: ``True`` needs every
        sequence's query and key lengths to be equal; otherwise choose
        ``"bottom_right"`` (flash-attn's alignment, for decode and chunked
        prefill) or ``"top_left"``.
    window, scale, softcap, sinks
        As in :func:`attention`; ``sinks`` has shape (H,).
    score_mod : callable, optional
        ``score_mod(score, b, h, q_idx, kv_idx)``, where ``b`` is the
        sequence's index and ``q_idx``, ``kv_idx`` are positions *within*
        the sequence.
    return_lse : bool, optional
        Also return the log-sum-exp, shape (H, Tq), as flash-attn does.
    impl, block_size
        As in :func:`attention`, for each sequence.
    batch_invariant : bool, optional
        ``True`` (the default): each sequence runs as its own call, and its
        rows are bit-identical to :func:`attention` on it alone, whatever
        else is packed with it. ``False``: a batch of at most ``2**22``
        (query, key) pairs in all, without a ``score_mod``, runs as one call
        with a block-diagonal mask built from the offsets, much faster for
        many short sequences (decode steps), equal to the default within
        rounding but not bit for bit; larger batches run per sequence, and
        so do batches whose blocks are so sparse that the pairs the one
        call computes for nothing cost more than the calls it saves (long
        sequences), and a batch whose output is not finite (an inf or NaN key or
        value, which the one call could spread to the other sequences),
        where the output's values can be read: eager NumPy, torch,
        CuPy and JAX. Under ``jax.jit``, ``torch.compile`` or on dask
        arrays nothing is read, so the one call stands, and such a key or
        value hidden from a row may still make it NaN (a kernel reads its
        score; the materialising path weighs it by 0, and ``0 * inf`` is NaN).

    Returns
    -------
    array, shape (Tq, H, dv)
        The output, in ``q``'s layout; ``(output, lse)`` if ``return_lse``.

    Raises
    ------
    TypeError
        Offsets of a non-integer dtype; inputs that :func:`attention` refuses.
    ValueError
        Offsets that do not start at 0, decrease, end elsewhere than at the
        packed length, or count different numbers of sequences for ``q`` and
        ``k``; ``causal=True`` where a sequence's lengths differ (the error
        names the sequence).

    Notes
    -----
    Gradients (torch autograd, ``jax.grad``) reach ``q``, ``k``, ``v``,
    ``sinks`` and the tensors a ``score_mod`` captures, and are
    deterministic: each sequence's backward is :func:`attention`'s.

    A sequence's rows are bit-identical to :func:`attention` on that
    sequence alone, and so do not depend on the other sequences packed
    with it.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> q = k = v = np.ones((5, 2, 4))  # two sequences: 2 and 3 tokens
    >>> out, lse = pa.attention_varlen(
    ...     q, k, v, cu_seqlens_q=[0, 2, 5], cu_seqlens_k=[0, 2, 5], causal=True, scale=0.0,
    ...     return_lse=True,
    ... )
    >>> out.shape, lse.shape
    ((5, 2, 4), (2, 5))
    >>> bool(np.allclose(np.exp(lse[0]), [1, 2, 1, 2, 3]))  # each row sees its own prefix
    True
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_array(name, x)
    xp = array_namespace(q, k, v, sinks, names=_NAMES)
    _check_packed(q, k, v)
    starts_q, starts_k = _offset_pair(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )
    variant = build_variant(
        causal=causal, window=window, softcap=softcap, score_mod=score_mod, sinks=sinks
    )
    options: dict[str, object] = {"scale": scale, "impl": impl, "block_size": block_size}
    qh, kh, vh = (_heads_first(x, xp=xp) for x in (q, k, v))  # one view each, cut per sequence
    got = _packed_heads_first(
        qh, kh, vh, starts_q, starts_k, variant=variant, options=options, return_lse=return_lse,
        batch_invariant=batch_invariant, xp=xp,
    )  # fmt: skip
    return _packed_layout(got, xp=xp)


def varlen_heads_first(
    qh: Array,
    kh: Array,
    vh: Array,
    /,
    *,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    causal: Causal = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Array | None = None,
    impl: Impl = "auto",
    batch_invariant: bool = True,
) -> Array:
    """:func:`attention_varlen` on heads-first arrays, (1, H, Tq, d): the output (1, H, Tq, dv).

    For the transformers adapter, whose model hands over ``(1, H, T, d)``
    and takes the output back token-major: the packed layout's permutes
    both ways cost a decode step more than its checks. The caller has
    checked the heads; the ranks, the offsets, the options and the call are
    checked here as :func:`attention_varlen` checks them.
    """
    for name, x in (("q", qh), ("k", kh), ("v", vh)):
        check_array(name, x)
    _check_packed(qh, kh, vh, heads_first=True)
    xp = array_namespace(qh, kh, vh, sinks, names=_NAMES)
    starts_q, starts_k = _offset_pair(cu_seqlens_q, cu_seqlens_k, qh.shape[2], kh.shape[2])
    variant = build_variant(causal=causal, window=window, softcap=softcap, sinks=sinks)
    options: dict[str, object] = {"scale": scale, "impl": impl, "block_size": None}
    got = _packed_heads_first(
        qh, kh, vh, starts_q, starts_k, variant=variant, options=options, return_lse=False,
        batch_invariant=batch_invariant, xp=xp,
    )  # fmt: skip
    return cast("Array", got)


def _offset_pair(
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    tq: int,
    tk: int,
    max_seqlen_q: object = None,
    max_seqlen_k: object = None,
) -> tuple[list[int], list[int]]:
    """Both offsets on the host, checked, counting the same sequences (one empty one for none)."""
    starts_q = host_offsets("cu_seqlens_q", cu_seqlens_q, total=tq, bound=max_seqlen_q)
    starts_k = host_offsets("cu_seqlens_k", cu_seqlens_k, total=tk, bound=max_seqlen_k)
    if len(starts_q) != len(starts_k):
        msg = (
            "expected cu_seqlens_q and cu_seqlens_k to count the same sequences, got "
            f"{len(starts_q) - 1} and {len(starts_k) - 1} (lengths {len(starts_q)} and "
            f"{len(starts_k)})"
        )
        raise ValueError(msg)
    if len(starts_q) == 1:  # no sequence: one empty one, so that every option is still checked
        return [0, 0], [0, 0]
    return starts_q, starts_k


def _packed_heads_first(
    qh: Array,
    kh: Array,
    vh: Array,
    starts_q: list[int],
    starts_k: list[int],
    *,
    variant: Variant,
    options: dict[str, object],
    return_lse: object,
    batch_invariant: object,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """The packed call on heads-first arrays: one fused call, or one call per sequence."""
    tq, tk = qh.shape[2], kh.shape[2]
    width = qh.shape[-1] + vh.shape[-1]
    if _fuses(batch_invariant, variant, tq, tk, len(starts_q) - 1) and _worth_fusing(
        starts_q, starts_k, heads=qh.shape[1], width=width, tk=tk
    ):
        spans = [(a, b - a) for a, b in itertools.pairwise(starts_k)]
        return run_fused(
            qh, kh, vh, starts_q, spans, variant=variant, options=options, return_lse=return_lse,
            xp=xp,
        )  # fmt: skip
    kvs = [(kh[..., a:b, :], vh[..., a:b, :]) for a, b in itertools.pairwise(starts_k)]
    return run_sequences(
        qh, starts_q, kvs, variant=variant, options=options, return_lse=return_lse, xp=xp
    )


def _packed_layout(
    got: Array | tuple[Array, Array], *, xp: Namespace
) -> Array | tuple[Array, Array]:
    """A heads-first result, (1, H, Tq, dv) (and the lse), in the packed layout (Tq, H, dv)."""
    if isinstance(got, tuple):
        return xp.permute_dims(got[0][0, ...], (1, 0, 2)), got[1]
    return xp.permute_dims(got[0, ...], (1, 0, 2))


def run_sequences(
    qh: Array,
    starts_q: list[int],
    kvs: list[tuple[Array, Array]],
    *,
    variant: Variant,
    options: dict[str, object],
    return_lse: object,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """Each sequence's :func:`attention`, packed back heads first: (1, H, Tq, dv), lse (H, Tq).

    ``qh`` holds the queries heads first, (1, H, Tq, d) (:func:`_heads_first`
    of the packed layout), cut at ``starts_q`` (at least one sequence, so
    that :func:`attention` checks every option); ``kvs`` each sequence's
    keys and values, (1, Hkv, Lk_i, d). ``variant`` holds the call's options (its
    ``score_mod`` sees ``b`` as the sequence's index), ``options`` the scale
    and how to run.
    """
    want_lse = check_flag("return_lse", return_lse)
    spans = list(itertools.pairwise(starts_q))
    outs, lses = [], []
    score_mod = variant.score_mod
    for i, ((a, b), (ki, vi)) in enumerate(zip(spans, kvs, strict=True)):
        if score_mod is not None:
            mod = functools.partial(_in_sequence, score_mod, i)
            variant = dataclasses.replace(variant, score_mod=mod)
        try:
            got = attend(
                qh[..., a:b, :],  # (1, H, Lq_i, d); an ellipsis indexes torch faster
                ki,
                vi,
                variant=variant,
                return_lse=want_lse,  # the lse costs a pass, and keeps torch off SDPA
                xp=xp,
                **options,
            )
        except ValueError as e:
            msg = f"sequence {i} (Lq={b - a}, Lk={ki.shape[2]}): {e}"
            raise ValueError(msg) from e
        out: Array = got[0] if want_lse else got
        outs.append(out)  # (1, H, Lq_i, dv)
        if want_lse:
            lses.append(got[1][0, ...])  # (H, Lq_i)
    out = outs[0] if len(outs) == 1 else xp.concat(outs, axis=2)  # (1, H, Tq, dv)
    if not want_lse:
        return out
    return out, (lses[0] if len(lses) == 1 else xp.concat(lses, axis=-1))


def _in_sequence(score_mod: ScoreMod, index: int, s: Array, b: Array, *idx: Array) -> Array:
    """``score_mod`` seeing ``b`` as the sequence's index in the packed batch."""
    return score_mod(s, b + index, *idx)


def _heads_first(x: Array, *, xp: Namespace) -> Array:
    """(L, H, d) to (1, H, L, d): a view, no copy."""
    return xp.permute_dims(x, (1, 0, 2))[None, ...]


def _check_packed(q: Array, k: Array, v: Array, *, heads_first: bool = False) -> None:
    """Ranks and the shared sizes of the packed layout; :func:`attention` checks the rest.

    ``heads_first``: the layout of :func:`varlen_heads_first`, one row (1, H, T, d).
    """
    lead, rank, shared = ("1, ", 4, "(1, Hkv, Tk)") if heads_first else ("", 3, "(Tk, Hkv)")
    layouts = ("Tq, H, d", "Tk, Hkv, d", "Tk, Hkv, dv")
    if heads_first:
        layouts = ("H, Tq, d", "Hkv, Tk, d", "Hkv, Tk, dv")
    for name, x, layout in zip(("q", "k", "v"), (q, k, v), layouts, strict=True):
        if x.ndim != rank or (heads_first and x.shape[0] != 1):
            msg = f"expected {name} to be {rank}-D ({lead}{layout}), got shape {tuple(x.shape)}"
            raise ValueError(msg)
    if k.shape[: rank - 1] != v.shape[: rank - 1]:
        msg = (
            f"expected k and v to share {shared}, got shapes {tuple(k.shape)} and {tuple(v.shape)}"
        )
        raise ValueError(msg)


def host_offsets(name: str, offsets: object, *, total: int, bound: object = None) -> list[int]:
    """``offsets`` (cumulative lengths) as Python ints, checked against the packed length."""
    values = _host_ints(name, offsets)
    if not values:
        msg = f"expected {name} to hold S + 1 >= 1 offsets, got an empty one"
        raise ValueError(msg)
    if values[0] != 0:
        msg = f"expected {name} to start at 0, got {values[0]}"
        raise ValueError(msg)
    if any(map(operator.gt, values, values[1:])):  # one C loop; the error names the entries
        i = next(i for i, (a, b) in enumerate(itertools.pairwise(values)) if b < a)
        a, b = values[i], values[i + 1]
        msg = f"expected {name} to be non-decreasing, got {a} then {b} at entries {i}, {i + 1}"
        raise ValueError(msg)
    if values[-1] != total:
        msg = f"expected {name} to end at the packed length {total}, got {values[-1]}"
        raise ValueError(msg)
    if bound is not None:
        longest = max((b - a for a, b in itertools.pairwise(values)), default=0)
        limit = check_int(name.replace("cu_seqlens", "max_seqlen"), bound, minimum=0)
        if longest > limit:
            msg = (
                f"expected {name.replace('cu_seqlens', 'max_seqlen')} to bound every "
                f"sequence's length, got {limit} for a sequence of {longest}"
            )
            raise ValueError(msg)
    return values


_INT = {int}


def _host_ints(name: str, x: object) -> list[int]:
    """A 1-D integer array (any library) or a sequence of ints, as Python ints."""
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        if set(map(type, x)) <= _INT:  # the adapters' offsets: nothing to convert
            return list(x)
        return [check_int(f"{name}[{i}]", n) for i, n in enumerate(x)]
    if not (hasattr(x, "dtype") and hasattr(x, "shape")):
        msg = f"expected {name} to be a 1-D integer array, got {shown(x)}"
        raise TypeError(msg)
    xq = array_namespace(x)
    if not xq.isdtype(x.dtype, "integral"):
        msg = f"expected {name} to be a 1-D integer array (int32), got dtype {dtype_name(x.dtype)}"
        raise TypeError(msg)
    if len(x.shape) != 1:
        msg = f"expected {name} to be a 1-D integer array, got shape {tuple(x.shape)}"
        raise ValueError(msg)
    if not is_concrete(x):
        msg = (
            f"expected {name} to hold values readable now (the sequences are laid out on the "
            "host), got a traced or lazy array; under jax.jit pass it as a static argument"
        )
        raise ValueError(msg)
    return [int(n) for n in to_numpy(x).tolist()]


# The type checkers' view: the return type follows return_lse (an array, or the
# (output, lse) pair), so `out.shape` and `out, lse = ...` both check.
@overload
def paged_attention(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    /,
    *,
    block_table: object,
    seq_lens: object,
    cu_seqlens_q: object,
    causal: Causal = "bottom_right",
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: Literal[False] = False,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> Array: ...


@overload
def paged_attention(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    /,
    *,
    block_table: object,
    seq_lens: object,
    cu_seqlens_q: object,
    causal: Causal = "bottom_right",
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: Literal[True],
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> tuple[Array, Array]: ...


@overload
def paged_attention(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    /,
    *,
    block_table: object,
    seq_lens: object,
    cu_seqlens_q: object,
    causal: Causal = "bottom_right",
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: bool = False,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> Array | tuple[Array, Array]: ...


def paged_attention(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    /,
    *,
    block_table: object,
    seq_lens: object,
    cu_seqlens_q: object,
    causal: Causal = "bottom_right",
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Array | None = None,
    return_lse: bool = False,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    batch_invariant: bool = True,
) -> Array | tuple[Array, Array]:
    """Attention of packed queries over keys and values held in pages (vLLM's, FlashInfer's layout).

    Sequence ``i`` owns the pages ``block_table[i, :n_i]``, with
    ``n_i = ceil(seq_lens[i] / page_size)``; its keys are the first
    ``seq_lens[i]`` slots of those pages, in order. Its queries,
    ``q[cu_seqlens_q[i]:cu_seqlens_q[i+1]]``, are its *last* tokens:
    one per sequence for decode, several for chunked prefill.

    Parameters
    ----------
    q : array, shape (Tq, H, d)
        Packed queries.
    k_pages : array, shape (num_pages, page_size, Hkv, d)
        The key pages.
    v_pages : array, shape (num_pages, page_size, Hkv, dv)
        The value pages.
    block_table : integer array, shape (S, max_pages)
        Each sequence's pages; entries past its ``n_i`` are never read.
    seq_lens : integer array, shape (S,)
        Each sequence's number of keys (its context, new tokens included).
    cu_seqlens_q : integer array, length S + 1
        Where each sequence's queries start in ``q``.
    causal : {"bottom_right", "top_left", True, False}, optional
        Default ``"bottom_right"``: the queries are the sequence's last tokens.
    window, scale, softcap, score_mod, sinks, return_lse, impl, block_size, batch_invariant
        As in :func:`attention_varlen`; with ``batch_invariant=False``, the
        sequences' pages are read with one ``take``.

    Returns
    -------
    array, shape (Tq, H, dv)
        ``(output, lse)`` with lse (H, Tq) if ``return_lse``.

    Raises
    ------
    ValueError
        A sequence longer than its pages, a page index outside the pool,
        or shapes that do not fit.

    Notes
    -----
    Pages are read with ``take`` on the sequence's own page indices only, so
    no tile ever reads a page the sequence does not own; each sequence then
    runs as :func:`attention` does alone, so its rows equal that call's.
    With ``batch_invariant=False``, a decode step (one query per sequence, no
    window) runs as one padded batch whose rows still read only their own
    pages; other calls run as one call over every sequence's pages, in which
    the mask hides the other sequences' keys.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> pages = np.arange(4 * 2 * 1 * 1, dtype=np.float64).reshape(4, 2, 1, 1)
    >>> q = np.zeros((2, 1, 1))  # one decode query per sequence
    >>> out = pa.paged_attention(
    ...     q, pages, pages, block_table=np.array([[3, 0], [1, 2]]), seq_lens=[3, 1],
    ...     cu_seqlens_q=[0, 1, 2],
    ... )  # sequence 0 sees keys 6, 7, 0; sequence 1 sees 2
    >>> out[:, 0, 0].tolist()
    [4.333333333333333, 2.0]
    """
    for name, x in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        check_array(name, x)
    xp = array_namespace(q, k_pages, v_pages, sinks, names=("q", "k_pages", "v_pages", "sinks"))
    _check_pages(q, k_pages, v_pages)
    starts_q = host_offsets("cu_seqlens_q", cu_seqlens_q, total=q.shape[0])
    lens = _host_ints("seq_lens", seq_lens)
    table = _host_table(block_table, len(starts_q) - 1, lens)
    if not table:  # no sequence: one empty one, so that every option is still checked
        starts_q, table, lens = [0, 0], [[]], [0]
    pages = _own_pages(table, lens, k_pages.shape[0], k_pages.shape[1])
    variant = build_variant(
        causal=causal, window=window, softcap=softcap, score_mod=score_mod, sinks=sinks
    )
    options: dict[str, object] = {"scale": scale, "impl": impl, "block_size": block_size}
    slots = sum(map(len, pages)) * k_pages.shape[1]
    if _fuses(batch_invariant, variant, q.shape[0], slots, len(pages)):
        if starts_q == list(range(len(pages) + 1)) and variant.window is None and min(lens) > 0:
            return run_decode(
                q, k_pages, v_pages, pages, lens, variant=variant, options=options,
                return_lse=return_lse, xp=xp,
            )  # fmt: skip
        k, v, spans = _gather_all(k_pages, v_pages, pages, lens, xp=xp)
        qh, kh, vh = (_heads_first(x, xp=xp) for x in (q, k, v))
        got = run_fused(
            qh, kh, vh, starts_q, spans, variant=variant, options=options,
            return_lse=return_lse, xp=xp,
        )  # fmt: skip
        return _packed_layout(got, xp=xp)
    kvs = _gather(k_pages, v_pages, pages, lens, xp=xp)
    got = run_sequences(
        _heads_first(q, xp=xp), starts_q, kvs, variant=variant, options=options,
        return_lse=return_lse, xp=xp,
    )  # fmt: skip
    return _packed_layout(got, xp=xp)


def _check_pages(q: Array, k_pages: Array, v_pages: Array) -> None:
    if q.ndim != 3:
        msg = f"expected q to be 3-D (Tq, H, d), got shape {tuple(q.shape)}"
        raise ValueError(msg)
    for name, x in (("k_pages", k_pages), ("v_pages", v_pages)):
        if x.ndim != 4:
            msg = (
                f"expected {name} to be 4-D (num_pages, page_size, Hkv, d), "
                f"got shape {tuple(x.shape)}"
            )
            raise ValueError(msg)
    if k_pages.shape[:3] != v_pages.shape[:3]:
        msg = (
            "expected k_pages and v_pages to share (num_pages, page_size, Hkv), got shapes "
            f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}"
        )
        raise ValueError(msg)


def _host_table(block_table: object, count: int, lens: list[int]) -> list[list[int]]:
    """Each sequence's own page indices (only the pages its length needs), checked."""
    if hasattr(block_table, "dtype") and hasattr(block_table, "shape"):
        xq = array_namespace(block_table)
        if not xq.isdtype(block_table.dtype, "integral") or len(block_table.shape) != 2:
            msg = (
                "expected block_table to be a 2-D integer array (S, max_pages), got "
                f"{dtype_name(block_table.dtype)} of shape {tuple(block_table.shape)}"
            )
            raise TypeError(msg)
        rows = [[int(n) for n in row] for row in to_numpy(block_table).tolist()]
    else:
        rows = [list(map(int, row)) for row in block_table]  # type: ignore[attr-defined]
    if len(rows) != count or len(lens) != count:
        msg = (
            f"expected block_table and seq_lens to have one entry per sequence ({count}, "
            f"from cu_seqlens_q), got {len(rows)} and {len(lens)}"
        )
        raise ValueError(msg)
    return rows


def _own_pages(
    table: list[list[int]], lens: list[int], num_pages: int, page_size: int
) -> list[list[int]]:
    """Each sequence's pages, only those its length needs, checked against the pool."""
    out = []
    for i, (row, n) in enumerate(zip(table, lens, strict=True)):
        need = -(-n // page_size) if n > 0 else 0
        if n < 0 or need > len(row):
            msg = (
                f"expected sequence {i}'s seq_lens ({n}) to fit its block_table row of "
                f"{len(row)} pages of {page_size}"
            )
            raise ValueError(msg)
        pages = row[:need]
        bad = [p for p in pages if not 0 <= p < num_pages]
        if bad:
            msg = f"expected sequence {i}'s pages to lie in [0, {num_pages}), got {bad[0]}"
            raise ValueError(msg)
        out.append(pages)
    return out


def _gather(
    k_pages: Array, v_pages: Array, pages: list[list[int]], lens: list[int], *, xp: Namespace
) -> list[tuple[Array, Array]]:
    """Each sequence's keys and values, (1, Hkv, L_i, d), taken from its own pages only."""
    page_size = k_pages.shape[1]
    out = []
    for own, n in zip(pages, lens, strict=True):
        index = xp.asarray(own, dtype=xp.int32, device=device_of(k_pages))
        rest = tuple(k_pages.shape[2:])
        k = xp.reshape(xp.take(k_pages, index, axis=0), (len(own) * page_size, *rest))[:n, ...]
        vrest = tuple(v_pages.shape[2:])
        v = xp.reshape(xp.take(v_pages, index, axis=0), (len(own) * page_size, *vrest))[:n, ...]
        out.append((_heads_first(k, xp=xp), _heads_first(v, xp=xp)))
    return out


def _gather_all(
    k_pages: Array, v_pages: Array, pages: list[list[int]], lens: list[int], *, xp: Namespace
) -> tuple[Array, Array, list[tuple[int, int]]]:
    """Every sequence's own pages in one ``take``, packed, and each one's (first slot, length).

    A sequence's slots past its length stay in the packed keys; the fused
    call's mask hides them, as it hides the other sequences' keys.
    """
    page_size = k_pages.shape[1]
    flat = [p for own in pages for p in own]
    index = xp.asarray(flat, dtype=xp.int32, device=device_of(k_pages))
    k = xp.reshape(xp.take(k_pages, index, axis=0), (len(flat) * page_size, *k_pages.shape[2:]))
    v = xp.reshape(xp.take(v_pages, index, axis=0), (len(flat) * page_size, *v_pages.shape[2:]))
    firsts = itertools.accumulate((len(own) * page_size for own in pages), initial=0)
    return k, v, list(zip(firsts, lens, strict=False))


def _block_diagonal(
    starts_q: list[int], spans_k: list[tuple[int, int]], tk: int, variant: Variant
) -> tuple[np.ndarray, bool]:
    """The (Tq, Tk) mask of the fused call, each sequence's own pattern in its block, and a fact.

    Each sequence's alignment and window come from ``Structure.build``, as its
    own call would resolve them; each query row then sees one range of key
    slots, and the (Tq, Tk) pairs are compared with those ranges in one pass.
    The fact: whether every query row sees at least one key (its range is
    not empty), which the offsets decide whatever the arrays hold.
    """
    causal, windowed = variant.causal is not False, variant.window is not None
    if not windowed and variant.causal in _EVERY_KEY and starts_q == list(range(len(spans_k) + 1)):
        # A decode step: one query per sequence, which sees every key of its own
        # (bottom-right causal hides none from the last query; Structure.build
        # refuses nothing here).
        los = [first for first, _ in spans_k]
        his = [first + n for first, n in spans_k]
        return _ranges(los, his, tk)
    resolved = []  # per sequence: (offset, left, right)
    for i, ((a, b), (_, lk)) in enumerate(zip(itertools.pairwise(starts_q), spans_k, strict=True)):
        try:
            resolved.append(_resolved(b - a, lk, variant.causal, variant.window))
        except ValueError as e:
            msg = f"sequence {i} (Lq={b - a}, Lk={lk}): {e}"
            raise ValueError(msg) from e
    # Sequence i's keys are the slots [first, first + n); its row r is
    # aligned with the slot first + r + offset, which cuts its range. Per
    # row at once: each sequence's facts repeated over its rows.
    rows = np.asarray([b - a for a, b in itertools.pairwise(starts_q)], dtype=np.int64)
    facts = [(f, lk, *r) for (f, lk), r in zip(spans_k, resolved, strict=True)]
    per_seq = np.asarray(facts, dtype=np.int64).reshape(-1, 5)
    first, n, offset, left, right = np.repeat(per_seq, rows, axis=0).T
    r = np.arange(starts_q[-1] - starts_q[0]) - np.repeat(rows.cumsum() - rows, rows)
    aligned = first + offset + r
    lo, hi = first, first + n
    if causal:
        hi = np.minimum(hi, aligned + 1)
    if windowed:
        lo, hi = np.maximum(lo, aligned - left), np.minimum(hi, aligned + right + 1)
    return _ranges(lo, hi, tk)


# The causal values under which a sequence's one query sees every key it holds.
_EVERY_KEY = (False, "bottom_right")


def _ranges(
    los: list[int] | np.ndarray, his: list[int] | np.ndarray, tk: int
) -> tuple[np.ndarray, bool]:
    """The (rows, tk) mask of rows that see the slots ``[lo, hi)``, and whether none is empty."""
    lo_rows, hi_rows = np.asarray(los, dtype=np.int64), np.asarray(his, dtype=np.int64)
    slot = np.arange(tk)
    allowed: np.ndarray = (slot >= lo_rows[:, None]) & (slot < hi_rows[:, None])
    return allowed, bool(np.all(hi_rows > lo_rows))


@functools.lru_cache(maxsize=4096)
def _resolved(
    lq: int, lk: int, causal: bool | str, window: tuple[int, int] | None
) -> tuple[int, int, int]:
    """A sequence's ``(offset, left, right)`` as ``Structure.build`` resolves it (its errors too).

    Memoised: a decode step's sequences repeat the lengths of earlier steps'.
    """
    s = Structure.build(lq, lk, causal, window)  # type: ignore[arg-type]
    left, right = s.window if s.window is not None else (0, 0)
    return s.offset, left, right


def run_decode(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    pages: list[list[int]],
    lens: list[int],
    *,
    variant: Variant,
    options: dict[str, object],
    return_lse: object,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """One decode query per sequence, as one padded batch: (S, Hkv, pages * page_size, d) K/V.

    Each sequence's row repeats its own last page up to the longest row, so
    it reads only pages it owns, and ``key_lengths`` hides the slots past its
    length. Its one query sees every key it holds (bottom-right alignment).
    """
    want_lse = check_flag("return_lse", return_lse)
    width, page = max(map(len, pages)), k_pages.shape[1]
    flat = [p for own in pages for p in (*own, *[own[-1]] * (width - len(own)))]
    index = xp.asarray(flat, dtype=xp.int32, device=device_of(k_pages))

    def batched(x: Array) -> Array:  # (S, Hkv, width * page, d)
        rows = xp.reshape(xp.take(x, index, axis=0), (len(pages), width * page, *x.shape[2:]))
        return xp.permute_dims(rows, (0, 2, 1, 3))

    lengths = xp.asarray([[n] for n in lens], dtype=xp.int32, device=device_of(q))
    padded = build_variant(key_lengths=lengths, softcap=variant.softcap, sinks=variant.sinks)
    got = attend(
        q[:, :, None, :], batched(k_pages), batched(v_pages), variant=padded,
        return_lse=want_lse, xp=xp, **options,
    )  # fmt: skip
    if not want_lse:
        return cast("Array", got)[:, :, 0, :]  # (S, H, dv): the packed layout, one row each
    return got[0][:, :, 0, :], xp.permute_dims(got[1][..., 0], (1, 0))  # lse (H, S)


# The fused call's dense mask: at most this many (query, key) pairs (4 MiB of booleans).
_FUSED_MAX = 1 << 22

# The last fused variants (their masks on their device): a model's layers
# repeat one step's offsets (one mask per layer type), so a step builds each once.
_MASKS: dict[tuple[object, ...], Variant] = {}
_MASKS_MAX = 4


def _fused_variant(
    starts_q: list[int],
    spans_k: list[tuple[int, int]],
    tk: int,
    variant: Variant,
    *,
    additive: object,
    like: Array,
    xp: Namespace,
) -> Variant:
    """The fused call's variant: :func:`_block_diagonal`'s mask on ``like``'s device, and its fact.

    The mask is (1, 1, Tq, Tk), the layout ``prepare`` gives it anyway; with
    ``additive`` (a dtype: the kernel's compute dtype) it is the bias a
    kernel adds in its place, 0 where a pair is allowed and ``-inf``
    elsewhere (:func:`_kernel_first`). ``rows_see_keys`` is set where the
    offsets leave every row a key, so that the native path need not look for
    empty rows. Memoised on the offsets, the pattern, the soft cap and
    ``additive`` (``sinks``, an array, is added on each call); not in a
    trace (``jax.jit``, ``torch.compile``): its arrays must not outlive it.
    """
    device = device_of(like)
    key: tuple[object, ...] = (tuple(starts_q), tuple(spans_k), tk, variant.causal)
    key += (variant.window, variant.softcap, additive, xp, device)
    fused = _MASKS.get(key)
    if fused is None:
        allowed, sees = _block_diagonal(starts_q, spans_k, tk, variant)
        mask = bias = None
        if additive is None:
            mask = xp.asarray(allowed[None, None, ...], device=device)
        else:  # in NumPy's float32 or float64 (the compute dtypes), so that torch need not cast
            kind = np.float32 if additive == xp.float32 else np.float64
            hidden = np.where(allowed, kind(0.0), kind(-np.inf))[None, None, ...]
            bias = xp.asarray(hidden, dtype=additive, device=device)
        fused = build_variant(mask=mask, bias=bias, softcap=variant.softcap)
        if sees:  # proved from the offsets, whatever the arrays hold
            fused = dataclasses.replace(fused, rows_see_keys=True)
        if is_concrete(like):
            if len(_MASKS) >= _MASKS_MAX:
                _MASKS.clear()
                forget_kernel_masks()  # it holds masks of these variants too
            _MASKS[key] = fused
    if variant.sinks is not None:
        fused = fused.with_arrays([("sinks", variant.sinks)])
    return fused


def _fuses(batch_invariant: object, variant: Variant, tq: int, tk: int, count: int) -> bool:
    """Whether the sequences run as one masked call (``batch_invariant=False``, small, no mod)."""
    if check_flag("batch_invariant", batch_invariant):
        return False
    return count > 1 and variant.score_mod is None and tq * tk <= _FUSED_MAX


# What the fused call may spend on pairs that no sequence sees (each a score
# and a weighted value per head: heads * (d + dv) multiply-adds), per call it
# saves: about what a call costs beside its kernel (torch 2.13's SDPA on 2 CPU
# threads, the serving bench's tiny Llama: 4 heads, d = dv = 16). A decode
# step of 16 sequences then fuses up to 8192 keys in all; a chunked prefill of
# 256 tokens over long prompts (continuous_long) runs per sequence.
_FUSED_WASTE_PER_CALL = 1 << 20


def _worth_fusing(
    starts_q: list[int], starts_k: list[int], *, heads: int, width: int, tk: int
) -> bool:
    """Whether one masked call over the packed row costs less than a call per sequence.

    The fused call computes every (query, key) pair of the packed row, a
    call per sequence only its own: one call wins while the pairs it wastes
    cost less than the calls it saves (:data:`_FUSED_WASTE_PER_CALL`).
    """
    budget = (len(starts_q) - 2) * _FUSED_WASTE_PER_CALL
    if heads * width * starts_q[-1] * tk <= budget:  # even were every pair wasted
        return True
    spans_q, spans_k = itertools.pairwise(starts_q), itertools.pairwise(starts_k)
    own = sum((b - a) * (d - c) for (a, b), (c, d) in zip(spans_q, spans_k, strict=True))
    waste = starts_q[-1] * tk - own
    return heads * width * waste <= budget


def run_fused(
    qh: Array,
    kh: Array,
    vh: Array,
    starts_q: list[int],
    spans_k: list[tuple[int, int]],
    *,
    variant: Variant,
    options: dict[str, object],
    return_lse: object,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """Every sequence in one call on the packed row, a block-diagonal mask from the offsets.

    Heads first, in and out: ``qh`` is (1, H, Tq, d), ``kh`` and ``vh`` are
    (1, Hkv, Tk, d); the output (1, H, Tq, dv), the lse (H, Tq). Sequence
    ``i``'s queries are the rows ``starts_q[i]:starts_q[i+1]`` and its keys
    the ``n`` rows from ``spans_k[i] = (first, n)``; its block of the mask
    is the pattern its own call would use (``Structure``: causal alignment
    and window per sequence), so it sees what it sees alone.
    """
    want_lse = check_flag("return_lse", return_lse)
    kernel = _kernel_first(variant, options, want_lse, xp=xp)
    additive = compute_dtype(qh.dtype, xp=xp) if kernel else None
    fused = _fused_variant(
        starts_q, spans_k, kh.shape[2], variant, additive=additive, like=qh, xp=xp
    )
    got = attend(
        qh, kh, vh, variant=fused, return_lse=want_lse, xp=xp, **(options | kernel)
    )  # fmt: skip
    out: Array = got[0] if want_lse else got
    if is_concrete(out) and not all_finite(out, xp=xp):
        # A key hidden from some row may be inf or NaN, which a kernel reads
        # (NaN rows) and a materialised product weighs by 0 (0 * inf): each
        # sequence alone never sees another's keys. Only where the output
        # can be read: in a trace (jax.jit, torch.compile) or on dask, such
        # a key still reaches the other sequences' rows (documented above).
        kvs = [(kh[..., a : a + n, :], vh[..., a : a + n, :]) for a, n in spans_k]
        return run_sequences(
            qh, starts_q, kvs, variant=variant, options=options, return_lse=want_lse, xp=xp
        )
    return (out, got[1][0, ...]) if want_lse else out


def _kernel_first(
    variant: Variant, options: dict[str, object], want_lse: bool, *, xp: Namespace
) -> dict[str, object]:
    """``{"impl": "native"}`` where the fused call may skip ``impl="auto"``'s check of the keys.

    ``auto`` hands a masked call to torch's SDPA only once every key is
    finite (a reduction over all keys and a host read, per layer): the
    fused call checks its output instead (:func:`run_fused`), which is
    (Tq, H, dv), smaller than the keys in a decode step, and runs the step
    per sequence in the rare case it is not finite. A hidden inf or NaN key
    always shows there: the kernel adds ``-inf`` to its score (NaN for NaN
    or +inf) or weighs its value by 0 (``0 * inf``). In a trace
    (``torch.compile``) neither is read, as ``auto`` reads no key there.
    The kernel is then handed the mask as the bias it would turn a boolean
    mask into on every call (0 where allowed, ``-inf`` elsewhere: the same
    scores), built once per step (:func:`_fused_variant`).
    ``{}`` elsewhere: other libraries, other paths, options the kernel
    lacks (``variant``'s are the fused call's: the same soft cap and
    sinks), and the lse.
    """
    if (
        options["impl"] != "auto"
        or want_lse
        or namespace_library(xp) != "torch"
        or variant.kernel_lacks() is not None
    ):
        return {}
    return {"impl": "native"}
