"""Validate the arguments of an attention call once, into the :class:`Problem` every path shares.

:func:`prepare` takes the options as one
:class:`~portattn._core._variant.Variant` (built by the entry, through
:func:`~portattn._core._variant.build_variant`), checks its arrays by their own
description (:data:`Variant.ARRAYS`) against the inputs, and hands the paths a
:class:`~portattn._core._problem.Problem`. It never lists the options.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import cast

import numpy as np

from .._lib._checks import (
    broadcast_shapes,
    check_array,
    check_bool,
    check_finite_scale,
    check_floating,
    check_known_shape,
    check_rank,
    check_same_device,
    dtype_name,
    has_kind,
)
from .._lib._compat import namespace_library
from .._lib._precision import compute_dtype
from .._lib._typing import Array, Device, DType, Namespace
from ._flex import flex_mods
from ._groups import kv_groups, repeat_kv
from ._masks import Align, Structure, length_mask
from ._modspec import index_dtype, mod_library
from ._problem import Problem
from ._variant import Variant, build_variant

__all__ = [
    "PlainPlan",
    "bare_key",
    "forget_checked",
    "kernel_mask_plan",
    "plain_plan",
    "plan_key",
    "prepare",
]


def _align(x: Array, ndim: int, *, xp: Namespace) -> Array:
    """Prepend unit axes so that ``x`` has ``ndim`` dimensions."""
    if x.ndim == ndim:
        return x
    return xp.reshape(x, (1,) * (ndim - x.ndim) + tuple(x.shape))


def _as(x: Array, dtype: DType, *, xp: Namespace) -> Array:
    """``x`` in ``dtype``, without a copy (or a call) when it already is."""
    return x if x.dtype == dtype else xp.astype(x, dtype)


# Calls repeat their options, so structures (a few ints each, never an array)
# are memoised in a plain dict: ``functools.lru_cache`` makes torch.compile
# warn on every function it traces through.
_STRUCTURES: dict[tuple[int, int, bool | Align, tuple[int, int] | None], Structure] = {}
_STRUCTURES_MAX = 256


def _structure(lq: int, lk: int, causal: bool | Align, window: tuple[int, int] | None) -> Structure:
    """:meth:`Structure.build` on already validated options, memoised: calls repeat them."""
    key = (lq, lk, causal, window)
    s = _STRUCTURES.get(key)
    if s is None:
        s = Structure.build(lq, lk, causal, window)
        if len(_STRUCTURES) >= _STRUCTURES_MAX:
            _STRUCTURES.clear()
        _STRUCTURES[key] = s
    return s


# What _validate decides: batch, structure, output dtype, compute dtype,
# device, scale, the variant laid out for the paths, the query heads per
# key/value head, and the feature size d where a repeat call's shortcut may
# take the inputs as they are (_paths/_auto.plain_decision), else 0.
# Memoised for NumPy and eager torch calls: by plan_key, by family (the key
# without the lengths: _family_key) and, for calls with array options, on
# their dtypes, shapes and devices (_arrays_key; the plan's variant then
# holds no array).
_Plan = tuple[tuple[int, ...], Structure, DType, DType, Device, float, Variant, int, int]
_PLANS: dict[tuple[object, ...], _Plan] = {}


def _check_arrays(
    arrays: list[tuple[str, Array]], options: list[tuple[str, Array]], *, xp: Namespace
) -> None:
    """Every check on the arrays alone, in one fixed order: the first problem found is reported."""
    present = arrays + options
    for name, x in present:
        check_array(name, x)
    for name, x in arrays:
        check_floating(name, x, xp=xp)
    for name, x in arrays:
        check_rank(name, x, 2, "(..., length, features)")
    for name, x in present:
        check_known_shape(name, x)  # before any size is read
    for name, x in options:
        kind = Variant.ARRAYS[name].kind
        if kind == "bool":
            check_bool(name, x, xp=xp)
        elif kind == "floating":
            check_floating(name, x, xp=xp)
        elif not has_kind(x.dtype, "integral", xp=xp):
            got = dtype_name(x.dtype)
            msg = f"expected {name} to be an integer array of valid lengths, got {got}"
            raise TypeError(msg)


def _check_sizes(query: Array, key: Array, value: Array | None) -> None:
    d, lk = query.shape[-1], key.shape[-2]
    if key.shape[-1] != d:
        msg = (
            f"expected key to have feature size d={d} like query {tuple(query.shape)}, "
            f"got key shape {tuple(key.shape)}"
        )
        raise ValueError(msg)
    if value is not None and value.shape[-2] != lk:
        msg = (
            f"expected value to have Lk={lk} rows like key {tuple(key.shape)}, "
            f"got value shape {tuple(value.shape)}"
        )
        raise ValueError(msg)


def _batch(
    arrays: list[tuple[str, Array]],
    options: list[tuple[str, Array]],
    lq: int,
    lk: int,
    groups: int,
) -> tuple[int, ...]:
    """The batch shape every array broadcasts to; options may add axes the inputs lack.

    With ``groups > 1`` key and value count as having the query's heads.
    """
    batch = tuple(arrays[0][1].shape[:-2])
    shapes = [(name, tuple(x.shape[:-2])) for name, x in arrays]
    if groups > 1:
        shapes[1:] = [(name, (*shape[:-1], shape[-1] * groups)) for name, shape in shapes[1:]]
    for _, shape in shapes[1:]:
        if shape != batch:
            batch = broadcast_shapes(shapes)
            break
    for name, x in options:
        if Variant.ARRAYS[name].layout == "batch":
            batch = broadcast_shapes([("the batch shape", batch), (name, tuple(x.shape))])
            continue
        if x.ndim < 2:
            check_rank(name, x, 2, f"broadcastable to (..., Lq={lq}, Lk={lk})")
        full = broadcast_shapes([("the scores", (*batch, lq, lk)), (name, tuple(x.shape))])
        if full[-2:] != (lq, lk):
            msg = (
                f"expected {name} to be broadcastable to (..., {lq}, {lk}), "
                f"got shape {tuple(x.shape)}"
            )
            raise ValueError(msg)
        batch = full[:-2]
    return batch


def _laid_out(
    asked: Variant,
    options: list[tuple[str, Array]],
    nb: int,
    work: DType,
    sizes: tuple[int, int],
    *,
    xp: Namespace,
    device: Device,
) -> Variant:
    """``asked`` with its arrays aligned to ``nb`` batch axes, floating ones in ``work``.

    ``asked`` itself where every array already fits: building a variant
    costs a small call about a microsecond.
    """
    changed = []
    lq, lk = sizes
    for name, x in options:
        spec = Variant.ARRAYS[name]
        y = x
        if spec.kind == "floating":
            y = _as(y, work, xp=xp)
        elif spec.kind == "lengths":
            # Compared with positions in one wide index dtype whatever their
            # own: int8 lengths would wrap past 127 (showing padded keys),
            # and torch cannot compare uint64 with int64 at all.
            y = _lengths(y, lk if name == "key_lengths" else lq, xp=xp, device=device)
        y = _align(y, nb + 2 if spec.layout == "scores" else nb, xp=xp)
        if y is not x:
            changed.append((name, y))
    return asked.with_arrays(changed) if changed else asked


def _validate(
    query: Array,
    key: Array,
    value: Array | None,
    asked: Variant,
    scale: object,
    groups: int,
    *,
    xp: Namespace,
) -> _Plan:
    """Every check of :func:`prepare` on the arrays, and what they decide."""
    # A small call is dominated by this bookkeeping, so nothing is looked at twice.
    arrays = [("query", query), ("key", key)]
    if value is not None:
        arrays.append(("value", value))
    options = asked.arrays()
    _check_arrays(arrays, options, xp=xp)
    _check_sizes(query, key, value)
    dev = check_same_device(arrays + options)
    # Sizes as the library gives them: int() would force a sync or a
    # specialisation on libraries whose sizes are symbolic.
    lq, lk, d = query.shape[-2], key.shape[-2], query.shape[-1]
    batch = _batch(arrays, options, lq, lk, groups)
    structure = _structure(lq, lk, asked.causal, asked.window)
    if scale is not None:
        scale_value = check_finite_scale(scale)
    else:  # d == 0: every score is an empty sum, 0, whatever the scale
        scale_value = 1.0 / math.sqrt(d) if d > 0 else 1.0
    out_dtype = query.dtype
    if key.dtype != out_dtype or (value is not None and value.dtype != out_dtype):
        out_dtype = xp.result_type(*(x.dtype for _, x in arrays))
    work = compute_dtype(out_dtype, xp=xp)
    variant = _laid_out(asked, options, len(batch), work, (lq, lk), xp=xp, device=dev)
    d_plain = _plain_d(
        query,
        key,
        value,
        batch=batch,
        groups=groups,
        work=work,
        variant=variant,
        structure=structure,
    )
    return batch, structure, out_dtype, work, dev, scale_value, variant, groups, d_plain


def _plain_d(
    query: Array,
    key: Array,
    value: Array | None,
    /,
    *,
    batch: tuple[int, ...],
    groups: int,
    work: DType,
    variant: Variant,
    structure: Structure,
) -> int:
    """``d`` where q, k and v are all a kernel needs, as they are; else 0.

    That is: (B, H, L, d) and (B, H / groups, L, d) arrays, none empty, in
    the compute dtype, and nothing that hides a pair or changes a score
    (no option but the scale). Shapes, dtypes and options alone decide it.
    """
    if value is None or len(batch) != 2 or variant.kernel_lacks() is not None:
        return 0
    if not (variant.positions_only and structure.trivial) or 0 in (structure.lq, structure.lk):
        return 0
    heads = (batch[0], batch[1] // groups)
    if query.ndim != 4 or tuple(query.shape[:2]) != batch or 0 in batch:
        return 0
    for x in (key, value):
        if x.ndim != 4 or tuple(x.shape[:2]) != heads:
            return 0
    if not (query.dtype == work and key.dtype == work and value.dtype == work):
        return 0
    return int(query.shape[-1])


def prepare(
    query: Array,
    key: Array,
    value: Array | None,
    variant: Variant | None = None,
    *,
    scale: object = None,
    xp: Namespace,
    scale_q: bool = True,
    memo: tuple[object, ...] | None = None,
) -> Problem:
    """Check every argument and return the problem in compute precision.

    ``variant`` comes from :func:`~portattn._core._variant.build_variant`
    (``None``: no option). ``value=None`` validates a weights-only call
    (:func:`attention_weights`). Options are validated before anything is
    cached on them. ``scale_q=False`` leaves ``q`` unscaled
    (``Problem.q_scaled``), for a caller that may hand it to a kernel
    taking the scale itself. ``memo`` is :func:`plan_key` of these very
    arguments where the caller has it (``attend``: a repeat call's shortcut
    asked for it first), so that a call computes it once; ``None``: computed here.
    """
    if variant is None:
        variant = build_variant()
    score_mod, block_mask = variant.score_mod, variant.block_mask
    if score_mod is not None or block_mask is not None:
        variant = variant.without_flex()  # checked below, against the call's shapes
    if memo is None:
        memo = plan_key(query, key, value, variant=variant, scale=scale)
    plan = None if memo is None else _PLANS.get(memo)
    if plan is None:
        plan = _plan(query, key, value, variant, scale, memo, xp=xp)
    p = _problem(query, key, value, plan, scale_q=scale_q, xp=xp)
    if score_mod is None and block_mask is None:
        return p
    mods = flex_mods(
        score_mod, block_mask, batch=p.batch, lq=p.lq, lk=p.lk, library=mod_library(query)
    )
    return dataclasses.replace(p, variant=dataclasses.replace(p.variant, mods=mods))


def forget_checked() -> None:
    """Empty the memo of checked calls (plans, families and array plans alike).

    Call ``_paths/_auto.forget_plans`` instead: it empties what derives
    from these plans too.
    """
    _PLANS.clear()
    forget_kernel_masks()


def forget_kernel_masks() -> None:
    """Empty :func:`kernel_mask_plan`'s memo, which holds its variants (and their masks).

    The fused varlen call empties it with its own memo of masks, so that
    the two never keep more masks alive than that one holds.
    """
    _KERNEL_MASK.clear()


def _plan(
    query: Array,
    key: Array,
    value: Array | None,
    variant: Variant,
    scale: object,
    memo: tuple[object, ...] | None,
    *,
    xp: Namespace,
) -> _Plan:
    """:func:`_validate`'s plan of a call not in :data:`_PLANS`, memoised where it may be.

    A call without array options whose family (:func:`_family_key`: the same
    facts but the lengths) was validated takes that plan's facts, with only
    the structure and ``d_plain`` decided anew: a decode step over a growing
    cache changes ``Lk`` on every token. A call with array options (the fused
    varlen mask) is memoised on their dtypes, shapes and devices
    (:func:`_arrays_key`); its arrays are laid out anew on every call.
    """
    if memo is None:
        return _array_plan(query, key, value, variant, scale, xp=xp)
    family = _family_key(query, key, value, memo)
    known = None if family is None else _PLANS.get(family)
    if known is None:
        # Grouped-query attention: k and v keep their Hkv heads (_core/_groups).
        groups = kv_groups(query, key, value)  # shapes alone: memoised with the plan
        plan = _validate(query, key, value, variant, scale, groups, xp=xp)
        if family is not None:
            _remember(family, plan)
    else:
        batch, _, out_dtype, work, dev, scale_value, laid, groups, _ = known
        structure = _structure(query.shape[-2], key.shape[-2], variant.causal, variant.window)
        d_plain = _plain_d(
            query, key, value, batch=batch, groups=groups, work=work, variant=laid,
            structure=structure,
        )  # fmt: skip
        plan = batch, structure, out_dtype, work, dev, scale_value, laid, groups, d_plain
    _remember(memo, plan)
    return plan


def _remember(key: tuple[object, ...], plan: _Plan) -> None:
    """``plan`` in :data:`_PLANS`: plan keys, and the family and array keys, marked by a string."""
    if len(_PLANS) >= _STRUCTURES_MAX:
        _PLANS.clear()
    _PLANS[key] = plan


def _family_key(
    query: Array, key: Array, value: Array | None, memo: tuple[object, ...]
) -> tuple[object, ...] | None:
    """``memo`` (a :func:`plan_key`) without ``Lq`` and ``Lk``; ``None`` for a call to check whole.

    Every check of :func:`_validate` but the structure's reads the same facts
    whatever the lengths (ranks, dtypes, ``d``, heads, devices, the scale):
    only :func:`_structure` and :func:`_plain_d` read them. A call with an
    array of rank < 2, or whose value's ``Lk`` is not key's, is validated
    whole, for its error.
    """
    arrays = (query, key) if value is None else (query, key, value)
    if any(x.ndim < 2 for x in arrays) or (value is not None and value.shape[-2] != key.shape[-2]):
        return None
    return _family_of(memo, len(arrays))


def _family_of(memo: tuple[object, ...], n: int) -> tuple[object, ...]:
    """The family key of a plan key ``memo`` whose last ``n`` entries are the arrays' shapes.

    Each shape loses its lengths (its last-but-one axis) and keeps its rank:
    the one spelling both :func:`_family_key` and :func:`_plain_from_family` use.
    """
    shapes = cast("tuple[tuple[int, ...], ...]", memo[-n:])
    return ("family", *memo[:-n], *((len(s), *s[:-2], s[-1]) for s in shapes))


def _array_plan(
    query: Array, key: Array, value: Array | None, variant: Variant, scale: object, *, xp: Namespace
) -> _Plan:
    """The plan of a call with array options, memoised on everything but their values.

    What :func:`_validate` checks and decides reads the arrays' types, dtypes,
    shapes and devices only, never their values; the plan keeps no array: on
    every call :func:`_laid_out` lays this call's own arrays out.
    """
    memo = _arrays_key(query, key, value, variant, scale)
    plan = None if memo is None else _PLANS.get(memo)
    if plan is None:
        groups = kv_groups(query, key, value)
        plan = _validate(query, key, value, variant, scale, groups, xp=xp)
        if memo is None:
            return plan
        batch, structure, out_dtype, work, dev, scale_value, laid, groups, d_plain = plan
        kept = laid.without_arrays()  # never an array in the memo
        _remember(
            memo, (batch, structure, out_dtype, work, dev, scale_value, kept, groups, d_plain)
        )
        return plan
    batch, structure, out_dtype, work, dev, scale_value, _, groups, d_plain = plan
    sizes = (query.shape[-2], key.shape[-2])
    laid = _laid_out(variant, variant.arrays(), len(batch), work, sizes, xp=xp, device=dev)
    return batch, structure, out_dtype, work, dev, scale_value, laid, groups, d_plain


def _arrays_key(
    query: Array, key: Array, value: Array | None, variant: Variant, scale: object
) -> tuple[object, ...] | None:
    """:func:`plan_key` without the arrays, plus their names, dtypes, shapes and devices.

    ``None`` where the call is not memoisable (:func:`plan_key`), or an
    array option is not of the inputs' own type (a subclass, a tracer).
    """
    if variant.mods is not None:
        return None
    memo = plan_key(query, key, value, variant=variant.without_arrays(), scale=scale)
    if memo is None:
        return None
    t, numpy = type(query), type(query) is np.ndarray
    memo = ("arrays", *memo)
    for name, x in variant.arrays():
        if type(x) is not t:
            return None
        memo += (name, x.dtype, x.shape, None if numpy else x.device)
    return memo


def kernel_mask_plan(
    query: Array, key: Array, value: Array, /, *, variant: Variant, scale: object
) -> tuple[float, int, Device] | None:
    """``(scale, groups, device)`` of a repeat masked call a kernel takes as it is; else ``None``.

    For :func:`~portattn._attention.attend`'s shortcut of the fused varlen
    call: one ``mask`` or ``bias`` and no other option, every row proved to
    see a key (``rows_see_keys``), and a plan :func:`prepare` has already
    checked with these very dtypes, shapes and devices (:func:`_arrays_key`)
    in which positions hide nothing and every array is already laid out:
    4-D, (B, H) and (B, H // groups) batch axes, in the compute dtype, which
    is the output's. What the native path would hand the kernel is then
    these arrays as they are. ``None`` for any other call.

    Eager torch tensors only. A yes is memoised for the variant itself (held,
    so that its id is not reused; a step's layers share one) and these
    dtypes, shapes, devices and scale: a step's second layer asks again.
    """
    torch = sys.modules.get("torch")
    t = type(query)
    if torch is None or t is not torch.Tensor or type(key) is not t or type(value) is not t:
        return None
    if torch.compiler.is_compiling():
        return None
    facts: tuple[object, ...] = (query.dtype, key.dtype, value.dtype, query.shape, key.shape)
    facts += (value.shape, query.device, key.device, value.device, type(scale), scale)
    known = _KERNEL_MASK.get(id(variant))
    if known is not None and known[0] is variant and known[1] == facts:
        return known[2]
    planned = _kernel_mask_plan(query, key, value, variant, scale)
    if planned is not None:  # a no may turn yes once prepare has checked the call
        if len(_KERNEL_MASK) >= _KERNEL_MASK_MAX:
            _KERNEL_MASK.clear()
        _KERNEL_MASK[id(variant)] = (variant, facts, planned)
    return planned


# kernel_mask_plan's yeses: (variant, its call's facts, the answer) by the variant's id.
_KERNEL_MASK: dict[int, tuple[Variant, tuple[object, ...], tuple[float, int, Device]]] = {}
_KERNEL_MASK_MAX = 8


def _kernel_mask_plan(
    query: Array, key: Array, value: Array, variant: Variant, scale: object
) -> tuple[float, int, Device] | None:
    """:func:`kernel_mask_plan`, asked of the plans."""
    mask, bias = variant.mask, variant.bias
    x = mask if bias is None else bias
    if x is None or not variant.rows_see_keys or (mask is not None and bias is not None):
        return None
    if len(variant.arrays()) != 1 or variant.softcap is not None:
        return None
    memo = _arrays_key(query, key, value, variant, scale)
    plan = None if memo is None else _PLANS.get(memo)
    if plan is None:
        return None
    batch, structure, out_dtype, work, dev, scale_value, _, groups, _ = plan
    if not structure.trivial or 0 in (structure.lq, structure.lk) or len(batch) != 2:
        return None
    kv = (batch[0], batch[1] // groups)
    if 0 in batch or tuple(query.shape[:2]) != batch or x.ndim != 4:
        return None
    if tuple(key.shape[:2]) != kv or tuple(value.shape[:2]) != kv:
        return None
    dtypes = (out_dtype, query.dtype, key.dtype, value.dtype, work if bias is None else bias.dtype)
    if any(t != work for t in dtypes):
        return None
    return scale_value, groups, dev


# (scale, groups, batch, structure, d, device) of a memoised plain call.
PlainPlan = tuple[float, int, tuple[int, ...], Structure, int, Device]


def plain_plan(*, memo: tuple[object, ...]) -> PlainPlan | None:
    """``(scale, groups, batch, structure, d, device)`` of a repeat call a kernel takes as it is.

    Only a call :func:`prepare` has already checked with these very facts
    (dtypes, shapes, devices, options: ``memo``, its :func:`plan_key`), or
    whose family (the same facts but the lengths, :func:`_family_key`) it
    checked and whose new lengths hide nothing (:func:`_plain_from_family`),
    has a plan here, so what the checks decided holds. ``None`` for any
    other call, which goes through :func:`prepare` (and its errors) as always.
    """
    plan = _PLANS.get(memo)
    if plan is None:
        plan = _plain_from_family(memo)
    if plan is None or not plan[8]:
        return None
    return plan[5], plan[7], plan[0], plan[1], plan[8], plan[4]


def _plain_from_family(memo: tuple[object, ...]) -> _Plan | None:
    """The plan of a q, k, v call whose family (:func:`_family_key`) was checked plain; else None.

    A decode step's new ``Lk``: its family's plan holds every fact but the
    structure, which is decided here; ``d_plain`` holds where the family's
    did and the new structure hides nothing (as :func:`_plain_d` decides).
    Any other call (an empty one, a structure that hides pairs or that the
    lengths make an error) gets ``None`` and goes through :func:`prepare`.
    """
    shapes = memo[-3:]  # a q, k, v plan key ends with their shapes
    if len(memo) < 4 or not all(isinstance(x, tuple) and len(x) >= 2 for x in shapes):
        return None
    qs, ks, vs = cast("tuple[tuple[int, ...], ...]", shapes)
    if vs[-2] != ks[-2] or 0 in (qs[-2], ks[-2]):
        return None
    known = _PLANS.get(_family_of(memo, 3))
    if known is None or not known[8]:
        return None
    batch, _, out_dtype, work, dev, scale_value, laid, groups, d_plain = known
    try:
        structure = _structure(qs[-2], ks[-2], laid.causal, laid.window)
    except ValueError:
        return None  # prepare raises it, in its place among the checks
    if not structure.trivial:
        return None
    plan = batch, structure, out_dtype, work, dev, scale_value, laid, groups, d_plain
    _remember(memo, plan)
    return plan


def plan_key(
    query: Array, key: Array, value: Array | None, /, *, variant: Variant, scale: object
) -> tuple[object, ...] | None:
    """What :func:`_validate`'s checks depend on, for memoisable inputs; ``None`` for the others.

    A repeat NumPy or eager torch call (the chapter's size is dominated by
    such bookkeeping) skips the checks. (``xp`` is these arrays' namespace:
    callers look it up from them; torch's key holds the devices.)
    """
    if not _memoisable(query, key, value) or type(scale) not in _SCALES:
        return None
    options = variant.memo_key()
    if options is None:
        return None
    memo = (query.dtype, key.dtype, scale, *options)
    if value is not None:
        memo += (value.dtype,)
    if type(query) is not np.ndarray:
        memo += (query.device, key.device, None if value is None else value.device)
    # The shapes last, where _family_key finds them.
    if value is None:
        return (*memo, query.shape, key.shape)
    return (*memo, query.shape, key.shape, value.shape)


def bare_key(
    query: Array, key: Array, value: Array, /, *, scale: object
) -> tuple[object, ...] | None:
    """:func:`plan_key` of a call with no option at all, without building its variant.

    The public entry's repeat bare call (a decode step's) asks this before
    anything else: the same key, so the same plan, as :func:`plan_key` with
    the variant :func:`build_variant` gives when every option is left out.
    """
    t = type(query)
    if type(key) is not t or type(value) is not t or type(scale) not in _SCALES:
        return None
    # One tuple, built at once (a decode step pays for each copy), in
    # plan_key's order: the shapes last.
    if t is np.ndarray:
        return (
            query.dtype,
            key.dtype,
            scale,
            *_BARE_OPTIONS,
            value.dtype,
            query.shape,
            key.shape,
            value.shape,
        )
    torch = sys.modules.get("torch")
    if torch is None or t is not torch.Tensor or torch.compiler.is_compiling():
        return None
    return (
        query.dtype,
        key.dtype,
        scale,
        *_BARE_OPTIONS,
        value.dtype,
        query.device,
        key.device,
        value.device,
        # size() is the same torch.Size as .shape, a third cheaper to read.
        query.size(),
        key.size(),
        value.size(),
    )


# What a memoised scale may be (a bool is refused by the checks, so never memoised).
_SCALES = (type(None), float, int)
# build_variant()'s memo_key: a call with no option.
_BARE_OPTIONS: tuple[object, ...] = build_variant().memo_key() or ()


def _memoisable(query: Array, key: Array, value: Array | None) -> bool:
    """NumPy arrays, or plain torch tensors outside ``torch.compile``, all of one type.

    For them what :func:`_validate` decides depends only on dtypes, shapes,
    devices and the options. Not subclasses (fake tensors, parameters) and
    not traced calls, whose sizes may be symbolic.
    """
    t = type(query)
    if type(key) is not t or (value is not None and type(value) is not t):
        return False
    if t is np.ndarray:
        return True
    torch = sys.modules.get("torch")
    return torch is not None and t is torch.Tensor and not torch.compiler.is_compiling()


def _problem(
    query: Array,
    key: Array,
    value: Array | None,
    plan: _Plan,
    *,
    scale_q: bool,
    xp: Namespace,
) -> Problem:
    """The arrays in compute precision (``q`` scaled if asked, padding zeroed), and ``plan``."""
    batch, structure, out_dtype, work, dev, scale_value, variant, groups, _ = plan
    # Inline rather than _as(): at the chapter's size every call shows.
    q = query if query.dtype == work else xp.astype(query, work)
    if scale_q:
        q = q * scale_value
    k = key if key.dtype == work else xp.astype(key, work)
    v = value if value is None or value.dtype == work else xp.astype(value, work)
    if variant.key_lengths is not None:
        # What lies beyond a length is padding, often garbage: zero it, so that
        # inf or NaN there never meets a zero weight (0 * NaN = NaN) on any path.
        lk = structure.lk
        if groups > 1 and variant.key_lengths.shape[-1] != 1:
            # Lengths per query head zero different keys for the heads of one
            # group: only then are the keys and values repeated per head.
            k = repeat_kv(k, groups, xp=xp)
            v = None if v is None else repeat_kv(v, groups, xp=xp)
            groups = 1
        keep = length_mask(variant.key_lengths, lk, 0, lk, xp=xp, device=dev)[..., :, None]
        k = xp.where(keep, k, 0.0)  # (..., Lk, d)
        if v is not None:
            v = xp.where(keep, v, 0.0)
    # Positional, in field order: keywords cost a small call half a microsecond.
    return Problem(q, k, v, variant, structure, batch, out_dtype, dev, scale_value, groups, scale_q)


def _lengths(x: Array, n: int, *, xp: Namespace, device: Device) -> Array:
    """Lengths along an axis of size ``n`` in the index dtype.

    int32 stays int32; anything else becomes the namespace's index dtype
    (int64, or int32 under JAX without x64: asking for int64 there would warn
    and silently give int32). Where that cast could wrap (uint32's 0xFFFFFFFF
    is -1 as int32, uint64 past 2**63 is negative as int64), the lengths are
    first clipped to ``[0, n]`` in their own dtype, which shows the same
    keys. torch has no arithmetic on uint64: its values past 2**63 are not
    lengths anyone has, and are cast as they are.
    """
    target = index_dtype(xp=xp, device=device)
    if x.dtype == target or x.dtype == xp.int32:
        return x
    have, want = xp.iinfo(x.dtype), xp.iinfo(target)
    if have.max > want.max and not (namespace_library(xp) == "torch" and have.bits == 64):
        x = xp.clip(x, None, min(n, have.max))
    if have.min < want.min:
        x = xp.clip(x, 0, None)
    return xp.astype(x, target)
