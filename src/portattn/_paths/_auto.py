"""``impl="auto"``: which path a validated problem takes, decided here and nowhere else.

The entry (:func:`~portattn.attention`) asks for every call, and the dask
pair tasks ask for each tile of a chunked call, so both follow one rule.
"""

from __future__ import annotations

from collections.abc import Callable

from .._core._flex import EMPTY
from .._core._prepare import PlainPlan, plain_plan
from .._core._problem import Problem
from .._lib._precision import torch_autocast_off
from .._lib._typing import Namespace
from ._native import auto_delegates

__all__ = [
    "MATERIALIZE_ANY_LK_AT_LQ",
    "MATERIALIZE_MAX_PAIRS",
    "TORCH_MATERIALIZE_GQA_DECODE",
    "auto_impl",
    "plain_kernel",
    "plain_materializes",
    "rule_path",
]

# Below this many (query, key) pairs per batch entry, materialising the score
# matrix is cheaper than any blocking machinery.
MATERIALIZE_MAX_PAIRS = 256 * 256
# One query (a decode step) materialises against a cache of any length: its
# scores, (..., 1, Lk), are a d-th of the keys it reads, and the blocking
# machinery only adds passes. Measured (benchmarks/decode.py, "lq1"; NumPy,
# one thread): blockwise takes 1.7x to 2.0x materialize's time from Lk=32768
# to 262144.
MATERIALIZE_ANY_LK_AT_LQ = 1
# On torch a grouped decode step materialises too once its products are this
# many multiply-adds (B * H * Lk * d): torch 2.13's CPU SDPA with enable_gqa
# took 1.3x to 1.45x the materialising path's time at 2**24 to 2**26
# ((1, 32, 8, 1, 4096, 128), (8, 32, 8, 1, 2048, 128); one thread), and
# about as long at 2**22. Below, or without groups, SDPA's fixed cost is the
# smaller one (benchmarks/decode.py, "lq1").
TORCH_MATERIALIZE_GQA_DECODE = 2**24


def auto_impl(p: Problem, *, lib: str, want_lse: bool, xp: Namespace) -> str:
    """The path ``impl="auto"`` takes for ``p`` (the rule is spelled out in :func:`attention`).

    ``lib`` is ``xp``'s library name, which callers already hold. Never
    ``"invariant"`` (``_invariant``): its bits cost speed, so only a caller asks for it.
    """
    s = p.structure
    return rule_path(
        lib=lib,
        groups=p.groups,
        batch=p.batch,
        lq=s.lq,
        lk=s.lk,
        d=p.q.shape[-1],
        delegates=lambda: auto_delegates(
            p, return_lse=want_lse, materialize_max_pairs=MATERIALIZE_MAX_PAIRS, xp=xp
        ),
        empty_tiles=lambda: _has_empty_tiles(p),
    )


def rule_path(
    *,
    lib: str,
    groups: int,
    batch: tuple[int, ...],
    lq: int,
    lk: int,
    d: int,
    delegates: Callable[[], bool],
    empty_tiles: Callable[[], bool],
) -> str:
    """``auto``'s rule on a call's facts: ``"native"``, ``"blockwise"`` or ``"materialize"``.

    The one place it is written: :func:`auto_impl` asks it for a
    :class:`Problem`, and the shortcuts of a repeat plain call
    (:func:`plain_kernel`, :func:`plain_materializes`) for their memoised
    plan, so the two cannot part. ``delegates`` says whether torch's kernel
    is exact for the call (:func:`auto_delegates`) and ``empty_tiles``
    whether a block mask leaves a tile empty; each is asked only where the
    rule needs it (the first reads the keys, the second the mask's tiles).
    """
    if (
        lib == "torch"
        and not _grouped_decode(groups=groups, batch=batch, lq=lq, lk=lk, d=d)
        and delegates()
    ):
        return "native"
    if _long(lq, lk) or empty_tiles():
        return "blockwise"
    return "materialize"


def _yes() -> bool:
    return True


def _no() -> bool:
    return False


def _long(lq: int, lk: int) -> bool:
    """Whether the score matrix is too large to form whole: the blockwise path's calls."""
    return lq * lk > MATERIALIZE_MAX_PAIRS and lq > MATERIALIZE_ANY_LK_AT_LQ


def _grouped_decode(*, groups: int, batch: tuple[int, ...], lq: int, lk: int, d: int) -> bool:
    """One query per row against grouped keys large enough that materialising beats SDPA."""
    if groups == 1 or lq != MATERIALIZE_ANY_LK_AT_LQ:
        return False
    work: int = lk * d  # a decode step's multiply-adds per product: B * H * Lk * d
    for n in batch:
        work *= n
    return work >= TORCH_MATERIALIZE_GQA_DECODE


def plain_kernel(*, memo: tuple[object, ...]) -> tuple[float, int] | None:
    """``(scale, groups)`` for a repeat torch call ``auto`` sends to SDPA as it is; else ``None``.

    ``memo`` is the call's :func:`~portattn._core._prepare.plan_key`. A
    decode step makes the same plain call on every token, and its kernel
    takes about 30 us: the path through :class:`Problem`, the rule above and
    ``native_attention`` cost it as much again. A call whose memoised
    plan (:func:`plain_plan`: checked; q, k and v 4-D in the compute dtype;
    nothing hiding a pair) gets the rule's ``"native"`` here, and its
    arguments for :func:`~portattn._paths._native.plain_native`, which passes the kernel what
    ``native_attention`` would (the same bits). The kernel is exact for
    such a call (nothing is hidden, so no key is read), and it has no block
    mask. Under ``torch.autocast`` it is ``None``: the call goes the whole
    way, which turns autocast off.
    """
    plan = plain_plan(memo=memo)
    if plan is None or _plan_path(plan, lib="torch", delegates=_yes) != "native":
        return None
    scale_value, groups, *_, device = plan
    if torch_autocast_off(device) is not None:
        return None
    return scale_value, groups


def plain_materializes(*, memo: tuple[object, ...], impl: str) -> tuple[float, int] | None:
    """``(scale, groups)`` for a repeat call ``impl`` sends to the materialising path as it is.

    ``impl`` is ``"auto"`` or ``"materialize"``; ``None`` where the call is
    not a memoised plain one (:func:`plain_plan`, as for :func:`plain_kernel`)
    or ``"auto"`` takes another path for it. The caller passes q scaled, k
    and v to :func:`~portattn._paths._materialize.plain_materialize`, the
    core of ``materialize_attention`` for such a call (the same bits). For
    NumPy, whose calls :func:`auto_impl` sends to no kernel.
    """
    plan = plain_plan(memo=memo)
    if plan is None:
        return None
    if impl == "auto" and _plan_path(plan, lib="numpy", delegates=_no) != "materialize":
        return None  # auto_impl: the blockwise path
    return plan[0], plan[1]


def _plan_path(plan: PlainPlan, *, lib: str, delegates: Callable[[], bool]) -> str:
    """:func:`rule_path` on a memoised plain plan's facts (no block mask: no empty tile)."""
    _, groups, batch, s, d, _ = plan
    return rule_path(
        lib=lib,
        groups=groups,
        batch=batch,
        lq=s.lq,
        lk=s.lk,
        d=d,
        delegates=delegates,
        empty_tiles=_no,
    )


def _has_empty_tiles(p: Problem) -> bool:
    """Whether a block mask leaves some tile EMPTY: only the blockwise path never reads it.

    The materialising path forms every score, so an inf or NaN value in an
    empty tile would reach the rows it is hidden from (``0 * inf``).
    """
    mods = p.mods
    return mods is not None and EMPTY in mods.kinds_in(0, p.lq, 0, p.lk)
