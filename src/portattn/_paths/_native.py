"""``impl="native"``: hand the validated problem to the library's own fused kernel.

Only two kernels are used, and only where they compute exactly what the
generic path computes:

- torch: :func:`torch.nn.functional.scaled_dot_product_attention`;
- JAX: :func:`jax.nn.dot_product_attention`.

Both receive the problem as :func:`~portattn._core._prepare.prepare` left it: ``q``
in the compute dtype (float32 for half types) and multiplied by the scale
unless the entry left that to the kernel (``Problem.kernel_scale``, 1 where
``q`` is already scaled), and every position-derived mask
(causal in either alignment, windows, key and query lengths) folded into one
boolean mask, so alignment is decided by portattn and never by the kernel's
own convention. Rows that see no key are set to 0 afterwards, whatever the
kernel made of them (NaN, uniform weights, ...), unless the caller proved that
there are none (``Variant.rows_see_keys``, set by the fused varlen call). What does not map raises
:class:`NotImplementedError` naming it (:func:`refusal`); the generic paths
stay the reference.

torch gets 4-D tensors, ``(batch, heads, L, d)``: its fused CPU kernel takes
nothing else, and any other rank falls back to the math kernel, which forms
the whole score matrix. Masks keep their own (broadcastable) shape, so a
mask shared by every head is handed over once, not once per head.

:func:`auto_delegates` is ``impl="auto"``'s rule for taking this path.
"""

from __future__ import annotations

import math
import sys

from .._core._problem import Problem, empty_result
from .._lib._compat import all_finite, is_concrete, namespace_library
from .._lib._typing import Array, Namespace

__all__ = ["auto_delegates", "native_attention", "plain_native", "refusal"]


def refusal(p: Problem, *, return_lse: bool, xp: Namespace) -> str | None:
    """Why ``impl="native"`` cannot compute ``p`` exactly, or ``None`` when it can."""
    lib = namespace_library(xp)
    if lib not in ("torch", "jax"):
        return (
            f"impl='native' delegates to torch.nn.functional.scaled_dot_product_attention "
            f"or jax.nn.dot_product_attention, and {xp.__name__} has neither; "
            "use impl='auto', 'blockwise' or 'materialize'"
        )
    if return_lse:
        return (
            f"impl='native' cannot return the log-sum-exp on {lib}: its public attention "
            "kernel does not expose it; use impl='blockwise' or 'materialize' with return_lse=True"
        )
    lacks = p.variant.kernel_lacks()
    if lacks is not None:
        what, why = lacks
        return (
            f"impl='native' cannot {what} on {lib}: its fused kernel {why}; "
            "use impl='auto', 'blockwise' or 'materialize'"
        )
    if lib == "jax" and p.lq > 0 and p.lk > 0:
        if p.q.dtype == xp.float64:
            return (
                "impl='native' on JAX cannot keep float64: jax.nn.dot_product_attention "
                "computes its softmax in float32; use impl='auto' for float64"
            )
        if p.q.shape[-1] != p.dv:
            return (
                "impl='native' on JAX needs value's feature size to equal query's "
                f"(jax.nn.dot_product_attention requires it), got d={p.q.shape[-1]} and "
                f"dv={p.dv}; use impl='auto'"
            )
    return None


def auto_delegates(
    p: Problem, *, return_lse: bool, materialize_max_pairs: int, xp: Namespace
) -> bool:
    """``impl="auto"``'s rule: take the fused kernel where it is exact and costs no extra memory.

    - Only torch: :func:`jax.nn.dot_product_attention`'s default
      implementation is XLA's own composition of the same operations, not a
      fused kernel: it forms the whole (..., Lq, Lk) score matrix, and eagerly
      it costs about 28 ms per call at 6 tokens (jax 0.10 CPU), against about
      2 ms for the materialising path.
    - Only where :func:`refusal` has nothing to say (no ``softcap``, no
      ``return_lse``, ...).
    - Only where the mask the kernel must be given holds no more elements
      than the generic path auto would otherwise run allocates: plain and
      top-left causal calls need none (the kernel's own ``is_causal``); a
      key-length mask is one row per batch entry; any other position mask is
      (Lq, Lk), which is as much as materialising costs for small calls but
      more than the blockwise path needs for long ones.
    - Only where no key that a mask handed to the kernel hides is inf or
      NaN: the generic paths replace hidden scores by ``-inf`` and never see
      such a key, while the kernel adds its mask to the scores it formed
      (NaN rows). The kernel's own ``is_causal`` is no exception: torch's
      math kernel masks the scores it formed too, and one +inf key in the
      future of every row but the last makes every row NaN. Every call
      that hides keys pays one reduction over the keys and a host read,
      where the keys can be read (not under ``torch.compile``).
    """
    if namespace_library(xp) != "torch":
        return False
    va = p.variant
    plain = va.positions_only and va.kernel_lacks() is None
    if plain and not return_lse and p.structure.trivial:
        # Nothing to refuse, no mask to hand over, no key hidden: the rule
        # below says yes, and a decode step asks it for every token.
        return True
    if refusal(p, return_lse=return_lse, xp=xp) is not None:
        return False
    if p.mods is not None:  # a block mask: the blockwise path skips its empty tiles, SDPA cannot
        return False
    if p.lq == 0 or p.lk == 0:
        return True
    if not _hidden_keys_finite(p, xp=xp):
        return False
    if p.kernel_causal:
        return True
    pairs = p.lq * p.lk
    batch = math.prod(p.batch)
    if pairs <= materialize_max_pairs:
        budget = batch * pairs  # what the materialising path's score matrix holds
    else:
        budget = batch * (p.lq + 2 * p.lk) * p.q.shape[-1]  # q, k, v: blockwise's scale
    return p.mask_elements() <= budget


def _hidden_keys_finite(p: Problem, *, xp: Namespace) -> bool:
    """False when a key may be hidden from some row and some key is inf or NaN (concrete only)."""
    hides = not p.structure.trivial or p.variant.mask is not None or p.variant.bias is not None
    if not hides or not is_concrete(p.k):
        return True
    return all_finite(p.k, xp=xp)


def native_attention(p: Problem, *, return_lse: bool, xp: Namespace) -> tuple[Array, Array | None]:
    """Output (..., Lq, dv) of ``p`` from the library's fused kernel; lse is never available."""
    lib = namespace_library(xp)
    # A plain call (nothing hides a pair, nothing the kernel lacks) is what
    # a decode step makes on every token: refusal() has nothing to say to it
    # on torch, and it hands the kernel no mask, so it skips that machinery.
    plain = lib == "torch" and not return_lse and _plain(p)
    why = None if plain else refusal(p, return_lse=return_lse, xp=xp)
    if why is not None:
        raise NotImplementedError(why)
    s = p.structure
    if s.lk == 0 or s.lq == 0 or math.prod(p.batch) == 0:
        out, _ = empty_result(p, xp=xp)
        return out, None
    if plain:
        return _torch(p, None, None, is_causal=False, xp=xp), None
    is_causal = p.kernel_causal
    allowed = None if is_causal else p.allowed(0, p.lq, 0, p.lk, xp=xp)  # (..., Lq|1, Lk|1) | None
    bias = p.bias_tile(0, p.lq, 0, p.lk)
    if lib == "torch":
        out = _torch(p, allowed, bias, is_causal=is_causal, xp=xp)
    else:
        out = _jax(p, allowed, bias, is_causal=is_causal, xp=xp)
    return out, None


def plain_native(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    scale: float | None,
    groups: int,
    mask: Array | None = None,
) -> Array:
    """torch's SDPA on (B, H, L, d) q, k and v as they are: a memoised plan's ``native_attention``.

    For a call ``impl="auto"`` found plain (:func:`~portattn._paths._auto.plain_decision`),
    with ``scale`` and ``groups`` from its plan; or, with ``mask`` (a
    boolean mask or an additive bias), a repeat fused varlen call whose
    rows all see a key (``kernel_mask_plan``). ``attn_mask=None`` and
    ``is_causal=False`` are SDPA's defaults, left out: each keyword costs
    the kernel's argument parser. So is ``scale=None``: the plan's scale is
    ``1 / sqrt(d)``, which SDPA computes itself the same way (in double
    precision, then cast as an explicit scale is: the same bits).
    """
    # Read on each call (a dict lookup, cheaper than an import statement), so
    # that a patched SDPA is the one called; importing torch loads the module.
    sdpa = sys.modules["torch.nn.functional"].scaled_dot_product_attention
    if mask is not None:
        gqa = {"enable_gqa": True} if groups > 1 else {}
        return sdpa(query, key, value, attn_mask=mask, scale=scale, **gqa)
    if scale is None:
        return sdpa(query, key, value, enable_gqa=True) if groups > 1 else sdpa(query, key, value)
    if groups > 1:
        return sdpa(query, key, value, scale=scale, enable_gqa=True)
    return sdpa(query, key, value, scale=scale)


def _plain(p: Problem) -> bool:
    """No mask, bias, lengths, mods, hiding positions, softcap or sinks: q, k and v alone."""
    va = p.variant
    return va.positions_only and p.structure.trivial and va.kernel_lacks() is None


def _visible_rows(allowed: Array | None, bias: Array | None, *, xp: Namespace) -> Array | None:
    """(..., Lq|1, 1): False on rows that see no key; ``None`` when every row sees one."""
    visible = allowed
    if bias is not None:
        finite = bias > -math.inf
        visible = finite if visible is None else xp.logical_and(visible, finite)
    return None if visible is None else xp.any(visible, axis=-1, keepdims=True)


def _four_d(x: Array, batch: tuple[int, ...], *, xp: Namespace) -> Array:
    """``x`` (..., m, n), broadcastable to ``(*batch, m, n)``, as 4-D ``(B|1, H|1, m, n)``.

    The last batch axis becomes the heads, all others are folded into one;
    axes of size 1 stay 1 (no copy), so the kernel broadcasts them itself.
    """
    lead = (1,) * (len(batch) + 2 - x.ndim) + tuple(x.shape[:-2])  # x's batch axes, aligned
    if len(batch) <= 2:
        return xp.reshape(x, (1,) * (2 - len(batch)) + lead + tuple(x.shape[-2:]))
    if all(n == 1 for n in lead[:-1]):
        return xp.reshape(x, (1, lead[-1], *x.shape[-2:]))
    x = xp.broadcast_to(x, (*batch[:-1], lead[-1], *x.shape[-2:]))
    return xp.reshape(x, (math.prod(batch[:-1]), lead[-1], *x.shape[-2:]))


def _torch(
    p: Problem, allowed: Array | None, bias: Array | None, *, is_causal: bool, xp: Namespace
) -> Array:
    import torch

    h = p.batch[-1] if p.batch else 1
    four = len(p.batch) == 2

    def full(x: Array, length: int, heads: int) -> Array:  # (..., L, d) -> (B, H, L, d)
        if four and x.ndim == 4:
            # Indexed rather than sliced: a torch.Size slice is a microsecond
            # of a decode step's 30.
            shape = x.shape
            if shape[0] == p.batch[0] and shape[1] == heads:
                return x  # already (B, H, L, d): a decode step pays for no view
        batch = (*p.batch[:-1], heads) if p.batch else p.batch
        return _four_d(xp.broadcast_to(x, (*batch, length, x.shape[-1])), batch, xp=xp)

    allowed4 = None if allowed is None else _four_d(allowed, p.batch, xp=xp)
    bias4 = None if bias is None else _four_d(bias, p.batch, xp=xp)
    mask = allowed4
    if bias4 is not None:
        mask = bias4 if mask is None else torch.where(mask, bias4, -math.inf)
    # Grouped-query attention: SDPA reads each key/value head for its group
    # itself (enable_gqa, torch >= 2.5, the oldest portattn supports).
    gqa = {"enable_gqa": True} if p.groups > 1 else {}
    out = torch.nn.functional.scaled_dot_product_attention(
        full(p.q, p.lq, h),
        full(p.k, p.lk, h // p.groups),
        full(p.v, p.lk, h // p.groups),
        attn_mask=mask,
        is_causal=is_causal,
        scale=p.kernel_scale,
        **gqa,
    )
    # Rows that see nothing are 0 by portattn's contract; kernels differ here
    # (torch's math kernel gives NaN). None where the caller proved there are none.
    seen = None if p.variant.rows_see_keys else _visible_rows(allowed4, bias4, xp=xp)
    if seen is not None:
        out = xp.where(seen, out, 0.0)
    return out if four else xp.reshape(out, (*p.batch, p.lq, p.dv))


def _jax(
    p: Problem, allowed: Array | None, bias: Array | None, *, is_causal: bool, xp: Namespace
) -> Array:
    import jax

    shape = (*p.batch, p.lq, p.lk)
    flat = math.prod(p.batch)
    lq, lk = p.lq, p.lk

    # BTNH. Without groups every batch axis folds into B and N is 1 (free
    # reshapes); with groups N is the heads, Hkv for the keys and values,
    # which jax.nn shares over each group itself.
    g = p.groups
    heads = p.batch[-1] if g > 1 else 1
    rows = flat // heads

    def heads_last(x: Array, length: int, n: int) -> Array:  # (..., L, d) -> (B, L, N, d)
        batch = (*p.batch[:-1], n) if g > 1 else p.batch
        x = xp.reshape(xp.broadcast_to(x, (*batch, length, x.shape[-1])), (rows, n, length, -1))
        return xp.permute_dims(x, (0, 2, 1, 3))

    def scores_like(x: Array | None) -> Array | None:  # (..., Lq, Lk) -> (B, N, Lq, Lk)
        return None if x is None else xp.reshape(xp.broadcast_to(x, shape), (rows, heads, lq, lk))

    seen = None if p.variant.rows_see_keys else _visible_rows(allowed, bias, xp=xp)
    if seen is not None and bias is not None:
        # A row whose bias is all -inf makes the kernel's softmax NaN, and the
        # where() below cannot stop that NaN in the backward (0 * NaN = NaN):
        # such rows get bias 0 before the kernel, and 0 output after it.
        bias = xp.where(seen, bias, 0.0)
    out = jax.nn.dot_product_attention(
        heads_last(p.q, lq, heads),
        heads_last(p.k, lk, heads // g),
        heads_last(p.v, lk, heads // g),
        bias=scores_like(bias),
        mask=scores_like(allowed),
        scale=p.kernel_scale,
        is_causal=is_causal,
    )
    out = xp.reshape(xp.permute_dims(out, (0, 2, 1, 3)), (*p.batch, lq, p.dv))
    # Rows that see nothing are 0 by portattn's contract (JAX spreads their
    # weight uniformly).
    return out if seen is None else xp.where(seen, out, 0.0)
