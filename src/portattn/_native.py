"""``impl="native"``: hand the validated problem to the library's own fused kernel.

Only two kernels are used, and only where they compute exactly what the
generic path computes:

- torch: :func:`torch.nn.functional.scaled_dot_product_attention`;
- JAX: :func:`jax.nn.dot_product_attention`.

Both receive the problem as :func:`~portattn._problem.prepare` left it: ``q``
already multiplied by the scale (so the kernel's scale is 1) and in the
compute dtype (float32 for half types), and every position-derived mask
(causal in either alignment, windows, key and query lengths) folded into one
boolean mask, so alignment is decided by portattn and never by the kernel's
own convention. Rows that see no key are set to 0 afterwards, whatever the
kernel made of them (NaN, uniform weights, ...). What does not map raises
:class:`NotImplementedError` naming it; the generic paths stay the reference.
"""

from __future__ import annotations

import math

from ._lib._compat import namespace_library
from ._lib._typing import Array, Namespace
from ._problem import Problem, empty_result

__all__ = ["native_attention"]


def native_attention(p: Problem, *, return_lse: bool, xp: Namespace) -> tuple[Array, Array | None]:
    """Output (..., Lq, dv) of ``p`` from the library's fused kernel; lse is never available."""
    lib = namespace_library(xp)
    if lib not in ("torch", "jax"):
        msg = (
            f"impl='native' delegates to torch.nn.functional.scaled_dot_product_attention "
            f"or jax.nn.dot_product_attention, and {xp.__name__} has neither; "
            "use impl='auto', 'blockwise' or 'materialize'"
        )
        raise NotImplementedError(msg)
    if return_lse:
        msg = (
            f"impl='native' cannot return the log-sum-exp on {lib}: its public attention "
            "kernel does not expose it; use impl='blockwise' or 'materialize' with return_lse=True"
        )
        raise NotImplementedError(msg)
    if p.softcap is not None:
        msg = (
            f"impl='native' cannot soft-cap scores on {lib}: its fused kernel has no softcap; "
            "use impl='auto', 'blockwise' or 'materialize'"
        )
        raise NotImplementedError(msg)
    if p.lk == 0 or p.lq == 0:
        out, _ = empty_result(p, xp=xp)
        return out, None
    # Plain top-left causal is the kernels' own is_causal (never a fully
    # hidden row, and no (Lq, Lk) mask to build); anything else is one mask.
    s = p.structure
    is_causal = (
        s.causal
        and s.offset == 0
        and s.window is None
        and p.mask is None
        and p.bias is None  # torch refuses is_causal together with attn_mask
        and p.key_lengths is None
        and p.query_lengths is None
    )
    allowed = None if is_causal else p.allowed(0, p.lq, 0, p.lk, xp=xp)  # (..., Lq, Lk) | None
    bias = p.bias_tile(0, p.lq, 0, p.lk)
    shape = (*p.batch, p.lq, p.lk)
    q = xp.broadcast_to(p.q, (*p.batch, p.lq, p.q.shape[-1]))
    k = xp.broadcast_to(p.k, (*p.batch, p.lk, p.k.shape[-1]))
    v = xp.broadcast_to(p.v, (*p.batch, p.lk, p.dv))
    if allowed is not None:
        allowed = xp.broadcast_to(allowed, shape)
    if bias is not None:
        bias = xp.broadcast_to(bias, shape)
    if lib == "torch":
        out = _torch(q, k, v, allowed, bias, is_causal=is_causal)
    else:
        out = _jax(q, k, v, allowed, bias, is_causal=is_causal, xp=xp)
    # Rows that see nothing are 0 by portattn's contract; kernels differ here
    # (torch's math kernel gives NaN, JAX spreads the weight uniformly).
    visible = None if allowed is None else allowed
    if bias is not None:
        finite = bias > -xp.inf
        visible = finite if visible is None else xp.logical_and(visible, finite)
    if visible is not None:
        row_seen = xp.any(visible, axis=-1, keepdims=True)  # (..., Lq, 1)
        out = xp.where(row_seen, out, xp.zeros_like(out))
    return out, None


def _torch(
    q: Array, k: Array, v: Array, allowed: Array | None, bias: Array | None, *, is_causal: bool
) -> Array:
    import torch.nn.functional as F

    mask = allowed
    if bias is not None:
        mask = bias if allowed is None else bias.masked_fill(~allowed, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=1.0)


def _jax(
    q: Array,
    k: Array,
    v: Array,
    allowed: Array | None,
    bias: Array | None,
    *,
    is_causal: bool,
    xp: Namespace,
) -> Array:
    import jax

    if q.dtype == xp.float64:
        msg = (
            "impl='native' on JAX cannot keep float64: jax.nn.dot_product_attention computes "
            "its softmax in float32; use impl='auto' for float64"
        )
        raise NotImplementedError(msg)
    if q.shape[-1] != v.shape[-1]:
        msg = (
            "impl='native' on JAX needs value's feature size to equal query's "
            f"(jax.nn.dot_product_attention requires it), got d={q.shape[-1]} and "
            f"dv={v.shape[-1]}; use impl='auto'"
        )
        raise NotImplementedError(msg)
    batch = tuple(q.shape[:-2])
    flat = math.prod(batch)
    lq, lk = q.shape[-2], k.shape[-2]

    def heads_last(x: Array) -> Array:  # (..., L, d) -> (B, L, 1, d): JAX's BTNH layout
        return xp.reshape(x, (flat, x.shape[-2], 1, x.shape[-1]))

    def scores_like(x: Array | None) -> Array | None:  # (..., Lq, Lk) -> (B, 1, Lq, Lk)
        return None if x is None else xp.reshape(x, (flat, 1, lq, lk))

    out = jax.nn.dot_product_attention(
        heads_last(q),
        heads_last(k),
        heads_last(v),
        bias=scores_like(bias),
        mask=scores_like(allowed),
        scale=1.0,
        is_causal=is_causal,
    )
    return xp.reshape(out, (*batch, lq, v.shape[-1]))
