"""Multi-head attention with grouped KV heads (MHA, GQA, MQA), cross-attention and KV caching.

Every head is the single head of the chapter with its own slice of the
projections; the heads run as one batched :func:`portattn.attention` call.
Grouped-query attention never repeats keys or values: queries are reshaped to
(..., Hkv, G, Lq, d_head) and keys to (..., Hkv, 1, Lk, d_head), and batch
broadcasting pairs each group of ``G`` query heads with its one KV head.

One call, one idea per module: :mod:`._mha_inputs` checks the arguments and
lays masks out for the heads, :mod:`._heads` splits, groups and merges them,
:func:`._positions.rope_heads` rotates them, :func:`._kvcache.cache_step`
stages the new tokens, and :func:`portattn.attention`'s ``solve`` does the
rest. The weights are checked in :mod:`._mha_weights`; the alternative
constructors live in :mod:`._mha_build`.
"""

from __future__ import annotations

from contextlib import nullcontext

from .._attention import solve, solve_weights
from .._core._masks import Causal
from .._core._prepare import prepare
from .._core._problem import Problem
from .._lib._checks import check_real, dtype_name
from .._lib._compat import array_namespace, device_of
from .._lib._typing import Array, Namespace
from ._heads import group_heads, merge_heads, split_heads, ungroup_heads
from ._kvcache import KVCache, Staged, cache_step
from ._mha_build import Builders
from ._mha_inputs import check_arrays, check_inputs, check_layouts, layout_masks
from ._mha_weights import check_weights, weights_namespace
from ._positions import RopeLayout, rope_heads

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(Builders):
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
        matrices = {"wq": wq, "wk": wk, "wv": wv, "wo": wo}
        biases = {"bq": bq, "bk": bk, "bv": bv, "bo": bo}
        xp = weights_namespace(matrices, biases)
        sizes = check_weights(
            matrices, biases, num_heads=num_heads, num_kv_heads=num_kv_heads, rope=rope, xp=xp
        )
        base = check_real("rope_base", rope_base, above=1.0)  # as apply_rope's base
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.bq, self.bk, self.bv, self.bo = bq, bk, bv, bo
        self.num_heads, self.num_kv_heads, self.d_head = sizes[:3]
        self.group_size = self.num_heads // self.num_kv_heads
        self.d_model, self.d_context = sizes.d_model, sizes.d_context
        self.rope: RopeLayout | None = rope
        self.rope_base = base

    def __repr__(self) -> str:
        has_bias = any(b is not None for b in (self.bq, self.bk, self.bv, self.bo))
        ctx = "" if self.d_context == self.d_model else f", d_context={self.d_context}"
        return (
            f"MultiHeadAttention(d_model={self.d_model}{ctx}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, d_head={self.d_head}, bias={has_bias}, "
            f"rope={self.rope!r}, dtype={dtype_name(self.wq.dtype)})"
        )

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
        src = check_inputs(self, x, context, positions=positions, cache=cache, xp=xp)
        lk = int(src.shape[-2]) + (0 if cache is None else cache.length)
        heads_axis = check_layouts(x, mask, key_lengths, num_heads=self.num_heads, num_keys=lk)
        q = split_heads(self._project(x, self.wq, self.bq), self.num_heads, xp=xp)
        k = split_heads(self._project(src, self.wk, self.bk), self.num_kv_heads, xp=xp)
        v = split_heads(self._project(src, self.wv, self.bv), self.num_kv_heads, xp=xp)
        # q (..., H, Lq, dh); k, v (..., Hkv, Lk, dh)
        if self.rope is not None:
            offset = 0 if cache is None else cache.length
            q, k = rope_heads(
                q, k, positions, offset=offset, layout=self.rope, base=self.rope_base, xp=xp
            )
        staged = None
        if cache is not None:  # k, v (..., Hkv, Lk, dh), Lk = all tokens so far
            k, v, causal, staged = cache_step(cache, k, v, causal=causal, xp=xp)
        q, k, v_or_none = group_heads(q, k, v if values else None, xp=xp)
        mask, key_lengths = layout_masks(
            mask, key_lengths, heads_axis=heads_axis, num_kv_heads=self.num_kv_heads, xp=xp
        )
        p = prepare(
            q,
            k,
            v_or_none,
            mask=mask,
            causal=causal,
            window=window,
            key_lengths=key_lengths,
            xp=xp,
        )
        return p, staged

    @staticmethod
    def _project(t: Array, w: Array, b: Array | None) -> Array:
        """``t @ w (+ b)``: one projection, token-major (..., L, heads * dh)."""
        return t @ w if b is None else t @ w + b

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
        check_arrays(x, context, mask, key_lengths, positions, cache)
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
            if staged is not None:
                staged.commit()
        assert not isinstance(out, tuple)
        out = merge_heads(ungroup_heads(out, xp=xp), xp=xp)  # (..., Lq, H*dh)
        return self._project(out, self.wo, self.bo)  # (..., Lq, d_model)

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
        check_arrays(x, context, mask, key_lengths, positions, None)
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
        return ungroup_heads(solve_weights(p, xp=xp), xp=xp)  # (..., H, Lq, Lk)
