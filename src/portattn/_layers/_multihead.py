"""Multi-head attention (MHA, GQA, MQA), cross-attention and KV caching: the class and its helpers.

The heads run as one problem, whose core groups the H query heads onto the Hkv
key/value heads (:mod:`portattn._core._groups`); torch conversion: :mod:`._torch_convert`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from .._attention import attend
from .._core._groups import check_heads, heads_layout, split_heads
from .._core._masks import Causal
from .._core._variant import Variant, build_variant
from .._lib._checks import (
    check_array,
    check_flag,
    check_int,
    check_real,
    check_same_device,
    check_shapes,
    check_weights,
    check_width,
    dtype_name,
    int_shape,
    shown,
)
from .._lib._compat import array_namespace, device_of, resolve_namespace
from .._lib._random import draw_weights
from .._lib._typing import Array, Device, DType, Namespace
from ._kvcache import KVCache, Staged, cache_step
from ._positions import RopeLayout, check_rope, check_rope_call, rope_heads
from ._torch_convert import from_torch, from_torch_weights, to_torch

__all__ = ["MultiHeadAttention"]

_WEIGHTS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")  # the constructor's order
_INPUTS = ("x", "context", "mask", "key_lengths", "positions")  # a call's arrays, in order


class MultiHeadAttention:
    """Multi-head attention ``concat_h(attention(x Wq_h, c Wk_g(h), c Wv_g(h))) Wo``.

    Projections are ``x @ w (+ b)``. Query head ``h`` uses columns
    ``h*d_head:(h+1)*d_head`` of ``wq`` and reads KV head ``h // (H // Hkv)``
    (torch's ``enable_gqa`` convention): ``Hkv == H`` is classic multi-head
    attention, ``1 < Hkv < H`` grouped-query (GQA), ``Hkv == 1`` multi-query
    (MQA).

    Parameters
    ----------
    wq : array, shape (d_model, H * d_head)
        Query projection: head ``h`` uses columns ``h*d_head`` to ``(h+1)*d_head``.
    wk, wv : array, shape (d_context, Hkv * d_head)
        ``d_context == d_model`` for self-attention; cross-attention may read
        a context of another width.
    wo : array, shape (H * d_head, d_model)
        Output projection, mixing the concatenated heads.
    num_heads : int
        ``H``; must divide ``wq.shape[1]``.
    num_kv_heads : int, optional
        ``Hkv``; must divide ``H``. Default ``H``.
    bq, bk, bv, bo : array, optional
        Biases of shapes (H*d_head,), (Hkv*d_head,), (Hkv*d_head,), (d_model,).
    rope : {None, "half", "interleaved"}, optional
        Rotate queries and keys with RoPE in this pair layout (see
        :func:`portattn.apply_rope`) before attention. Default: no rotation.
    rope_base : float, optional
        RoPE frequency base.

    Attributes
    ----------
    num_heads, num_kv_heads, d_head, d_model, d_context : int
        ``H``, ``Hkv``, the head width, and the widths of ``x`` and of the context.
    group_size : int
        ``H // Hkv``, query heads per KV head.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> mha = pa.MultiHeadAttention.random(8, 4, num_kv_heads=2, xp=np)
    >>> mha.num_heads, mha.num_kv_heads, mha.d_head, mha.group_size
    (4, 2, 2, 2)
    >>> mha(np.ones((3, 5, 8)), causal=True).shape
    (3, 5, 8)
    """

    def __init__(
        self,
        wq: Array,
        wk: Array,
        wv: Array,
        wo: Array,
        /,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        bq: Array | None = None,
        bk: Array | None = None,
        bv: Array | None = None,
        bo: Array | None = None,
        rope: RopeLayout | None = None,
        rope_base: float = 10000.0,
    ) -> None:
        w = dict(zip(_WEIGHTS, (wq, wk, wv, wo, bq, bk, bv, bo), strict=True))
        for name in _WEIGHTS[:4]:
            check_array(name, w[name])
        xp = array_namespace(*w.values(), names=_WEIGHTS)
        self.num_heads, self.num_kv_heads = h, hkv = check_heads(num_heads, num_kv_heads)
        self.d_head, self.d_model, self.d_context = _sizes(w, h, hkv, rope=rope, xp=xp)
        self.rope_base = check_real("rope_base", rope_base, above=1.0)  # as apply_rope's base
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.bq, self.bk, self.bv, self.bo = bq, bk, bv, bo
        self.group_size = h // hkv
        self.rope: RopeLayout | None = rope

    def __repr__(self) -> str:
        has_bias = any(b is not None for b in (self.bq, self.bk, self.bv, self.bo))
        ctx = "" if self.d_context == self.d_model else f", d_context={self.d_context}"
        return (
            f"MultiHeadAttention(d_model={self.d_model}{ctx}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, d_head={self.d_head}, bias={has_bias}, "
            f"rope={self.rope!r}, dtype={dtype_name(self.wq.dtype)})"
        )

    @classmethod
    def random(
        cls,
        d_model: int,
        num_heads: int,
        /,
        *,
        num_kv_heads: int | None = None,
        d_head: int | None = None,
        bias: bool = False,
        seed: int = 0,
        rope: RopeLayout | None = None,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
    ) -> MultiHeadAttention:
        """Deterministic random weights, bit-identical on every backend.

        One float64 draw of i.i.d. standard normals from NumPy's PCG64 seeded
        with ``seed`` fills, in order, ``wq``, ``wk``, ``wv``, ``wo`` and (with
        ``bias``) ``bq``, ``bk``, ``bv``, ``bo``. Each entry is scaled by
        ``1/sqrt(fan_in)``: ``1/sqrt(d_model)`` for the input projections and
        their biases, ``1/sqrt(H * d_head)`` for ``wo`` and ``bo``, so
        activations stay at unit scale. Values are rounded to ``dtype`` only
        at the end.

        Parameters
        ----------
        d_model, num_heads : int
            Model width and number of query heads.
        num_kv_heads, rope : optional
            As in the constructor.
        d_head : int, optional
            Head width. Default ``d_model // num_heads``, which requires
            ``num_heads`` to divide ``d_model``.
        bias, seed : optional
            Whether to draw the four biases too; the non-negative seed.
        xp, dtype, device : optional
            Array library (``None``: NumPy), real floating dtype (default
            float32), and device in ``xp``'s terms.

        Examples
        --------
        >>> import portattn as pa
        >>> pa.MultiHeadAttention.random(6, 3).d_head
        2
        """
        w, h, hkv = _random_weights(
            d_model, num_heads, num_kv_heads, d_head, bias=bias, seed=seed, xp=xp, dtype=dtype,
            device=device,
        )  # fmt: skip
        return cls._of(w, num_heads=h, num_kv_heads=hkv, rope=rope)

    @classmethod
    def from_torch_weights(
        cls,
        in_proj_weight: Array,
        out_proj_weight: Array,
        /,
        *,
        num_heads: int,
        in_proj_bias: Array | None = None,
        out_proj_bias: Array | None = None,
    ) -> MultiHeadAttention:
        """Build from ``torch.nn.MultiheadAttention``'s packed weights, in any array library.

        torch computes ``x @ W.T + b``. The query, key and value blocks of
        ``in_proj_weight`` (3 * d_model, d_model) become ``wq``, ``wk``,
        ``wv``, and ``out_proj.weight`` (d_model, d_model) becomes ``wo``,
        transposed: views of the inputs, in their library. Works on the
        tensors or on NumPy copies of a ``state_dict`` (no torch needed).
        ``in_proj_bias`` (3 * d_model,) and ``out_proj_bias`` (d_model,) are
        ``None`` for a module built with ``bias=False``; ``num_heads`` must
        divide ``d_model``, and ``num_kv_heads`` is ``num_heads``.

        Examples
        --------
        >>> import numpy as np
        >>> import portattn as pa
        >>> w_in, w_out = np.zeros((12, 4)), np.eye(4)
        >>> pa.MultiHeadAttention.from_torch_weights(w_in, w_out, num_heads=2).d_head
        2
        """
        arrays = from_torch_weights(in_proj_weight, out_proj_weight, in_proj_bias, out_proj_bias)
        return cls._of(arrays, num_heads=num_heads)

    @classmethod
    def from_torch(
        cls,
        module: Any,
        /,
        *,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
    ) -> MultiHeadAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` into ``xp`` arrays.

        ``xp`` defaults to NumPy and ``dtype`` to the module's precision
        (float32 stays float32, float64 stays float64). A module with
        ``add_bias_kv``, ``add_zero_attn`` (no counterpart here) or
        ``kdim != vdim`` (one context feeds keys and values) is refused.
        Call the layer in ``batch_first`` layout, (..., L, d_model).
        """
        arrays = from_torch(module, xp=xp, dtype=dtype, device=device)
        return cls._of(arrays, num_heads=module.num_heads)

    @classmethod
    def _of(cls, arrays: Sequence[Array], **options: Any) -> MultiHeadAttention:
        """A layer of ``arrays`` in the constructor's order, ``wq`` to ``bo`` (biases optional)."""
        return cls(*arrays[:4], **dict(zip(_WEIGHTS[4:], arrays[4:], strict=False)), **options)

    def to_torch(self) -> Any:
        """A ``torch.nn.MultiheadAttention`` (``batch_first=True``, CPU) holding these weights.

        Requires ``num_kv_heads == num_heads`` (torch's module has no GQA) and
        no RoPE. Missing biases become zeros when only some are present.
        """
        heads = {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads}
        return to_torch(*(getattr(self, name) for name in _WEIGHTS), **heads, rope=self.rope)

    def new_cache(
        self, *, batch_shape: tuple[int, ...] = (), capacity: int | None = None
    ) -> KVCache:
        """An empty :class:`KVCache` matching these heads, dtype, library and device.

        Examples
        --------
        >>> import portattn as pa
        >>> pa.MultiHeadAttention.random(8, 4, num_kv_heads=1).new_cache(capacity=16)
        KVCache(num_kv_heads=1, d_head=2, batch_shape=(), length=0, capacity=16, dtype=float32)
        """
        sizes, like = (self.num_kv_heads, self.d_head), {"dtype": self.wk.dtype}
        like |= {"xp": array_namespace(self.wk), "device": device_of(self.wk)}
        return KVCache(*sizes, batch_shape=batch_shape, capacity=capacity, **like)

    def __call__(
        self,
        x: Array,
        /,
        context: Array | None = None,
        *,
        mask: Array | None = None,
        causal: Causal = False,
        window: int | tuple[int, int] | None = None,
        key_lengths: Array | None = None,
        positions: Array | None = None,
        cache: KVCache | None = None,
    ) -> Array:
        """Attend from ``x`` to itself, or to ``context`` (cross-attention).

        Parameters
        ----------
        x : array, shape (..., Lq, d_model)
            The queries' tokens (and keys' and values' in self-attention).
        context : array, shape (..., Lk, d_context), optional
            Tokens to attend to; ``Lk != Lq`` is fine. Not combinable with
            ``cache`` or RoPE.
        mask : bool array, optional
            True where a query may attend. Either (..., Lq, Lk), shared by
            every head and broadcastable to x's batch, or the torch / Hugging
            Face layout (\\*batch, 1 or H, Lq, Lk): exactly one axis more than
            x's batch, read as a heads axis (size 1: shared; size H: one mask
            per query head). Any other extra axis is refused, never broadcast
            into a larger batch.
        causal, window : optional
            As in :func:`portattn.attention`. With a ``cache``, ``causal=True``
            means bottom-right alignment: the new tokens are the last ones.
        key_lengths : integer array, optional
            Valid key lengths, one per sequence: broadcastable to x's batch
            shape ``...`` with no more axes than it (shape (B, 1) for a batch
            (B,) is refused, not broadcast to (B, B)).
        positions : integer array, shape (..., Lq), optional
            RoPE positions of the tokens in ``x`` (requires ``rope``).
            Default ``0..Lq-1``, or continuing from ``cache.length``.
        cache : KVCache, optional
            Keys and values of earlier tokens; this call appends the new
            ones and attends over all of them. The append is committed only
            when the whole call succeeds: a call that raises leaves the
            cache exactly as it was.

        Returns
        -------
        array, shape (..., Lq, d_model)
        """
        if cache is not None and not isinstance(cache, KVCache):
            msg = f"expected cache to be a KVCache or None, got {shown(cache)}"
            raise TypeError(msg)
        # The cache's lock is held from staging the new tokens to committing them.
        with nullcontext() if cache is None else cache.lock:
            given = {"mask": mask, "causal": causal, "window": window, "key_lengths": key_lengths}
            (q, k, v), variant, staged, xp = _operands(self, x, context, positions, given, cache)
            out = attend(q, k, v, variant=variant, xp=xp)  # (..., H, Lq, dh)
            if staged is not None:
                staged.commit()  # only once everything else succeeded
        assert not isinstance(out, tuple)
        return _project(_merge_heads(out, xp=xp), self.wo, self.bo)  # (..., Lq, d_model)

    def weights(
        self,
        x: Array,
        /,
        context: Array | None = None,
        *,
        mask: Array | None = None,
        causal: Causal = False,
        window: int | tuple[int, int] | None = None,
        key_lengths: Array | None = None,
        positions: Array | None = None,
    ) -> Array:
        """Each head's attention weights, shape (..., H, Lq, Lk); options as in ``__call__``.

        Examples
        --------
        >>> import portattn as pa
        >>> import numpy as np
        >>> mha = pa.MultiHeadAttention.random(8, 4)
        >>> mha.weights(np.ones((5, 8), dtype=np.float32), causal=True).shape
        (4, 5, 5)
        """
        given = {"mask": mask, "causal": causal, "window": window, "key_lengths": key_lengths}
        (q, k, _), variant, _, xp = _operands(self, x, context, positions, given, None)
        out = attend(q, k, None, variant=variant, xp=xp)  # (..., H, Lq, Lk)
        assert not isinstance(out, tuple)
        return out


def _random_weights(
    d_model: int,
    num_heads: int,
    num_kv_heads: int | None,
    d_head: int | None,
    *,
    bias: bool,
    seed: int,
    xp: Namespace | None,
    dtype: DType | None,
    device: Device | None,
) -> tuple[list[Array], int, int]:
    """:meth:`MultiHeadAttention.random`'s arrays (``wq`` to ``bo``), checked ``H`` and ``Hkv``."""
    ns, d = resolve_namespace(xp), check_int("d_model", d_model, minimum=1)
    h, hkv = check_heads(num_heads, num_kv_heads)
    if d_head is None and d % h:
        msg = (
            f"expected num_heads to divide d_model when d_head is not given, got "
            f"d_model={d}, num_heads={h}; pass d_head= explicitly"
        )
        raise ValueError(msg)
    dh = check_int("d_head", d // h if d_head is None else d_head, minimum=1)
    inner, kv = h * dh, hkv * dh
    shapes: list[tuple[int, ...]] = [(d, inner), (d, kv), (d, kv), (inner, d)]
    if check_flag("bias", bias):
        shapes += [(inner,), (kv,), (kv,), (d,)]
    fan_in = [inner if name[1] == "o" else d for name in _WEIGHTS[: len(shapes)]]
    scales = [n**-0.5 for n in fan_in]
    w = draw_weights(shapes, scales, seed=seed, xp=ns, dtype=dtype, device=device)
    return w, h, hkv


def _merge_heads(out: Array, *, xp: Namespace) -> Array:
    """Every head's output (..., H, Lq, dh) side by side, token-major: (..., Lq, H * dh)."""
    nb = out.ndim - 3
    out = xp.permute_dims(out, (*range(nb), nb + 1, nb, nb + 2))  # (..., Lq, H, dh)
    return xp.reshape(out, (*out.shape[:-2], out.shape[-2] * out.shape[-1]))


def _operands(
    layer: MultiHeadAttention,
    x: Array,
    context: Array | None,
    positions: Array | None,
    given: dict[str, Any],
    cache: KVCache | None,
) -> tuple[tuple[Array, Array, Array], Variant, Staged | None, Namespace]:
    """Every head's q, k and v for :func:`attend`, their variant, the staged tokens, the xp.

    ``layer``'s projections of a call (``__call__`` and ``weights`` share
    it); ``given`` holds the call's options by name. What does not depend on
    the projections is checked before they are computed.
    """
    check_array("x", x)
    inputs = given | {"x": x, "context": context, "positions": positions}
    xp = array_namespace(*(inputs[n] for n in _INPUTS), layer.wq, names=_INPUTS)  # once
    src = _source(layer, x, context, positions, cache, xp=xp)
    lk = int(src.shape[-2]) + (0 if cache is None else cache.length)
    options = heads_layout(given, int_shape(x), lk, heads=layer.num_heads, xp=xp)
    q = split_heads(_project(x, layer.wq, layer.bq), layer.num_heads, xp=xp)  # (..., H, Lq, dh)
    kv = ((layer.wk, layer.bk), (layer.wv, layer.bv))  # k, v (..., Hkv, Lk, dh)
    k, v = (split_heads(_project(src, w, b), layer.num_kv_heads, xp=xp) for w, b in kv)
    if layer.rope is not None:
        offset = 0 if cache is None else cache.length
        q, k = rope_heads(
            q, k, positions, offset=offset, layout=layer.rope, base=layer.rope_base, xp=xp
        )
    staged = None
    if cache is not None:  # k, v (..., Hkv, Lk, dh), Lk = all tokens so far
        k, v, causal, staged = cache_step(cache, k, v, causal=options["causal"], xp=xp)
        options["causal"] = causal
    # One rank for q, k and v (a context may have fewer batch axes than x,
    # or more), so that the core reads the heads as groups.
    nd = max(q.ndim, k.ndim)
    q, k, v = (xp.reshape(t, (1,) * (nd - t.ndim) + tuple(t.shape)) for t in (q, k, v))
    return (q, k, v), build_variant(**options), staged, xp


def _source(
    layer: MultiHeadAttention,
    x: Array,
    context: Array | None,
    positions: Array | None,
    cache: object,
    *,
    xp: Any,
) -> Array:
    """Check ``x``, ``context`` and ``positions`` against the layer; return the keys' source."""
    check_width("x", x, layer.d_model, "Lq, d_model", xp=xp)
    check_width("context", context, layer.d_context, "Lk, d_context", xp=xp)
    if context is None and layer.d_context != layer.d_model:
        msg = (
            f"expected a context (keys and values have width d_context={layer.d_context} "
            f"!= d_model={layer.d_model}), got context=None"
        )
        raise ValueError(msg)
    if context is not None and cache is not None:
        msg = "expected cache=None with a context: the KV cache serves causal self-attention"
        raise ValueError(msg)
    check_rope_call(layer.rope, positions, context, int_shape(x))
    check_same_device([("weights", layer.wq), ("x", x), ("context", context)])
    return x if context is None else context


def _sizes(
    w: dict[str, Array], h: int, hkv: int, *, rope: object, xp: Namespace
) -> tuple[int, int, int]:
    """``(d_head, d_model, d_context)``: the weights ``w`` and ``rope`` checked together."""
    check_weights(list(w.items()), xp=xp)
    (d_model, inner), d_context = int_shape(w["wq"]), int(w["wk"].shape[0])
    if inner % h:
        msg = (
            f"expected wq of shape (d_model, num_heads * d_head) with num_heads={h} "
            f"dividing its {inner} columns, got shape {int_shape(w['wq'])}"
        )
        raise ValueError(msg)
    dh, kv = inner // h, (d_context, hkv * inner // h)
    sizes = f"num_heads={h}, num_kv_heads={hkv}, d_head={dh}, d_model={d_model}"
    want = [kv, kv, (inner, d_model), (inner,), kv[1:], kv[1:], (d_model,)]
    check_shapes(list(w.items())[1:], want, why=sizes)
    check_rope(rope, dh)
    check_same_device(list(w.items()))
    return dh, d_model, d_context


def _project(t: Array, w: Array, b: Array | None) -> Array:
    """``t @ w (+ b)``: one projection, token-major (..., L, heads * dh)."""
    return t @ w if b is None else t @ w + b
