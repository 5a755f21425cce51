"""Validate the arguments of an attention call once, into a :class:`Problem` every path shares.

The materialising, blockwise and native paths all read the same validated
problem, so semantics (masking, alignment, padding, soft-capping, dtypes) are
decided in one place and the paths differ only in how they schedule the
arithmetic. :func:`prepare` is the only place, besides the public signatures
of :func:`~portattn.attention` and :func:`~portattn.attention_weights`, that
lists the options: it gathers them into one
:class:`~portattn._core._variant.Variant`, which :func:`_validate` checks by
its own description of each array (:data:`Variant.ARRAYS`) and which the
``Problem`` carries to the paths.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

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
from .._lib._compat import matrix_transpose, namespace_library
from .._lib._precision import compute_dtype
from .._lib._typing import Array, Device, DType, Namespace
from ._flex import FULL, PARTIAL, Mods, flex_mods
from ._masks import Structure, length_mask, normalize_causal, normalize_window
from ._mods import index_dtype
from ._variant import Variant

__all__ = ["Problem", "Variant", "empty_result", "empty_scores", "expand", "prepare"]


@dataclass(slots=True)
class Problem:
    """A validated attention call (never modified after ``prepare``); ``q`` is already scaled."""

    q: Array  # (..., Lq, d), compute dtype
    k: Array  # (..., Lk, d)
    v: Array  # (..., Lk, dv)
    variant: Variant  # every option but the scale, laid out on the batch shape
    structure: Structure  # the positions causal/window allow, resolved for (Lq, Lk)
    batch: tuple[int, ...]
    out_dtype: DType
    device: Device
    scale: float

    @property
    def lq(self) -> int:
        return self.structure.lq

    @property
    def lk(self) -> int:
        return self.structure.lk

    @property
    def dv(self) -> int:
        return self.v.shape[-1]  # type: ignore[no-any-return]

    @property
    def mods(self) -> Mods | None:
        """The score_mod and block mask, if any (batch is then (B, H))."""
        return self.variant.mods

    @property
    def sinks(self) -> Array | None:
        """The sinks as a column against the scores, (..., 1, 1), or ``None``."""
        sinks = self.variant.sinks
        return None if sinks is None else sinks[..., None, None]

    @property
    def may_hide(self) -> bool:
        """Whether a score can be ``-inf`` before any mask: a bias or a score_mod can make one."""
        mods = self.variant.mods
        return self.variant.bias is not None or (mods is not None and mods.score_mod is not None)

    def kind(self, q0: int, q1: int, k0: int, k1: int) -> int:
        """The block mask's EMPTY, PARTIAL or FULL for the tile (FULL without one)."""
        mods = self.variant.mods
        return FULL if mods is None else mods.kind(q0, q1, k0, k1)

    def indices(
        self, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace
    ) -> tuple[Array, Array, Array, Array]:
        """The mods' index arrays ``(b, h, q_idx, kv_idx)`` for the tile, in absolute positions."""
        assert self.variant.mods is not None
        return self.variant.mods.indices(self.batch, q0, q1, k0, k1, xp=xp, device=self.device)

    def allowed(self, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace) -> Array | None:
        """Everything that hides pairs in the tile, combined; ``None`` when nothing does.

        ``mask_mod`` is asked only on a PARTIAL tile: a FULL one hides
        nothing and an EMPTY one is never visited.
        """
        parts = []
        if not self.structure.tile_is_full(q0, q1, k0, k1):
            parts.append(self.structure.shared_tile(q0, q1, k0, k1, xp=xp, device=self.device))
        va = self.variant
        mods = va.mods
        if mods is not None and mods.mask_mod is not None and self.kind(q0, q1, k0, k1) == PARTIAL:
            parts.append(mods.allowed(self.indices(q0, q1, k0, k1, xp=xp), xp=xp))
        if va.mask is not None:
            parts.append(_tile(va.mask, q0, q1, k0, k1))
        if va.key_lengths is not None:
            kl = length_mask(va.key_lengths, self.lk, k0, k1, xp=xp, device=self.device)
            parts.append(kl[..., None, :])  # (..., 1, k1-k0)
        if va.query_lengths is not None:
            ql = length_mask(va.query_lengths, self.lq, q0, q1, xp=xp, device=self.device)
            parts.append(ql[..., :, None])  # (..., q1-q0, 1)
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = xp.logical_and(out, p)
        return out

    def arrays(self) -> tuple[Array | None, ...]:
        """``q``, ``k``, ``v`` and every array field of the variant (``None`` where absent).

        In one fixed order: what the autodiff adapters hand the library as
        inputs, so that nothing they run closes over an array.
        """
        va = self.variant
        return (self.q, self.k, self.v, *[getattr(va, name) for name in Variant.ARRAYS])

    def with_arrays(self, arrays: tuple[Array | None, ...]) -> Problem:
        """This problem holding ``arrays``, in :meth:`arrays` order, instead of its own."""
        q, k, v, *options = arrays
        variant = self.variant.with_arrays(zip(Variant.ARRAYS, options, strict=True))
        return dataclasses.replace(self, q=q, k=k, v=v, variant=variant)

    def without_arrays(self) -> Problem:
        """The static part, to keep beside the arrays a library's autodiff saves."""
        return self.with_arrays((None,) * (3 + len(Variant.ARRAYS)))

    def bias_tile(self, q0: int, q1: int, k0: int, k1: int) -> Array | None:
        bias = self.variant.bias
        return None if bias is None else _tile(bias, q0, q1, k0, k1)

    def scores(
        self, q_block: Array, k_t: Array, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace
    ) -> Array:
        """Scores of the tile ``[q0, q1) x [k0, k1)``: scaled, soft-capped, plus the bias.

        ``q_block`` is ``q[..., q0:q1, :]`` and ``k_t`` the transposed keys
        ``k[..., k0:k1, :]ᵀ``; both are passed in so that callers slice once
        per block rather than once per tile. Hidden pairs are not masked here.
        """
        s = q_block @ k_t  # (..., q1-q0, k1-k0), already scaled through q
        cap = self.variant.softcap
        if cap is not None:
            s = xp.tanh(s / cap) * cap  # Gemma 2's logit soft-capping
        if self.variant.bias is not None:
            s = s + self.bias_tile(q0, q1, k0, k1)
        mods = self.variant.mods
        if mods is not None and mods.score_mod is not None:
            s = mods.score(s, self.indices(q0, q1, k0, k1, xp=xp), xp=xp)
        return s


def empty_result(p: Problem, *, xp: Namespace) -> tuple[Array, Array]:
    """Nothing to attend to (``Lk == 0``) or nobody asking (``Lq == 0``, an empty batch).

    The output is zeros and the lse ``-inf``, computed from the inputs
    rather than created, so that autograd stays connected and every input
    gets a zero gradient: an empty sum is an exact 0 whatever the arrays hold.
    """
    s = empty_scores(p, xp=xp)  # (..., Lq, Lk), no element
    out = expand(s @ p.v, (*p.batch, p.lq, p.dv), xp=xp)  # zeros: sums over Lk == 0 terms
    sinks = p.variant.sinks
    if sinks is not None:  # the sink is the only logit a row has: lse = sink
        lse = expand(xp.sum(s, axis=-1) + sinks[..., None], (*p.batch, p.lq), xp=xp)
        return out, lse
    lse = expand(xp.sum(s, axis=-1) - math.inf, (*p.batch, p.lq), xp=xp)
    return out, lse


def empty_scores(p: Problem, *, xp: Namespace) -> Array:
    """The scores of a problem with no (query, key) pair, connected to ``q``, ``k`` and ``bias``."""
    return p.scores(p.q, matrix_transpose(p.k, xp=xp), 0, p.lq, 0, p.lk, xp=xp)


def expand(x: Array, shape: tuple[int, ...], *, xp: Namespace) -> Array:
    """Broadcast ``x`` to ``shape`` as a fresh, writable array (no-op when it already fits).

    ``astype(copy=True)`` is differentiable on every torch version; whether
    ``asarray(copy=True)`` keeps a tensor's graph changed in torch 2.13.
    """
    if tuple(x.shape) == shape:
        return x
    return xp.astype(xp.broadcast_to(x, shape), x.dtype, copy=True)


def _tile(x: Array, q0: int, q1: int, k0: int, k1: int) -> Array:
    rows = slice(None) if x.shape[-2] == 1 else slice(q0, q1)
    cols = slice(None) if x.shape[-1] == 1 else slice(k0, k1)
    return x[..., rows, cols]


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
_STRUCTURES: dict[tuple[int, int, bool | str, tuple[int, int] | None], Structure] = {}
_STRUCTURES_MAX = 256


def _structure(lq: int, lk: int, causal: bool | str, window: tuple[int, int] | None) -> Structure:
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
# device, scale, and the variant laid out for the paths. Memoised for NumPy
# calls without array options (their variant holds no array).
_Plan = tuple[tuple[int, ...], Structure, DType, DType, Device, float, Variant]
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
    arrays: list[tuple[str, Array]], options: list[tuple[str, Array]], lq: int, lk: int
) -> tuple[int, ...]:
    """The batch shape every array broadcasts to; options may add axes the inputs lack."""
    batch = tuple(arrays[0][1].shape[:-2])
    for _, x in arrays[1:]:
        if tuple(x.shape[:-2]) != batch:
            batch = broadcast_shapes([(name, tuple(x.shape[:-2])) for name, x in arrays])
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
    query: Array, key: Array, value: Array | None, asked: Variant, scale: object, *, xp: Namespace
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
    batch = _batch(arrays, options, lq, lk)
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
    return batch, structure, out_dtype, work, dev, scale_value, variant


def prepare(
    query: Array,
    key: Array,
    value: Array | None,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: object = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    softcap: float | None = None,
    score_mod: object = None,
    block_mask: object = None,
    sinks: Array | None = None,
    xp: Namespace,
) -> Problem:
    """Check every argument and return the problem in compute precision.

    ``value=None`` validates a weights-only call (:func:`attention_weights`).
    Options are validated before anything is cached on them.
    """
    if causal is not False:  # the defaults need no call: a small call feels each
        causal = normalize_causal(causal)
    if window is not None:
        window = normalize_window(window)
    cap = None if softcap is None else _check_softcap(softcap)
    key, value = expand_kv_heads(query, key, value, xp=xp)
    plan = None
    memo: tuple[object, ...] | None = None
    if (
        mask is None
        and bias is None
        and key_lengths is None
        and query_lengths is None
        and sinks is None
        and type(query) is np.ndarray
        and type(key) is np.ndarray
        and (value is None or type(value) is np.ndarray)
        and (scale is None or type(scale) is float or type(scale) is int)
    ):
        # The checks below depend on nothing but these: a repeat NumPy call
        # (the chapter's size is dominated by such bookkeeping) skips them.
        # (``xp`` is these arrays' namespace: callers look it up from them.)
        memo = (query.dtype, query.shape, key.dtype, key.shape, causal, window, scale, cap)
        if value is not None:
            memo += (value.dtype, value.shape)
        plan = _PLANS.get(memo)
    if plan is None:
        asked = Variant(
            mask=mask,
            bias=bias,
            key_lengths=key_lengths,
            query_lengths=query_lengths,
            causal=causal,
            window=window,
            softcap=cap,
            sinks=sinks,
        )
        plan = _validate(query, key, value, asked, scale, xp=xp)
        if memo is not None:
            if len(_PLANS) >= _STRUCTURES_MAX:
                _PLANS.clear()
            _PLANS[memo] = plan
    p = _problem(query, key, value, plan, xp=xp)
    if score_mod is None and block_mask is None:
        return p
    mods = flex_mods(score_mod, block_mask, batch=p.batch, lq=p.lq, lk=p.lk)
    return dataclasses.replace(p, variant=dataclasses.replace(p.variant, mods=mods))


def expand_kv_heads(
    query: Array, key: Array, value: Array | None, *, xp: Namespace
) -> tuple[Array, Array | None]:
    """Grouped-query attention: ``Hkv`` key/value heads shared by ``H = G * Hkv`` query heads.

    On (..., H, L, d) inputs whose key has ``Hkv`` heads, ``1 < Hkv < H``
    dividing ``H``, query head ``h`` reads key/value head ``h // G`` (as
    SDPA's ``enable_gqa``); the heads are repeated here, so every path sees
    plain multi-head attention and gradients sum back over each group.
    """
    nq, nk = getattr(query, "ndim", 0), getattr(key, "ndim", 0)  # not yet validated
    if nq < 3 or nk < 3 or nq != nk:
        return key, value
    h, hkv = query.shape[-3], key.shape[-3]
    if h == hkv or hkv == 1 or hkv == 0 or h % hkv != 0:
        return key, value
    if value is not None and getattr(value, "ndim", 0) == nk and value.shape[-3] != hkv:
        return key, value  # not a GQA layout: validation names the mismatch
    g = h // hkv

    def repeat(x: Array) -> Array:
        lead, n, tail = tuple(x.shape[:-3]), x.shape[-3], tuple(x.shape[-2:])
        grown = xp.broadcast_to(x[..., None, :, :], (*lead, n, g, *tail))  # (..., Hkv, G, L, d)
        return xp.reshape(grown, (*lead, n * g, *tail))

    return repeat(key), None if value is None else repeat(value)


def _problem(
    query: Array, key: Array, value: Array | None, plan: _Plan, *, xp: Namespace
) -> Problem:
    """The arrays in compute precision (``q`` scaled, padding zeroed), with ``plan``'s facts."""
    batch, structure, out_dtype, work, dev, scale_value, variant = plan
    # Inline rather than _as(): at the chapter's size every call shows.
    q = (query if query.dtype == work else xp.astype(query, work)) * scale_value
    k = key if key.dtype == work else xp.astype(key, work)
    v = value if value is None or value.dtype == work else xp.astype(value, work)
    if variant.key_lengths is not None:
        # What lies beyond a length is padding, often garbage: zero it, so that
        # inf or NaN there never meets a zero weight (0 * NaN = NaN) on any path.
        lk = structure.lk
        keep = length_mask(variant.key_lengths, lk, 0, lk, xp=xp, device=dev)[..., :, None]
        k = xp.where(keep, k, 0.0)  # (..., Lk, d)
        if v is not None:
            v = xp.where(keep, v, 0.0)
    # Positional, in field order: keywords cost a small call half a microsecond.
    return Problem(q, k, v, variant, structure, batch, out_dtype, dev, scale_value)


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


def _check_softcap(softcap: object) -> float:
    value = check_finite_scale(softcap, name="softcap")
    if value <= 0:
        msg = f"expected softcap to be a positive finite number or None, got {value}"
        raise ValueError(msg)
    return value
