"""``impl="auto"``: which path a validated problem takes, decided here and nowhere else.

The entry (:func:`~portattn.attention`) asks for every call, and the dask
pair tasks ask for each tile of a chunked call, so both follow one rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .._core._flex import EMPTY
from .._core._prepare import PlainPlan, forget_checked, plain_plan
from .._core._problem import Problem
from .._lib._precision import autocast_kind
from .._lib._typing import Namespace
from ._native import auto_delegates

__all__ = [
    "MATERIALIZE_ANY_LK_AT_LQ",
    "MATERIALIZE_MAX_PAIRS",
    "TORCH_MATERIALIZE_GQA_DECODE",
    "Decision",
    "auto_impl",
    "forget_plans",
    "plain_decision",
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
    (:func:`plain_decision`) for their memoised plan, so the two cannot
    part. ``delegates`` says whether torch's kernel
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


def plain_decision(*, memo: tuple[object, ...], lib: str) -> Decision | None:
    """What a repeat plain call's shortcut needs from its memoised plan; ``None`` if it has none.

    ``memo`` is the call's :func:`~portattn._core._prepare.plan_key` (or
    ``bare_key``). Only a call whose facts (or whose family's, all but the
    lengths) :func:`~portattn._core._prepare.prepare` has already checked
    has a plan (:func:`plain_plan`: q, k and v 4-D in the compute dtype,
    nothing hiding a pair or changing a score), so what its checks decided
    holds. Returns ``(scale, groups,
    path, autocast)``: the plan's scale (on torch ``None`` where it is
    SDPA's default, ``1 / sqrt(d)``) and query heads per key/value
    head, the path the rule (:func:`rule_path`) gives it on ``lib`` (the
    inputs' library, ``"numpy"`` or ``"torch"``: the key's dtypes say
    which, so one key never meets both), and the device type whose
    autocast must be off (:func:`~portattn._lib._precision.autocast_kind`;
    ``""`` on NumPy).

    Decided once per plan: a decode step makes the same call on every
    token, and asking the rule again cost it 5 us of its kernel's 30. On
    torch the caller passes ``"native"`` plans to
    :func:`~portattn._paths._native.plain_native` (the kernel is exact for
    such a call: nothing is hidden, so no key is read), unless autocast is
    on; on NumPy ``"materialize"`` plans (and any plain plan asked for
    ``impl="materialize"``) to :func:`~portattn._paths._materialize.plain_materialize`.
    Both pass what the whole path would (the same bits).
    """
    decided = _DECIDED.get(memo)
    if decided is not None:
        return decided
    plan = plain_plan(memo=memo)
    if plan is None:
        return None
    scale, groups, *_, d, device = plan
    if lib != "torch":
        decided = (scale, groups, _plan_path(plan, lib=lib, delegates=_no), "")
    else:
        # SDPA's own default scale is 1 / sqrt(d), computed alike: left to it.
        kernel_scale = None if scale == 1.0 / math.sqrt(d) else scale
        path = _plan_path(plan, lib=lib, delegates=_yes)
        decided = (kernel_scale, groups, path, autocast_kind(device))
    if len(_DECIDED) >= _DECIDED_MAX:
        _DECIDED.clear()
    _DECIDED[memo] = decided
    return decided


#: (scale, groups, the rule's path, the device's autocast kind) of a memoised plain plan;
#: on torch the scale is ``None`` where it is SDPA's default.
Decision = tuple[float | None, int, str, str]
# plan_key -> Decision, filled by plain_decision; emptied with the plans (forget_plans).
_DECIDED: dict[tuple[object, ...], Decision] = {}
_DECIDED_MAX = 256


def forget_plans() -> None:
    """Empty every memo of checked calls: the next call of any shape goes the whole way."""
    _DECIDED.clear()
    forget_checked()


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
