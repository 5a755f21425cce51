"""Multi-head attention with grouped KV heads (MHA, GQA, MQA), cross-attention and KV caching.

Every head is the single head of the chapter with its own slice of the
projections; the heads run as one batched :func:`portattn.attention` call.
Grouped-query attention never repeats keys or values: queries are reshaped to
(..., Hkv, G, Lq, d_head) and keys to (..., Hkv, 1, Lk, d_head), and batch
broadcasting pairs each group of ``G`` query heads with its one KV head.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import numpy as np

from .._attention import solve, solve_weights
from .._core._masks import Causal
from .._core._problem import Problem, prepare
from .._lib._checks import check_floating, check_same_device, dtype_name
from .._lib._compat import array_namespace, device_of, resolve_namespace
from .._lib._random import from_numpy_float64, standard_normal
from .._lib._typing import Array, Device, DType, Namespace
from ._kvcache import KVCache, Staged
from ._positions import RopeLayout, rope_impl
from ._torch_convert import from_torch, from_torch_weights, to_torch

__all__ = ["MultiHeadAttention"]


def _positive(name: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        msg = f"expected {name} to be a positive int, got {n!r}"
        raise ValueError(msg)
    return n


def _check_heads(num_heads: int, num_kv_heads: int | None) -> tuple[int, int]:
    h = _positive("num_heads", num_heads)
    hkv = h if num_kv_heads is None else _positive("num_kv_heads", num_kv_heads)
    if h % hkv:
        msg = (
            f"expected num_kv_heads to divide num_heads (each KV head serves a group of "
            f"query heads), got num_heads={h}, num_kv_heads={hkv}"
        )
        raise ValueError(msg)
    return h, hkv


def _shape(a: Array) -> tuple[int, ...]:
    return tuple(int(n) for n in a.shape)


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
    >>> import array_api_strict as xp
    >>> import portattn as pa
    >>> mha = pa.MultiHeadAttention.random(8, 4, num_kv_heads=2, xp=xp)
    >>> mha.num_heads, mha.num_kv_heads, mha.d_head, mha.group_size
    (4, 2, 2, 2)
    >>> mha(xp.ones((3, 5, 8)), causal=True).shape
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
        xp = array_namespace(wq, wk, wv, wo, bq, bk, bv, bo)
        h, hkv = _check_heads(num_heads, num_kv_heads)
        named = (("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo))
        for name, w in named:
            check_floating(name, w, xp=xp)
            if w.ndim != 2:
                msg = f"expected {name} to be a 2-D matrix, got shape {_shape(w)}"
                raise ValueError(msg)
        d_model, inner = _shape(wq)
        if inner % h:
            msg = (
                f"expected wq of shape (d_model, num_heads * d_head) with num_heads={h} "
                f"dividing its {inner} columns, got shape {_shape(wq)}"
            )
            raise ValueError(msg)
        d_head = inner // h
        d_context = int(wk.shape[0])
        want = {
            "wk": (d_context, hkv * d_head),
            "wv": (d_context, hkv * d_head),
            "wo": (h * d_head, d_model),
        }
        for name, w in named[1:]:
            if _shape(w) != want[name]:
                msg = (
                    f"expected {name} of shape {want[name]} (num_heads={h}, num_kv_heads={hkv}, "
                    f"d_head={d_head}, d_model={d_model}), got shape {_shape(w)}"
                )
                raise ValueError(msg)
        biases = (("bq", bq, h * d_head), ("bk", bk, hkv * d_head), ("bv", bv, hkv * d_head))
        for name, b, n in (*biases, ("bo", bo, d_model)):
            if b is None:
                continue
            check_floating(name, b, xp=xp)
            if _shape(b) != (n,):
                msg = f"expected {name} of shape ({n},), got shape {_shape(b)}"
                raise ValueError(msg)
        if rope is not None and (rope not in ("half", "interleaved") or d_head % 2):
            msg = (
                "expected rope to be None, 'half' or 'interleaved' with an even d_head, "
                f"got rope={rope!r} with d_head={d_head}"
            )
            raise ValueError(msg)
        check_same_device(
            [
                ("wq", wq),
                ("wk", wk),
                ("wv", wv),
                ("wo", wo),
                ("bq", bq),
                ("bk", bk),
                ("bv", bv),
                ("bo", bo),
            ]
        )
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.bq, self.bk, self.bv, self.bo = bq, bk, bv, bo
        self.num_heads, self.num_kv_heads, self.d_head = h, hkv, d_head
        self.group_size = h // hkv
        self.d_model, self.d_context = d_model, d_context
        self.rope: RopeLayout | None = rope
        self.rope_base = float(rope_base)

    def __repr__(self) -> str:
        has_bias = any(b is not None for b in (self.bq, self.bk, self.bv, self.bo))
        ctx = "" if self.d_context == self.d_model else f", d_context={self.d_context}"
        return (
            f"MultiHeadAttention(d_model={self.d_model}{ctx}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, d_head={self.d_head}, bias={has_bias}, "
            f"rope={self.rope!r}, dtype={dtype_name(self.wq.dtype)})"
        )

    # ----------------------------------------------------------------- construction

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
        num_kv_heads : int, optional
            Number of key/value heads; must divide ``num_heads``. Default
            ``num_heads``.
        d_head : int, optional
            Head width. Default ``d_model // num_heads``, which requires
            ``num_heads`` to divide ``d_model``.
        bias : bool, optional
            Also draw the four biases.
        seed : int, optional
            Non-negative seed.
        rope : {None, "half", "interleaved"}, optional
            As in the constructor.
        xp : namespace or module, optional
            Array library; ``None`` means NumPy.
        dtype : dtype, optional
            Real floating dtype; default float32.
        device : optional
            Device in ``xp``'s terms.

        Returns
        -------
        MultiHeadAttention

        Raises
        ------
        ValueError
            ``num_heads`` does not divide ``d_model`` and no ``d_head`` is
            given; ``num_kv_heads`` does not divide ``num_heads``.

        Examples
        --------
        >>> import portattn as pa
        >>> pa.MultiHeadAttention.random(6, 3).d_head
        2
        """
        ns = resolve_namespace(xp)
        d_model = _positive("d_model", d_model)
        h, hkv = _check_heads(num_heads, num_kv_heads)
        if d_head is None:
            if d_model % h:
                msg = (
                    f"expected num_heads to divide d_model when d_head is not given, got "
                    f"d_model={d_model}, num_heads={h}; pass d_head= explicitly"
                )
                raise ValueError(msg)
            d_head = d_model // h
        d_head = _positive("d_head", d_head)
        inner, kv = h * d_head, hkv * d_head
        shapes: list[tuple[int, ...]] = [(d_model, inner), (d_model, kv), (d_model, kv)]
        shapes.append((inner, d_model))
        stds = [d_model**-0.5] * 3 + [inner**-0.5]
        if bias:
            shapes += [(inner,), (kv,), (kv,), (d_model,)]
            stds += [d_model**-0.5] * 3 + [inner**-0.5]
        sizes = [math.prod(s) for s in shapes]
        flat = standard_normal((sum(sizes),), seed=seed)
        parts = []
        start = 0
        for shape, size, std in zip(shapes, sizes, stds, strict=True):
            a = np.reshape(flat[start : start + size], shape) * std
            parts.append(from_numpy_float64(a, xp=ns, dtype=dtype, device=device))
            start += size
        wq, wk, wv, wo = parts[:4]
        bq, bk, bv, bo = parts[4:] if bias else (None, None, None, None)
        return cls(
            wq, wk, wv, wo, num_heads=h, num_kv_heads=hkv, bq=bq, bk=bk, bv=bv, bo=bo, rope=rope
        )

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

        torch computes ``x @ W.T + b`` with ``in_proj_weight`` stacking the
        query, key and value weights as (3 * d_model, d_model); here the
        three blocks are transposed into ``wq``, ``wk``, ``wv`` and
        ``out_proj.weight`` into ``wo``. Works on the tensors themselves or
        on NumPy copies of a ``state_dict`` (torch need not be installed).

        Parameters
        ----------
        in_proj_weight : array, shape (3 * d_model, d_model)
            torch's ``in_proj_weight``: the query, key and value weights stacked.
        out_proj_weight : array, shape (d_model, d_model)
            torch's ``out_proj.weight``.
        num_heads : int
            Number of heads; must divide ``d_model``.
        in_proj_bias : array, shape (3 * d_model,), optional
            torch's ``in_proj_bias``; ``None`` for a layer built with ``bias=False``.
        out_proj_bias : array, shape (d_model,), optional
            torch's ``out_proj.bias``; ``None`` for a layer built with ``bias=False``.

        Returns
        -------
        MultiHeadAttention
            With ``num_kv_heads == num_heads``; the arrays are views or
            transposes of the inputs, in their library.

        Examples
        --------
        >>> import numpy as np
        >>> import portattn as pa
        >>> w_in, w_out = np.zeros((12, 4)), np.eye(4)
        >>> pa.MultiHeadAttention.from_torch_weights(w_in, w_out, num_heads=2).d_head
        2
        """
        arrays, options = from_torch_weights(
            in_proj_weight,
            out_proj_weight,
            num_heads=num_heads,
            in_proj_bias=in_proj_bias,
            out_proj_bias=out_proj_bias,
        )
        return cls(*arrays, **options)

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

        Parameters
        ----------
        module : torch.nn.MultiheadAttention
            Without ``add_bias_kv`` or ``add_zero_attn`` (they have no
            counterpart here); ``kdim == vdim`` when they differ from
            ``embed_dim`` (one context feeds keys and values).
        xp : namespace or module, optional
            Target library; ``None`` means NumPy.
        dtype : dtype, optional
            Target dtype; default: the module's precision (float32 stays
            float32, float64 stays float64).
        device : optional
            Target device.

        Returns
        -------
        MultiHeadAttention
            Call it with ``batch_first`` layout, (..., L, d_model).

        Raises
        ------
        ValueError
            A module using ``add_bias_kv``, ``add_zero_attn``, or
            ``kdim != vdim``.
        """
        arrays, options = from_torch(module, xp=xp, dtype=dtype, device=device)
        return cls(*arrays, **options)

    def to_torch(self) -> Any:
        """A ``torch.nn.MultiheadAttention`` (``batch_first=True``, CPU) holding these weights.

        Requires ``num_kv_heads == num_heads`` (torch's module has no GQA) and
        no RoPE. Missing biases become zeros when only some are present.

        Returns
        -------
        torch.nn.MultiheadAttention
        """
        return to_torch(self)

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
        xp = array_namespace(self.wk)
        return KVCache(
            self.num_kv_heads,
            self.d_head,
            batch_shape=batch_shape,
            capacity=capacity,
            xp=xp,
            dtype=self.wk.dtype,
            device=device_of(self.wk),
        )

    # ----------------------------------------------------------------------- calls

    def _prepare(
        self,
        x: Array,
        context: Array | None,
        *,
        mask: Array | None,
        causal: Causal,
        window: int | tuple[int, int] | None,
        key_lengths: Array | None,
        positions: Array | None,
        cache: KVCache | None,
        values: bool,
        xp: Namespace,
    ) -> tuple[Problem, Staged | None]:
        """Project and split heads into one batched problem, and the tokens staged in ``cache``.

        The problem's q is (..., Hkv, G, Lq, dh), its k and v (..., Hkv, 1,
        Lk, dh); ``values=False`` leaves v out, for the weights alone. Every
        argument whose meaning does not depend on the projections is checked
        before anything is computed; new tokens are only *staged* in the
        cache, for the caller to commit once the whole call succeeded.
        """
        check_floating("x", x, xp=xp)
        if x.ndim < 2 or int(x.shape[-1]) != self.d_model:
            msg = f"expected x of shape (..., Lq, d_model={self.d_model}), got shape {_shape(x)}"
            raise ValueError(msg)
        if context is None:
            if self.d_context != self.d_model:
                msg = (
                    f"expected a context (keys and values have width d_context={self.d_context} "
                    f"!= d_model={self.d_model}), got context=None"
                )
                raise ValueError(msg)
            src = x
        else:
            check_floating("context", context, xp=xp)
            if context.ndim < 2 or int(context.shape[-1]) != self.d_context:
                msg = (
                    f"expected context of shape (..., Lk, d_context={self.d_context}), "
                    f"got shape {_shape(context)}"
                )
                raise ValueError(msg)
            if cache is not None:
                msg = (
                    "expected cache=None with a context: the KV cache serves causal self-attention"
                )
                raise ValueError(msg)
            if self.rope is not None:
                msg = (
                    "expected context=None with rope: RoPE rotates by positions within one "
                    "sequence, and a cross-attention context has no shared positions"
                )
                raise ValueError(msg)
            src = context
        if positions is not None and self.rope is None:
            msg = "expected positions=None for a MultiHeadAttention built with rope=None"
            raise ValueError(msg)
        check_same_device([("weights", self.wq), ("x", x), ("context", context)])
        if cache is not None and not isinstance(cache, KVCache):
            msg = f"expected cache to be a KVCache or None, got {type(cache).__name__}"
            raise TypeError(msg)
        mask_heads = self._check_layouts(x, mask, key_lengths)

        _h, hkv, g, dh = self.num_heads, self.num_kv_heads, self.group_size, self.d_head
        lq = int(x.shape[-2])
        q = x @ self.wq  # (..., Lq, H*dh)
        k = src @ self.wk  # (..., Lk, Hkv*dh)
        v = src @ self.wv
        if self.bq is not None:
            q = q + self.bq
        if self.bk is not None:
            k = k + self.bk
        if self.bv is not None:
            v = v + self.bv
        nb = q.ndim - 2
        q = xp.reshape(q, (*q.shape[:-1], hkv, g, dh))  # (..., Lq, Hkv, G, dh)
        q = xp.permute_dims(q, (*range(nb), nb + 1, nb + 2, nb, nb + 3))  # (..., Hkv, G, Lq, dh)
        nk = k.ndim - 2
        kv_axes = (*range(nk), nk + 1, nk, nk + 2)
        k = xp.permute_dims(xp.reshape(k, (*k.shape[:-1], hkv, dh)), kv_axes)  # (..., Hkv, Lk, dh)
        v = xp.permute_dims(xp.reshape(v, (*v.shape[:-1], hkv, dh)), kv_axes)

        if self.rope is not None:
            if positions is None:
                offset = 0 if cache is None else cache.length
                positions = xp.arange(offset, offset + lq, dtype=xp.int64, device=device_of(x))
            elif positions.ndim < 1 or int(positions.shape[-1]) != lq:
                msg = (
                    f"expected positions of shape (..., Lq={lq}) like x {_shape(x)}, "
                    f"got shape {_shape(positions)}"
                )
                raise ValueError(msg)
            lead = tuple(positions.shape[:-1])
            pos_q = xp.reshape(positions, (*lead, 1, 1, lq))  # (..., 1, 1, Lq)
            pos_k = xp.reshape(positions, (*lead, 1, lq))  # (..., 1, Lq)
            q = rope_impl(q, pos_q, layout=self.rope, base=self.rope_base, xp=xp)
            k = rope_impl(k, pos_k, layout=self.rope, base=self.rope_base, xp=xp)

        staged = None
        if cache is not None:
            cache.check(k, v, xp=xp)
            k, v, staged = cache.stage(k, v)  # (..., Hkv, Lk, dh), Lk = all tokens so far
            if causal is True:
                causal = "bottom_right"  # the new queries are the last rows of the sequence
        k = xp.expand_dims(k, axis=-3)  # (..., Hkv, 1, Lk, dh)
        v = xp.expand_dims(v, axis=-3)

        if mask is not None:
            lq_lk = tuple(mask.shape[-2:])
            if mask_heads is None:  # (..., Lq, Lk): every head shares it
                mask = xp.reshape(mask, (*mask.shape[:-2], 1, 1, *lq_lk))
            elif mask_heads == 1:  # torch / Hugging Face (..., 1, Lq, Lk)
                mask = xp.reshape(mask, (*mask.shape[:-3], 1, 1, *lq_lk))
            else:  # (..., H, Lq, Lk): head h is query head h, in group h // G of KV head
                mask = xp.reshape(mask, (*mask.shape[:-3], hkv, g, *lq_lk))
        if key_lengths is not None:
            key_lengths = xp.reshape(key_lengths, (*key_lengths.shape, 1, 1))
        p = prepare(
            q,
            k,
            v if values else None,
            mask=mask,
            causal=causal,
            window=window,
            key_lengths=key_lengths,
            xp=xp,
        )
        return p, staged

    def _check_layouts(self, x: Array, mask: Array | None, key_lengths: Array | None) -> int | None:
        """Refuse masks and lengths that would silently enlarge the batch; find a heads axis.

        Returns the size of the mask's heads axis (1 or H) when it has the
        torch / Hugging Face layout (*batch, 1 or H, Lq, Lk), else None.
        """
        nb = x.ndim - 2
        batch = _shape(x)[:-2]
        heads = None
        if mask is not None:
            shape = _shape(mask)
            if mask.ndim < 2 or mask.ndim > nb + 3:
                msg = (
                    f"expected mask of shape (..., Lq, Lk) for x of shape {_shape(x)}, or the "
                    f"torch / Hugging Face layout (*batch, 1 or num_heads={self.num_heads}, Lq, "
                    f"Lk), with no more batch axes than x has; got mask shape {shape}"
                )
                raise ValueError(msg)
            if mask.ndim == nb + 3:
                if shape[-3] not in (1, self.num_heads):
                    msg = (
                        f"expected a mask with one axis more than x {_shape(x)} to be in the "
                        f"torch / Hugging Face layout (*batch, 1 or num_heads={self.num_heads}, "
                        f"Lq, Lk), got mask shape {shape} with {shape[-3]} on the heads axis"
                    )
                    raise ValueError(msg)
                heads = shape[-3]
        if key_lengths is not None and key_lengths.ndim > nb:
            msg = (
                f"expected key_lengths with one length per sequence, broadcastable to x's batch "
                f"shape {batch}, got shape {_shape(key_lengths)}"
            )
            if key_lengths.ndim == nb + 1 and _shape(key_lengths)[-1] == 1:
                msg += f"; pass key_lengths[..., 0] (shape {_shape(key_lengths)[:-1]})"
            raise ValueError(msg)
        return heads

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
        xp = array_namespace(x, context, mask, key_lengths, positions, self.wq)
        # The cache's lock is held from staging the new tokens to committing
        # them, and they are committed only once everything else succeeded:
        # a call that raises leaves the cache exactly as it was.
        with nullcontext() if cache is None else cache.lock:
            p, staged = self._prepare(
                x,
                context,
                mask=mask,
                causal=causal,
                window=window,
                key_lengths=key_lengths,
                positions=positions,
                cache=cache,
                values=True,
                xp=xp,
            )
            out = solve(p, xp=xp)  # (..., Hkv, G, Lq, dh)
            if cache is not None and staged is not None:
                cache.commit(staged)
        assert not isinstance(out, tuple)
        nb = out.ndim - 4
        out = xp.permute_dims(
            out, (*range(nb), nb + 2, nb, nb + 1, nb + 3)
        )  # (..., Lq, Hkv, G, dh)
        out = xp.reshape(out, (*out.shape[:-3], self.num_heads * self.d_head))  # (..., Lq, H*dh)
        y = out @ self.wo  # (..., Lq, d_model)
        if self.bo is not None:
            y = y + self.bo
        return y

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
        xp = array_namespace(x, context, mask, key_lengths, positions, self.wq)
        p, _ = self._prepare(
            x,
            context,
            mask=mask,
            causal=causal,
            window=window,
            key_lengths=key_lengths,
            positions=positions,
            cache=None,
            values=False,
            xp=xp,
        )
        w = solve_weights(p, xp=xp)  # (..., Hkv, G, Lq, Lk)
        return xp.reshape(w, (*w.shape[:-4], self.num_heads, *w.shape[-2:]))  # (..., H, Lq, Lk)
