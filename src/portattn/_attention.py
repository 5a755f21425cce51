"""Scaled dot-product attention: the public entry points.

Each call does the same five steps: find the namespace, gather the options
into one :class:`~portattn._core._variant.Variant` (:func:`build_variant`),
validate everything into one :class:`~portattn._core._problem.Problem`
(:func:`prepare`), run the chosen path on it, and cast the result back to the
caller's dtype. :func:`attend` is the last three: the internal entry the
layers and the varlen entries call too. The paths
(materialising, blockwise, native) are sibling modules that read the
``Problem``; none of them imports this one.
"""

from __future__ import annotations

from typing import Literal, get_args, overload

import numpy as np

from ._core._block_mask import BlockMask
from ._core._masks import Causal
from ._core._modspec import ScoreMod
from ._core._prepare import bare_key, kernel_mask_plan, plan_key, prepare
from ._core._problem import Problem
from ._core._variant import Variant, build_variant, no_array_or_mod
from ._grad._autodiff import blockwise_attention
from ._lib._checks import check_array, check_flag, check_int_pair
from ._lib._compat import array_namespace, namespace_library
from ._lib._precision import autocast_kind, autocast_on, narrow, torch_autocast_off
from ._lib._typing import Array, Namespace
from ._lib._vocabulary import sdpa_names
from ._paths._auto import auto_impl, plain_decision
from ._paths._invariant import invariant_attention
from ._paths._materialize import materialize_attention, materialize_weights, plain_materialize
from ._paths._native import native_attention, plain_native

__all__ = ["IMPLS", "Impl", "attend", "attention", "attention_weights", "solve", "solve_weights"]

Impl = Literal["auto", "materialize", "blockwise", "native", "invariant"]
#: The values ``impl=`` takes, in the order errors list them.
IMPLS: tuple[str, ...] = get_args(Impl)
_ARRAY_NAMES = ("query", "key", "value", "mask", "bias", "key_lengths", "query_lengths", "sinks")
_WEIGHTS_NAMES = ("query", "key", "mask", "bias", "key_lengths", "query_lengths", "sinks")


# The type checkers' view: the return type follows return_lse (an array, or the
# (output, lse) pair), so `out.shape` and `out, lse = ...` both check.
@overload
def attention(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    softcap: float | None = None,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    return_lse: Literal[False] = False,
    score_mod: ScoreMod | None = None,
    block_mask: BlockMask | None = None,
    sinks: Array | None = None,
) -> Array: ...


@overload
def attention(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    softcap: float | None = None,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    return_lse: Literal[True],
    score_mod: ScoreMod | None = None,
    block_mask: BlockMask | None = None,
    sinks: Array | None = None,
) -> tuple[Array, Array]: ...


@overload
def attention(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    softcap: float | None = None,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    return_lse: bool = False,
    score_mod: ScoreMod | None = None,
    block_mask: BlockMask | None = None,
    sinks: Array | None = None,
) -> Array | tuple[Array, Array]: ...


@sdpa_names
def attention(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    softcap: float | None = None,
    impl: Impl = "auto",
    block_size: int | tuple[int, int] | None = None,
    return_lse: bool = False,
    score_mod: ScoreMod | None = None,
    block_mask: BlockMask | None = None,
    sinks: Array | None = None,
) -> Array | tuple[Array, Array]:
    r"""Scaled dot-product attention, :math:`\mathrm{softmax}(QK^\top s + B)\,V`.

    Works on any array API namespace: NumPy, PyTorch, CuPy,
    ``array_api_strict``, ... The result comes back in the inputs' namespace,
    dtype and device.

    Parameters
    ----------
    query : array, shape (..., Lq, d)
        Queries, one row per query position.
    key : array, shape (..., Lk, d)
        Keys, one row per key position, matched against the queries.
    value : array, shape (..., Lk, dv)
        Values, mixed by the weights. All three are real floating arrays
        from one library, on one device. Leading batch dimensions
        broadcast. float16 and bfloat16 are computed in float32 and cast
        back; float64 stays float64. Under ``torch.autocast`` the same
        holds: portattn turns autocast off for its own arithmetic, so
        every ``impl`` computes in that precision, and the output has the
        inputs' dtype (float32 inputs give float32, bfloat16 inputs from
        an autocast layer give bfloat16); gradients follow the same rule.
    mask : bool array, optional
        Broadcastable to (..., Lq, Lk). True where a query may attend.
    bias : real floating array, optional
        Broadcastable to (..., Lq, Lk); added to the scaled scores.
    causal : {False, True, "top_left", "bottom_right"}, optional
        Hide keys in the future of each query. ``True`` is the usual lower
        triangle and requires ``Lq == Lk``; with ``Lq != Lk`` choose the
        alignment explicitly. ``"top_left"``: query ``i`` sees ``j <= i``
        (torch, JAX, Keras). ``"bottom_right"``: query ``i`` sees
        ``j <= i + Lk - Lq`` (flash-attn, KV-cache decoding).
    scale : float, optional
        Multiplies :math:`QK^\top`. Default ``1/sqrt(d)``.
    window : int or (int, int), optional
        Sliding window ``(left, right)``: query ``i`` sees keys
        ``i - left <= j <= i + right`` (an int ``w`` means ``(w, w)``), as
        ``local_window_size`` in ``jax.nn.dot_product_attention``. Aligned
        like ``causal`` when ``Lq != Lk``.
    key_lengths, query_lengths : integer array, optional
        Valid lengths, broadcastable to the batch shape. Keys at positions
        ``>= key_lengths`` get weight 0; query rows at positions
        ``>= query_lengths`` output 0.
    softcap : float, optional
        Logit soft-capping (Gemma 2, flash-attn): the scaled scores become
        ``tanh(s / softcap) * softcap`` before ``bias`` and masks apply.
    impl : {"auto", "materialize", "blockwise", "native", "invariant"}, optional
        ``"materialize"`` forms the (..., Lq, Lk) score matrix;
        ``"blockwise"`` streams over key blocks with an online softmax in
        O(Lq + Lk) extra memory and skips blocks that ``causal``/``window``
        hide; ``"native"`` delegates to the library's fused kernel where the
        arguments map exactly and raises :class:`NotImplementedError` where
        they do not. ``"auto"`` (default) takes ``"native"`` wherever the
        kernel computes exactly what the generic paths compute and needs no
        more memory than they would: on torch (its
        ``scaled_dot_product_attention``), without ``softcap`` and without
        ``return_lse``, and with no position mask larger than the generic
        path's own working memory (plain, top-left ``causal`` and
        ``key_lengths`` always qualify; other masks only for small calls),
        except a grouped-query decode step (one query, ``Hkv < H``) of at
        least 2**24 multiply-adds (B * H * Lk * d), which materialises:
        torch's CPU kernel with ``enable_gqa`` is slower there.
        Otherwise, and on every other library, it materialises below
        256 x 256 (query, key) pairs per batch entry and goes blockwise
        above, except that one query (a decode step) materialises against
        keys of any length. JAX is left on the generic paths: the default
        ``jax.nn.dot_product_attention`` is XLA's composition of the same
        operations, not a fused kernel, and is slower eagerly.
        ``"invariant"`` is never chosen by ``"auto"``: it gives each row
        the same bits whatever shares the call (a padded batch, a decode
        step, a chunk of a prefill), at a cost (docs/serving.md).
        Every option is validated whichever path runs.
    block_size : int or (int, int), optional
        ``(query_block, key_block)`` for the blockwise path.
    return_lse : bool, optional
        Also return the log-sum-exp of each row's scores, shape (..., Lq),
        in the compute dtype (``-inf`` for a row that sees nothing), so
        results over disjoint key chunks can be merged exactly. With
        ``sinks`` the sink counts as one more logit of the row:
        ``lse = log(exp(sink) + sum_j exp(s_j))`` (``sink`` for a row that
        sees nothing), so a result with sinks merges exactly
        (:func:`merge_attention`) with results over the other key chunks
        computed *without* them.
    score_mod : callable, optional
        ``score_mod(score, b, h, q_idx, kv_idx) -> array``, FlexAttention's
        convention: returns the modified scores, of the shape of ``score``.
        It sees the scores of a tile (B, H, Tq, Tk) after ``scale``,
        ``softcap`` and ``bias``; ``b`` (B, 1, 1, 1), ``h`` (1, H, 1, 1),
        ``q_idx`` (1, 1, Tq, 1) and ``kv_idx`` (1, 1, 1, Tk) are integer
        arrays of the inputs' library and device holding absolute
        positions, so a mod is ordinary elementwise array code. A result
        of a wider dtype is cast back to the compute dtype. ``h`` is the
        query head. Gradients flow to the floating arrays it captures
        (torch tensors that require grad, traced JAX values).
    block_mask : BlockMask, optional
        From :func:`create_block_mask`: which (query block, key block)
        tiles its ``mask_mod`` leaves empty, full or partial. Every path
        reads its kinds alike: an empty tile hides all its pairs, a full
        one none, a partial one asks ``mask_mod`` (so a mask whose every
        tile is empty gives output 0 and lse ``-inf`` everywhere). The
        blockwise path (forward and backward) and dask's pair tasks never
        read keys of an empty tile nor call ``score_mod`` on it, and call
        ``mask_mod`` only on partial tiles; ``"auto"`` goes blockwise
        whenever some tile is empty, while ``"materialize"`` and
        ``"native"`` form every score and mask the empty ones (an inf or
        NaN *value* there then reaches the rows, as under ``mask``). Under
        a trace (``jax.jit``, ``torch.compile``) the blockwise tiles stay
        the mask's while at most 64 are visited; beyond, each traced tile
        covers several whole mask tiles, and empty ones inside it are
        masked but read. Where its tiles differ by batch entry or head
        enough to pay (``BlockMask.parts``), the blockwise path runs each
        range of them apart, on its own tiles. ``score_mod`` and
        ``block_mask`` need 4-D (B, H, L, d) inputs.
    sinks : real floating array, optional
        One logit per (batch, head), broadcastable to the leading shape
        (for example (H,) for (B, H, L, d) inputs), added to each row's
        softmax denominator as ``exp(sink)`` (gpt-oss's attention sinks):
        a row that sees no key outputs 0. Has a gradient. Its values are
        not read on the host (that would sync every call): ``-inf`` is no
        sink, ``+inf`` takes each row's whole weight (output 0, lse
        ``+inf``), and NaN makes the rows' lse NaN (never ``-inf``, which
        means "saw no key") and the output of rows that see a key NaN.

    Returns
    -------
    array, shape (..., Lq, dv)
        The attention output; ``(output, lse)`` if ``return_lse``.

    Raises
    ------
    TypeError
        Arrays from two libraries; non-floating query, key, value or bias;
        a non-boolean mask; non-integer lengths.
    ValueError
        Rank below 2; mismatched ``d`` or ``Lk``; mask or bias not
        broadcastable; ``causal=True`` with ``Lq != Lk``; an unknown
        ``causal``; a scale that is not a finite number; arrays on
        different devices; a negative window.

    Notes
    -----
    A row whose keys are all hidden gets weights 0 and output 0, never NaN,
    and so does ``Lk == 0``; ``d == 0`` makes every score 0.

    Padding: keys and values at positions ``>= key_lengths`` are replaced by
    zeros before any arithmetic, so whatever they hold (inf and NaN
    included) never reaches the output, on every ``impl``. Lengths of any
    integer dtype (int8, uint8, uint32, torch's uint64, ...) are compared
    with positions correctly, whatever JAX's x64 setting: lengths past the
    axis mean all of it, negative ones none.

    Positions hidden only by ``mask``, ``causal`` or ``window`` are not
    sanitised: their weight is an exact 0, so *finite* hidden keys and
    values change nothing (with ``causal``, rewriting them with any finite
    numbers leaves earlier output rows bit-for-bit unchanged), but an inf or
    NaN hidden value meets that 0 in ``weights @ value`` and makes the rows
    it is hidden from NaN (``0 * inf = NaN``), on the materialising path and
    in every key block the blockwise path reads (it skips only blocks that
    ``causal``/``window`` hide entirely). Use ``key_lengths`` for padding.
    An inf or NaN hidden *key* is harmless on the generic paths (its scores
    are replaced by ``-inf``), but torch's kernel adds a mask to the scores
    it formed, so ``impl="native"`` with a mask, window, bias, block mask
    or plain ``causal`` (torch's math kernel, taken for example when
    ``dv != d``) gives NaN rows there; ``"auto"`` checks the keys and stays
    off the kernel then.

    Range: the scaled scores are formed in the compute dtype. A score whose
    magnitude overflows it (above about 3.4e38 in float32, 1.8e308 in
    float64) is out of range and makes its row NaN (NumPy also warns);
    other rows are unaffected. Scale such inputs down, or compute in
    float64. Inputs wider than float64 (``np.longdouble``) are refused.

    Grouped-query attention: 4-D inputs whose key and value have fewer
    heads ``Hkv`` than the query's ``H`` (``H`` a multiple of ``Hkv``) are
    read as SDPA's ``enable_gqa``: query head ``h`` reads key/value head
    ``h // (H // Hkv)``.

    Gradients: every ``impl`` differentiates under torch autograd and
    ``jax.grad``. The blockwise path has its own FlashAttention-2 backward,
    written once in the array API (tiles recomputed from the saved
    log-sum-exp, hidden tiles skipped), so training keeps O(Lq + Lk) extra
    memory; it is registered as a ``torch.autograd.Function`` and a
    ``jax.custom_vjp``. ``bias`` and the ``return_lse`` output have
    gradients; masks and lengths have none. Double backward (gradient
    penalties, Hessian-vector products, ``create_graph=True``) and the
    ``torch.func`` transforms (``grad``, ``vjp``, ``vmap``) work through
    every path, the blockwise backward included (its own backward is
    recorded like any other code, so the second one keeps the tiles). On
    ``impl="native"`` (and ``"auto"`` where it takes it) the second
    derivative is the kernel's: torch's fused CPU kernel has none, and torch
    raises at the second backward.

    On dask arrays the result is a lazy dask array chunked like ``query``:
    one task per (query chunk, key chunk) pair that positions leave visible,
    merged exactly through the log-sum-exp, at most
    ``dask.config.get("portattn.merge-fan-in", 4)`` partials per merge.

    Mixed dtypes: query, key and value of different floating dtypes are
    promoted by the array API's type promotion rules, and the output has
    the promoted dtype: a float16 query with float32 key and value computes
    and returns float32, as if the query were cast first (torch's
    ``scaled_dot_product_attention`` raises instead). Cast the inputs to
    one dtype yourself to keep a narrower one.

    Coming from ``scaled_dot_product_attention``: its ``attn_mask`` is
    ``mask`` (boolean) or ``bias`` (floating), ``is_causal=True`` is
    ``causal="top_left"`` (``causal=True`` where ``Lq == Lk``), and
    ``enable_gqa`` is implicit (see above); each SDPA name is refused with
    that pointer. There is no dropout (``dropout_p``): to drop attention
    weights as SDPA does, multiply :func:`attention_weights` by a random
    keep mask divided by ``1 - p`` and then by ``value``, or apply dropout
    to the output.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> q = k = np.eye(3)
    >>> v = np.arange(6.0).reshape(3, 2)
    >>> pa.attention(q, k, v, causal=True)[0]
    array([0., 1.])
    >>> out, lse = pa.attention(q, k, v, causal=True, return_lse=True)
    >>> out.shape, lse.shape
    ((3, 2), (3,))
    """
    bare = causal is False and window is None and block_size is None and return_lse is False
    if bare and no_array_or_mod(
        mask, bias, key_lengths, query_lengths, softcap, score_mod, block_mask, sinks
    ):
        # A bare call (a decode step's): a repeat one goes straight to the
        # maths from its memoised plan, before any lookup (_plain_call).
        memo = bare_key(query, key, value, scale=scale)
        if memo is not None:
            out = _plain_call(query, key, value, memo=memo, impl=impl, xp=None)
            if out is not None:
                return out
    check_array("value", value)  # attend() reads value=None as a weights-only call
    xp = array_namespace(
        query, key, value, mask, bias, key_lengths, query_lengths, sinks, names=_ARRAY_NAMES
    )
    variant = build_variant(
        mask=mask,
        bias=bias,
        causal=causal,
        window=window,
        key_lengths=key_lengths,
        query_lengths=query_lengths,
        softcap=softcap,
        score_mod=score_mod,
        block_mask=block_mask,
        sinks=sinks,
    )
    return attend(
        query,
        key,
        value,
        variant=variant,
        scale=scale,
        impl=impl,
        block_size=block_size,
        return_lse=return_lse,
        xp=xp,
    )


def attend(
    query: Array,
    key: Array,
    value: Array | None,
    /,
    *,
    variant: Variant,
    scale: object = None,
    impl: object = "auto",
    block_size: object = None,
    return_lse: object = False,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """Attention with the options as one variant: the internal entry every caller shares.

    ``attention``, ``attention_weights``, the varlen and paged entries and
    the layers (``Head``, ``MultiHeadAttention``, the chapter) build
    ``variant`` once with :func:`~portattn._core._variant.build_variant`
    and come here: :func:`~portattn._core._prepare.prepare` checks the call,
    then :func:`solve` runs it. ``value=None`` asks for the weights
    (:func:`solve_weights`; ``impl``, ``block_size`` and ``return_lse`` are
    then unused). ``xp`` is the inputs' namespace, looked up by the caller.
    """
    # torch's kernel takes the scale itself: q is scaled in solve, and only
    # if another path runs (the product took a fifth of a torch call at the
    # chapter's size, and a prefill pays a pass over q).
    lib = namespace_library(xp)
    defer = value is not None and isinstance(impl, str) and impl in ("auto", "native")
    defer = defer and lib == "torch"
    memo = None
    if value is not None and block_size is None and return_lse is False and lib in _PLAIN_LIBS:
        # A repeat plain call (a layer's decode step) goes straight to the
        # maths: its checks were memoised on its dtypes, shapes, devices and
        # options (or its family's, all but the lengths: _core/_prepare).
        # The plan's key is computed once, here; prepare takes it on a miss.
        memo = plan_key(query, key, value, variant=variant, scale=scale)
        if memo is not None:
            out = _plain_call(query, key, value, memo=memo, impl=impl, xp=xp)
            if out is not None:
                return out
        elif impl == "native" and variant.rows_see_keys and lib == "torch":
            # A repeat fused varlen call (a layer's step): its mask's plan was checked.
            out = _masked_call(query, key, value, variant=variant, scale=scale)
            if out is not None:
                return out
    p = prepare(query, key, value, variant, scale=scale, xp=xp, scale_q=not defer, memo=memo)
    if value is None:
        return solve_weights(p, xp=xp)
    return solve(p, impl=impl, block_size=block_size, return_lse=return_lse, xp=xp)


# The libraries whose repeat plain call has a shortcut (_plain_call).
_PLAIN_LIBS = ("numpy", "torch")


def _plain_call(
    query: Array,
    key: Array,
    value: Array,
    /,
    *,
    memo: tuple[object, ...],
    impl: object,
    xp: Namespace | None,
) -> Array | None:
    """The output of a repeat plain call, straight from its memoised plan; else ``None``.

    ``query``, ``key`` and ``value`` are NumPy arrays or eager torch tensors
    (``memo``, the call's :func:`~portattn._core._prepare.plan_key`, exists
    for no others). On torch ``"auto"`` hands a ``"native"`` plan to SDPA
    (:func:`plain_native`) unless autocast is on; on NumPy ``"auto"`` and
    ``"materialize"`` hand it to the materialising path's core
    (:func:`plain_materialize`): what :func:`solve` would run, without the
    :class:`Problem`. Any other call goes through :func:`prepare`. ``xp``
    is the inputs' namespace where the caller has looked it up (``attend``),
    ``None`` where it has not (a bare call: NumPy's is looked up here, once).
    """
    if type(impl) is not str:
        return None
    on_numpy = type(query) is np.ndarray
    decided = plain_decision(memo=memo, lib="numpy" if on_numpy else "torch")
    if decided is None:
        return None
    scale, groups, path, autocast = decided
    if on_numpy:
        if scale is not None and (
            impl == "materialize" or (impl == "auto" and path == "materialize")
        ):
            # Looked up here, not by the caller: a bare call on torch needs
            # none, and each lookup is a dict probe a decode step pays for.
            xp = array_namespace(query) if xp is None else xp
            return plain_materialize(query * scale, key, value, groups=groups, xp=xp)[0]
        return None
    if impl != "auto" or path != "native":
        return None
    if autocast_on(autocast):
        return None  # the whole way, which turns autocast off
    return plain_native(query, key, value, scale=scale, groups=groups)


def _masked_call(
    query: Array, key: Array, value: Array, /, *, variant: Variant, scale: object
) -> Array | None:
    """A repeat fused varlen call on torch's kernel, straight from its memoised plan; else None.

    A call :func:`~portattn._core._prepare.kernel_mask_plan` finds checked
    already, with one mask or bias that leaves every row a key, and nothing
    to lay out: the native path would hand the kernel exactly these arrays
    and options (:func:`~portattn._paths._native.native_attention`, no
    empty row to zero, no cast back), so its bits. Not under autocast,
    which the whole way turns off. Any other call goes through :func:`prepare`.
    """
    planned = kernel_mask_plan(query, key, value, variant=variant, scale=scale)
    if planned is None:
        return None
    scale_value, groups, device = planned
    if autocast_on(autocast_kind(device)):
        return None
    mask = variant.mask if variant.bias is None else variant.bias
    return plain_native(query, key, value, scale=scale_value, groups=groups, mask=mask)


def solve(
    p: Problem,
    *,
    impl: object = "auto",
    block_size: object = None,
    return_lse: object = False,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """Run a prepared problem on the chosen path and cast back: the second half of ``attention``.

    :func:`attend` hands its prepared problem here. ``impl``, ``block_size``
    and ``return_lse`` are checked for every path, whichever one runs.
    """
    if not isinstance(impl, str) or impl not in IMPLS:
        msg = f"expected impl to be one of {', '.join(map(repr, IMPLS))}, got {impl!r}"
        raise ValueError(msg)
    sizes = None if block_size is None else check_int_pair("block_size", block_size, minimum=1)
    want_lse = check_flag("return_lse", return_lse)
    lib = namespace_library(xp)
    if lib == "torch":
        off = torch_autocast_off(p.device)
        if off is not None:
            with off:
                return _solve(p, impl, sizes, want_lse, lib=lib, xp=xp)
    return _solve(p, impl, sizes, want_lse, lib=lib, xp=xp)


def _solve(
    p: Problem,
    impl: str,
    sizes: tuple[int, int] | None,
    want_lse: bool,
    *,
    lib: str,
    xp: Namespace,
) -> Array | tuple[Array, Array]:
    """:func:`solve` once its options are checked (and torch's autocast is off)."""
    lse: Array | None
    if impl == "auto" and lib != "dask":
        impl = auto_impl(p, lib=lib, want_lse=want_lse, xp=xp)
    if impl != "native":
        p = p.scaled()  # only the kernels take an unscaled q
    if lib == "dask":
        from ._paths._dask import dask_attention  # dask is optional: imported for dask arrays only

        out, lse = dask_attention(p, impl=impl, block_size=sizes, return_lse=want_lse)
    elif impl == "native":
        out, lse = native_attention(p, return_lse=want_lse, xp=xp)
    elif impl == "invariant":
        out, lse = invariant_attention(p, xp=xp)
    elif impl == "blockwise":
        # Plain blockwise where no gradient can be asked for; otherwise the
        # library's autodiff gets the O(N) backward (_grad/_autodiff, _grad/_backward).
        out, lse = blockwise_attention(p, block_size=sizes, xp=xp)
    else:
        out, lse = materialize_attention(p, want_lse=want_lse, xp=xp)
    out = narrow(out, p.out_dtype, xp=xp)
    if want_lse:
        assert lse is not None
        return out, lse
    return out


@sdpa_names
def attention_weights(
    query: Array,
    key: Array,
    /,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: Causal = False,
    scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    softcap: float | None = None,
    score_mod: ScoreMod | None = None,
    block_mask: BlockMask | None = None,
    sinks: Array | None = None,
) -> Array:
    """The attention weights ``softmax(Q Kᵀ · scale + bias)``, shape (..., Lq, Lk).

    Takes the same options as :func:`attention` (other than ``value``) with
    the same meaning. Each row sums to 1, or is all zeros when every key is
    hidden from it (with ``sinks``, to ``1 - exp(sink - lse)``: the sink
    takes its share).

    Parameters
    ----------
    query : array, shape (..., Lq, d)
        Queries, as in :func:`attention`.
    key : array, shape (..., Lk, d)
        Keys, as in :func:`attention`.
    mask, bias, causal, scale, window, key_lengths, query_lengths, softcap
        As in :func:`attention`.
    score_mod, block_mask, sinks
        As in :func:`attention`.

    Returns
    -------
    array, shape (..., Lq, Lk)
        In the inputs' namespace, dtype and device.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> x = np.eye(3, dtype=np.float32)
    >>> pa.attention_weights(x, x, causal=True, scale=0.0)
    array([[1.        , 0.        , 0.        ],
           [0.5       , 0.5       , 0.        ],
           [0.33333334, 0.33333334, 0.33333334]], dtype=float32)
    """
    xp = array_namespace(
        query, key, mask, bias, key_lengths, query_lengths, sinks, names=_WEIGHTS_NAMES
    )
    variant = build_variant(
        mask=mask,
        bias=bias,
        causal=causal,
        window=window,
        key_lengths=key_lengths,
        query_lengths=query_lengths,
        softcap=softcap,
        score_mod=score_mod,
        block_mask=block_mask,
        sinks=sinks,
    )
    out = attend(query, key, None, variant=variant, scale=scale, xp=xp)
    assert not isinstance(out, tuple)
    return out


def solve_weights(p: Problem, *, xp: Namespace) -> Array:
    """The weights of a prepared problem, cast back: the second half of ``attention_weights``."""
    p = p.scaled()
    off = torch_autocast_off(p.device) if namespace_library(xp) == "torch" else None
    if off is not None:
        with off:
            return narrow(materialize_weights(p, xp=xp), p.out_dtype, xp=xp)
    return narrow(materialize_weights(p, xp=xp), p.out_dtype, xp=xp)
