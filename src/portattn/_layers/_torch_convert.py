"""Conversion between :class:`~portattn.MultiHeadAttention` and ``torch.nn.MultiheadAttention``.

Kept apart from the class, since torch is optional: the class's
``from_torch_weights``, ``from_torch`` and ``to_torch`` delegate here, and
this module reads and returns arrays only, never the class.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lib._checks import check_array
from .._lib._compat import array_namespace, resolve_namespace
from .._lib._convert import to_numpy
from .._lib._random import from_numpy_float64
from .._lib._typing import Array, Device, DType, Namespace

__all__ = ["from_torch", "from_torch_weights", "to_torch"]

# MultiHeadAttention's constructor arrays, in its order: wq, wk, wv, wo, bq, bk, bv, bo.
Weights = tuple[Array | None, ...]


def from_torch_weights(
    in_proj_weight: Array,
    out_proj_weight: Array,
    in_proj_bias: Array | None,
    out_proj_bias: Array | None,
) -> Weights:
    """The constructor arguments of :meth:`MultiHeadAttention.from_torch_weights`."""
    named = {"in_proj_weight": in_proj_weight, "out_proj_weight": out_proj_weight}
    named |= {"in_proj_bias": in_proj_bias, "out_proj_bias": out_proj_bias}
    for name, a in named.items():
        if a is not None or name.endswith("weight"):
            check_array(name, a)
    xp = array_namespace(in_proj_weight, out_proj_weight, in_proj_bias, out_proj_bias)
    w = in_proj_weight
    if w.ndim != 2 or int(w.shape[0]) != 3 * int(w.shape[1]):
        msg = f"expected in_proj_weight of shape (3 * d_model, d_model), got shape {tuple(w.shape)}"
        raise ValueError(msg)
    d = int(w.shape[1])
    wq, wk, wv = (xp.matrix_transpose(w[i * d : (i + 1) * d, :]) for i in range(3))
    bq = bk = bv = None
    if in_proj_bias is not None:
        if tuple(in_proj_bias.shape) != (3 * d,):
            got = tuple(in_proj_bias.shape)
            msg = f"expected in_proj_bias of shape ({3 * d},), got shape {got}"
            raise ValueError(msg)
        bq, bk, bv = (in_proj_bias[i * d : (i + 1) * d] for i in range(3))
    if out_proj_weight.ndim != 2:
        got = tuple(out_proj_weight.shape)
        msg = f"expected out_proj_weight of shape ({d}, {d}), got shape {got}"
        raise ValueError(msg)
    wo = xp.matrix_transpose(out_proj_weight)
    return wq, wk, wv, wo, bq, bk, bv, out_proj_bias


def from_torch(
    module: Any,
    /,
    *,
    xp: Namespace | None = None,
    dtype: DType | None = None,
    device: Device | None = None,
) -> Weights:
    """The constructor arguments of :meth:`MultiHeadAttention.from_torch`."""
    mha_class: Any = None
    try:
        import torch

        mha_class = torch.nn.MultiheadAttention
    except ImportError:  # then module cannot be a torch module either
        pass
    if mha_class is None or not isinstance(module, mha_class):
        msg = f"expected a torch.nn.MultiheadAttention, got {type(module).__name__}"
        raise TypeError(msg)
    ns = resolve_namespace(xp)
    if getattr(module, "bias_k", None) is not None or getattr(module, "add_zero_attn", False):
        msg = (
            "expected a torch.nn.MultiheadAttention without add_bias_kv or add_zero_attn, "
            "got one that uses them"
        )
        raise ValueError(msg)
    if module.kdim != module.vdim:
        msg = (
            "expected kdim == vdim (one context feeds keys and values), "
            f"got kdim={module.kdim}, vdim={module.vdim}"
        )
        raise ValueError(msg)

    def conv(t: Any) -> Array | None:
        if t is None:
            return None
        a = to_numpy(t.detach())
        target = dtype
        if target is None:
            target = ns.float64 if a.dtype == np.float64 else ns.float32
        return from_numpy_float64(a.astype(np.float64), xp=ns, dtype=target, device=device)

    e = module.embed_dim
    if module.in_proj_weight is not None:
        w = module.in_proj_weight
        wq, wk, wv = (conv(w[i * e : (i + 1) * e].T) for i in range(3))
    else:
        wq, wk, wv = (
            conv(module.q_proj_weight.T),
            conv(module.k_proj_weight.T),
            conv(module.v_proj_weight.T),
        )
    bq = bk = bv = None
    if module.in_proj_bias is not None:
        b = module.in_proj_bias
        bq, bk, bv = (conv(b[i * e : (i + 1) * e]) for i in range(3))
    return wq, wk, wv, conv(module.out_proj.weight.T), bq, bk, bv, conv(module.out_proj.bias)


def to_torch(*weights: Array, num_heads: int, num_kv_heads: int, rope: str | None) -> Any:
    """:meth:`MultiHeadAttention.to_torch` from the layer's arrays (``wq`` to ``bo``) and heads."""
    import torch

    if num_kv_heads != num_heads or rope is not None:
        msg = (
            "expected num_kv_heads == num_heads and rope=None (torch.nn.MultiheadAttention "
            f"has neither GQA nor RoPE), got num_kv_heads={num_kv_heads}, "
            f"num_heads={num_heads}, rope={rope!r}"
        )
        raise ValueError(msg)
    wq, wk, wv, wo, bq, bk, bv, bo = weights
    (d_model, inner), d_context = (int(n) for n in wq.shape), int(wk.shape[0])
    if inner != d_model:
        msg = (
            "expected num_heads * d_head == d_model (torch.nn.MultiheadAttention's layout), "
            f"got {num_heads} * {inner // num_heads} != {d_model}"
        )
        raise ValueError(msg)
    has_bias = any(b is not None for b in (bq, bk, bv, bo))
    w = {"wq": to_numpy(wq), "wk": to_numpy(wk), "wv": to_numpy(wv), "wo": to_numpy(wo)}
    dtype = torch.float64 if w["wq"].dtype == np.float64 else torch.float32
    kdim = None if d_context == d_model else d_context
    module = torch.nn.MultiheadAttention(
        d_model,
        num_heads,
        bias=has_bias,
        batch_first=True,
        kdim=kdim,
        vdim=kdim,
        dtype=dtype,
    )

    def t(a: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)

    def b(x: Array | None, n: int) -> np.ndarray:
        return np.zeros(n) if x is None else to_numpy(x)

    with torch.no_grad():
        if module.in_proj_weight is not None:
            module.in_proj_weight.copy_(t(np.concatenate([w["wq"].T, w["wk"].T, w["wv"].T])))
        else:
            module.q_proj_weight.copy_(t(w["wq"].T))
            module.k_proj_weight.copy_(t(w["wk"].T))
            module.v_proj_weight.copy_(t(w["wv"].T))
        module.out_proj.weight.copy_(t(w["wo"].T))
        if has_bias:
            parts = [b(bq, inner), b(bk, inner), b(bv, inner)]
            module.in_proj_bias.copy_(t(np.concatenate(parts)))
            module.out_proj.bias.copy_(t(b(bo, d_model)))
    return module
