"""portattn as the attention of any Hugging Face ``transformers`` model.

Two lines make a model compute its attention with :func:`portattn.attention`::

    from portattn.integrations.transformers import register

    model = AutoModelForCausalLM.from_config(config, attn_implementation=register())

:func:`register` adds :func:`attention_forward` to ``transformers``'
``AttentionInterface`` and, under the same name, ``sdpa_mask`` to its
``AttentionMaskInterface``: a name known only to the first gets
``attention_mask=None`` from the models, and padding would be lost.

Packed sequences go through :func:`portattn.attention_varlen`: when the model
passes ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (continuous batching,
``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``), or, in a
batch of one row, ``position_ids`` that restart (padding-free training), each
sequence attends only within itself, as flash-attn's varlen kernel does.

Continuous batching (``model.generate_batch``) admits only ``"sdpa"``,
``"paged|eager"`` and names containing ``"flash"``, and only the flash names
get the packed layout without a dense (T, T) mask. :func:`serve` is the route
chosen: it switches a model loaded with :func:`register`'s name to that
name's alias ``<name>_flash`` (same attention function, same mask function)
by setting ``model.config._attn_implementation``. Why this route, among the
ones transformers 5.25 leaves:

* loading with a name containing "flash" (``from_config(...,
  attn_implementation="portattn_flash")`` or ``set_attn_implementation``)
  fails: the load check tries to import a flash-attn kernel (from the Hub)
  for any such name, and for gpt-oss it swaps the name for its own kernel;
  only the config attribute, which the layers and continuous batching read,
  bypasses both;
* registering over ``"sdpa"`` or ``"paged|eager"`` would change every other
  model in the process, and hands the attention a dense mask;
* patching ``ContinuousBatchingManager`` depends on private code that
  changes every release.

The alias has no digit after "flash" (transformers reads ``flash...2`` /
``flash...3`` as flash-attn 2 / 3 and would take its CUDA paged path), so on
continuous batching's index path the attention receives the whole packed
key/value rows and ``cu_seq_lens_k`` per layer type; a ``block_table`` with
``k_cache`` / ``v_cache`` (its CUDA flash-attn path) never comes, and is
refused by name if it does.

The module needs ``transformers`` and ``torch`` (``pip install
'portattn[transformers]'``); ``import portattn`` never imports them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

try:
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    _msg = (
        "portattn.integrations.transformers needs Hugging Face transformers and torch, "
        f"which could not be imported ({exc}); install the extra: "
        "pip install 'portattn[transformers]'"
    )
    raise ImportError(_msg, name=getattr(exc, "name", None)) from exc

try:  # where transformers 5 records the outputs it was asked for; private, so optional
    from transformers.utils.output_capturing import _active_collector as _COLLECTOR
except ImportError:  # pragma: no cover - other transformers versions
    _COLLECTOR = None

from .._attention import IMPLS, Impl, attention, attention_weights
from .._core._groups import group_heads, group_mask, group_per_head, ungroup_heads
from .._lib._checks import check_flag
from .._lib._compat import array_namespace
from .._lib._typing import Namespace
from .._varlen import varlen_heads_first
from ._tiny import ARCHITECTURES, NON_CAUSAL_ARCHITECTURES, tiny_batch, tiny_model

__all__ = [
    "ARCHITECTURES",
    "NON_CAUSAL_ARCHITECTURES",
    "attention_forward",
    "main",
    "register",
    "serve",
    "tiny_batch",
    "tiny_model",
]


_Model = TypeVar("_Model", bound="torch.nn.Module")

# Keyword arguments the models pass that change nothing here: cache and output
# bookkeeping, continuous batching's cache indices and logits rows, and the
# flash kernels' length bounds (hints for their buffers).
_NO_EFFECT = frozenset(
    {
        "position_ids",  # read only to find packed sequences, see _packed_offsets
        "cache_position",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "return_dict",
        "num_items_in_batch",
        "max_length_q",
        "max_length_k",
        "seq_idx",
        "read_index",
        "write_index",
        "logits_indices",
        "logits_processor_args",
        # ModernBERT's request for flash-attn's deterministic backward: portattn's
        # backward sums in a fixed order, so it is deterministic already.
        "deterministic",
    }
)
# Keyword arguments with a meaning that attention_forward honours.
_HONOURED = frozenset(
    {"is_causal", "sliding_window", "softcap", "position_bias", "s_aux", "cu_seq_lens_q",
     "cu_seq_lens_k"}
)  # fmt: skip
_KNOWN = _NO_EFFECT | _HONOURED


@dataclasses.dataclass(frozen=True)
class _Call:
    """One attention call of a model, translated into portattn's terms.

    Dense: ``q``, ``k``, ``v`` grouped (B, Hkv, G, L, d) for :func:`attention`.
    Packed (``offsets`` set): the model's own (1, H, T, d) and (1, Hkv, T, d)
    for :func:`attention_varlen` on heads-first arrays (``varlen_heads_first``),
    with ``offsets = (cu_seqlens_q, cu_seqlens_k)``.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    options: dict[str, Any]
    offsets: tuple[list[int], list[int]] | None
    weights: bool


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    impl: Impl = "auto",
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One attention call of a ``transformers`` model, computed by :func:`portattn.attention`.

    Follows the contract of ``transformers.AttentionInterface``: the
    projections come in head-major after the KV-cache update, the output goes
    back token-major, with the weights when the model asked for them.

    Parameters
    ----------
    module : torch.nn.Module
        The model's attention layer. Read for ``is_causal`` (default True),
        ``training`` and ``config.output_attentions``.
    query : torch.Tensor, shape (B, Hq, Lq, d)
        The layer's queries, after its projections (and RoPE, if any).
    key : torch.Tensor, shape (B, Hkv, Lk, d)
        The layer's keys, cached ones included.
    value : torch.Tensor, shape (B, Hkv, Lk, dv)
        The layer's values, cached ones included.
        ``Hq`` must be a multiple of ``Hkv``. The ``Hq // Hkv`` query heads
        of a group share one key/value head through broadcasting: K and V
        are never repeated.
    attention_mask : torch.Tensor or None, shape (B, 1 or Hq, Lq, Lk)
        Boolean (True = attend, as ``sdpa_mask`` builds it) or additive
        float (0 or a large negative number, as ``eager_mask`` builds it).
        ``None`` means causal when the layer is causal, aligned as
        ``torch.nn.functional.scaled_dot_product_attention`` aligns it for
        ``transformers``: top-left for a prefill (``Lq > 1``), every key for
        one decoded token.
    scaling : float, optional
        Multiplies :math:`QK^\\top`; default ``1/sqrt(d)``.
    dropout : float, optional
        Must be 0 while ``module.training``: portattn has no random stream
        that all array libraries share, so it refuses rather than skip it.
    impl : {"auto", "materialize", "blockwise", "native", "invariant"}, optional
        Passed to :func:`portattn.attention`; :func:`register` binds it.
    **kwargs
        ``is_causal`` (overrides ``module.is_causal``), ``sliding_window``
        (the mask already carries it; applied here only when the mask is
        ``None``, except on a bidirectional layer with ``Lq != Lk``, which
        attends to every key as transformers' eager path does), ``softcap``
        (``tanh(s / c) * c`` on the scaled scores, before masking, as Gemma 2
        does), ``position_bias`` (T5's relative
        bias, shape (1 or B, Hq, Lq, Lk), added to the scaled scores as a
        bias), ``s_aux`` (gpt-oss's attention sinks, shape (Hq,), passed as
        ``sinks``: one more logit per row, whose weight is dropped),
        ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (packed sequences in a batch
        of one row: see Notes), ``position_ids`` (read for packed sequences
        only), ``deterministic`` (ModernBERT's flash-attn hint: portattn's
        backward is deterministic anyway) and ``output_attentions``.
        Keyword arguments that change nothing here (cache and output
        bookkeeping, continuous batching's cache indices, the flash kernels'
        length bounds) are accepted; any other one that is not ``None``
        (a head mask, a ``block_table``, ...) is refused.

    Returns
    -------
    output : torch.Tensor, shape (B, Lq, Hq, dv)
    weights : torch.Tensor, shape (B, Hq, Lq, Lk), or None
        The attention weights when ``output_attentions`` is set, in the call
        or in ``module.config``; otherwise ``None``.

    Raises
    ------
    TypeError
        An unsupported keyword argument (a head mask, ...) or a mask that is
        neither boolean nor floating.
    ValueError
        Dropout while training; ranks or head counts that do not fit; packed
        sequences in a batch of more than one row, or with the weights asked
        for.

    Notes
    -----
    Packed sequences, as flash-attn's varlen path in ``transformers`` reads
    them: with ``cu_seq_lens_q`` and ``cu_seq_lens_k`` (continuous batching,
    ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``), or, for a
    batch of one row with ``Lq == Lk``, ``position_ids`` that do not rise by
    1 from one token to the next (``DataCollatorWithFlattening``), sequence
    ``i`` attends only within itself, through
    :func:`portattn.attention_varlen`: causal layers bottom-right aligned (its
    queries are its last tokens), ``sliding_window`` and ``softcap`` per
    sequence. The mask, which the model built for one long row, is not read.

    Examples
    --------
    >>> import torch
    >>> from portattn.integrations.transformers import attention_forward
    >>> layer = torch.nn.Module()  # a stand-in for a model's attention layer
    >>> q = torch.randn(2, 4, 5, 8)  # 4 query heads
    >>> k = v = torch.randn(2, 2, 5, 8)  # share 2 key/value heads
    >>> out, weights = attention_forward(layer, q, k, v, None)
    >>> tuple(out.shape), weights
    ((2, 5, 4, 8), None)
    """
    call = _translate(module, query, key, value, attention_mask, scaling, dropout, kwargs)
    return _run(call, impl=impl)


def _translate(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> _Call:
    """The model's arguments, checked, as portattn's arrays and options (the translation table)."""
    _check_call(module, query, key, value, dropout, kwargs)
    hq, hkv = int(query.shape[1]), int(key.shape[1])
    lq, lk = int(query.shape[2]), int(key.shape[2])
    xp = array_namespace(query, key, value)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    options: dict[str, Any] = {"scale": scaling, "softcap": kwargs.get("softcap")}
    weights = _wants_weights(module, kwargs)
    offsets = _packed_offsets(query, key, kwargs)
    sliding = kwargs.get("sliding_window")
    if offsets is not None:
        if weights:
            msg = (
                "expected output_attentions to be off for packed sequences (cu_seq_lens_q, or "
                "position_ids that restart), got it on: the packed path forms no weights"
            )
            raise ValueError(msg)
        options |= _packed_causal_window(sliding, is_causal=is_causal)
        options |= _sinks(kwargs.get("s_aux"), hq=hq, hkv=None, xp=xp)
        # serve(model) marks the layers: one fused call per step unless it was given
        # batch_invariant=True; a model serve did not mark stays bitwise
        options["batch_invariant"] = getattr(module, "portattn_batch_invariant", True)
        # As they come, (1, H, T, d): the packed layout's permutes, both ways, cost more
        # than a decode step's checks.
        return _Call(query, key, value, options, offsets, weights=False)
    options |= _masks(attention_mask, kwargs.get("position_bias"), (hq, hkv, lq, lk), xp=xp)
    options |= _causal_window(attention_mask, sliding, is_causal=is_causal, lq=lq, lk=lk)
    options |= _sinks(kwargs.get("s_aux"), hq=hq, hkv=hkv, xp=xp)
    # Group the query heads onto their key/value head instead of repeating K and V:
    # q (B, Hkv, G, Lq, d) against k, v (B, Hkv, 1, Lk, d) broadcast over G.
    gq, gk, gv = group_heads(query, key, value, xp=xp)
    return _Call(gq, gk, cast("torch.Tensor", gv), options, None, weights=weights)


def _run(call: _Call, *, impl: Impl) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The translated call, computed, in transformers' layout: (B, Lq, Hq, dv) and the weights."""
    if call.offsets is not None:
        cu_q, cu_k = call.offsets
        out = varlen_heads_first(
            call.q, call.k, call.v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, impl=impl,
            **call.options,
        )  # fmt: skip
        return cast("torch.Tensor", out).transpose(1, 2), None  # (1, T, Hq, dv)
    xp = array_namespace(call.q)
    out = cast("torch.Tensor", attention(call.q, call.k, call.v, impl=impl, **call.options))
    out = ungroup_heads(out, xp=xp).transpose(1, 2).contiguous()  # (B, Lq, Hq, dv)
    weights = None
    if call.weights:  # (B, Hq, Lq, Lk)
        weights = ungroup_heads(attention_weights(call.q, call.k, **call.options), xp=xp)
    return out, weights


def _check_call(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout: float,
    kwargs: dict[str, Any],
) -> None:
    """What attention_forward refuses: unknown keyword arguments, dropout, shapes."""
    extra = sorted(n for n, x in kwargs.items() if x is not None and n not in _KNOWN)
    if extra:
        msg = (
            f"portattn cannot honour the keyword argument(s) {', '.join(extra)} that the model "
            f"passed to its attention (expected only {', '.join(sorted(_HONOURED))} and "
            "bookkeeping ones); use another attn_implementation for this model"
        )
        raise TypeError(msg)
    if dropout and module.training:
        msg = (
            f"expected dropout=0 while the model trains, got dropout={dropout}: portattn has no "
            "random stream shared by every array library; set the model's attention dropout "
            "to 0 (e.g. config.attention_dropout or config.attn_pdrop) or call model.eval()"
        )
        raise ValueError(msg)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.ndim != 4:
            msg = f"expected {name} of shape (batch, heads, length, features), got {tuple(x.shape)}"
            raise ValueError(msg)
    hq, hkv = int(query.shape[1]), int(key.shape[1])
    if int(value.shape[1]) != hkv or hq % hkv:
        msg = (
            "expected key and value to have the same number of heads, dividing the query's: "
            f"got query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
        raise ValueError(msg)


def _packed_causal_window(sliding: object, *, is_causal: bool) -> dict[str, Any]:
    """``causal`` and ``window`` for packed sequences: each aligned bottom-right, as flash-attn."""
    causal = "bottom_right" if is_causal else False
    if sliding is None:
        return {"causal": causal}
    w = int(cast("int", sliding))  # flash-attn's window in transformers: w - 1 back, 0 ahead
    return {"causal": causal, "window": (w - 1, 0) if is_causal else (w, w)}  # as _causal_window


def _causal_window(
    attention_mask: torch.Tensor | None, sliding: object, *, is_causal: bool, lq: int, lk: int
) -> dict[str, Any]:
    """``causal`` and ``window`` for a dense call: from the layer only when there is no mask."""
    if attention_mask is not None:
        return {}  # the mask carries causality and the window
    # The convention of transformers' sdpa path: one query token sees
    # every cached key; a longer block is aligned top-left (a prefill into
    # a static cache whose later slots are still empty).
    causal: bool | str = False
    if is_causal:
        causal = "bottom_right" if lq == 1 else "top_left"
    # A bidirectional window over Lq != Lk keys has no alignment to read
    # it by. transformers hands such a layer no mask only where its window
    # cannot bind (sdpa_mask skips it for kv_length < window), and its eager
    # path then attends to every key: so does this one.
    if sliding is None or not (is_causal or lq == lk):
        return {"causal": causal}
    # transformers' overlays: causal keeps q - k < w, bidirectional |q - k| <= w
    w = int(cast("int", sliding))
    return {"causal": causal, "window": (w - 1, 0) if is_causal else (w, w)}


def _packed_offsets(
    query: torch.Tensor, key: torch.Tensor, kwargs: dict[str, Any]
) -> tuple[list[int], list[int]] | None:
    """``(cu_seqlens_q, cu_seqlens_k)`` on the host where the call packs sequences, else None."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    batch, lq, lk = int(query.shape[0]), int(query.shape[2]), int(key.shape[2])
    if cu_q is not None or cu_k is not None:
        if cu_q is None or cu_k is None or batch != 1:
            msg = (
                "expected cu_seq_lens_q and cu_seq_lens_k together, over a batch of one packed "
                f"row, got {'both' if cu_q is not None and cu_k is not None else 'one'} for a "
                f"batch of {batch}"
            )
            raise ValueError(msg)
        return _host_offsets(cu_q), _host_offsets(cu_k)
    positions = kwargs.get("position_ids")
    if not isinstance(positions, torch.Tensor) or batch != 1 or lq != lk or lq < 2:
        return None
    row = positions.reshape(-1)
    if int(row.shape[0]) != lq:
        return None
    # transformers' rule (find_packed_sequence_indices): a sequence starts
    # wherever the position does not rise by 1.
    starts = (torch.nonzero(row[1:] - row[:-1] != 1).reshape(-1) + 1).tolist()
    if not starts:
        return None
    cu = [0, *starts, lq]
    return cu, cu


def _host_offsets(cu: object) -> list[int]:
    """``cu`` as Python ints; a tensor's read once per version: a step's layers repeat it.

    The version counter sees every write torch makes (continuous batching
    refills its buffer by slice assignment), not writes that bypass it
    (through ``.data``, a NumPy view from ``.numpy()`` or DLPack): a caller
    that writes offsets that way must pass a new tensor.
    """
    if not isinstance(cu, torch.Tensor):
        return [int(n) for n in cast("Sequence[int]", cu)]
    if type(cu) is not torch.Tensor or cu.is_inference() or torch.compiler.is_compiling():
        return [int(n) for n in cu.tolist()]  # no version counter to trust: read it
    # Keyed on the tensor itself (held, so that its id is not reused) and its
    # version, which every in-place write bumps, through any view of its
    # storage: continuous batching refills one buffer in place every step.
    held = _OFFSETS.get(id(cu))
    if held is not None and held[0] is cu and held[1] == cu._version:
        return list(held[2])
    values = [int(n) for n in cu.tolist()]
    if len(_OFFSETS) >= 8:
        _OFFSETS.clear()
    _OFFSETS[id(cu)] = (cu, cu._version, tuple(values))
    return values


# The offsets last read from tensors: (tensor, version, values) by id.
_OFFSETS: dict[int, tuple[torch.Tensor, int, tuple[int, ...]]] = {}


def _mask_parts(
    attention_mask: torch.Tensor | None, *, hq: int, hkv: int, lq: int, lk: int, xp: Namespace
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The model's 4-D mask as portattn's ``(mask, bias)``, with a group axis for GQA."""
    if attention_mask is None:
        return None, None
    if not isinstance(attention_mask, torch.Tensor):
        msg = (
            "expected attention_mask to be a torch.Tensor or None, got "
            f"{type(attention_mask).__qualname__} (a flex-attention BlockMask needs "
            "attn_implementation='flex_attention')"
        )
        raise TypeError(msg)
    m = attention_mask
    heads = int(m.shape[1]) if m.ndim == 4 else -1
    if (
        m.ndim != 4
        or heads not in (1, hq)
        or int(m.shape[2]) not in (1, lq)
        or int(m.shape[3]) != lk
    ):
        msg = (
            f"expected attention_mask of shape (batch, 1 or {hq}, {lq}, {lk}), got {tuple(m.shape)}"
        )
        raise ValueError(msg)
    # (B, 1, 1, Lq, Lk) for a mask shared by the heads, else (B, Hkv, G, Lq, Lk)
    m = group_mask(m, num_kv_heads=hkv, heads_axis=True, xp=xp)
    if m.dtype == torch.bool:
        return m, None
    if m.is_floating_point():
        return None, m  # additive: 0 where allowed, a large negative number elsewhere
    msg = f"expected attention_mask to be boolean or floating, got {m.dtype}"
    raise TypeError(msg)


def _masks(
    attention_mask: torch.Tensor | None,
    position_bias: object,
    sizes: tuple[int, int, int, int],
    *,
    xp: Namespace,
) -> dict[str, Any]:
    """``mask`` and ``bias`` of a dense call: the model's mask, and T5's position bias added."""
    hq, hkv, lq, lk = sizes
    mask, bias = _mask_parts(attention_mask, hq=hq, hkv=hkv, lq=lq, lk=lk, xp=xp)
    bias = _with_position_bias(bias, position_bias, hq=hq, hkv=hkv, lq=lq, lk=lk)
    return {"mask": mask, "bias": bias}


def _with_position_bias(
    bias: torch.Tensor | None,
    position_bias: object,
    *,
    hq: int,
    hkv: int,
    lq: int,
    lk: int,
) -> torch.Tensor | None:
    """T5's ``position_bias`` added to the mask's bias (both additive, as eager adds them)."""
    if position_bias is None:
        return bias
    pb = position_bias
    if (
        not isinstance(pb, torch.Tensor)
        or not pb.is_floating_point()
        or pb.ndim != 4
        or int(pb.shape[1]) not in (1, hq)
        or tuple(pb.shape[2:]) != (lq, lk)
    ):
        got = (
            f"{pb.dtype} tensor of shape {tuple(pb.shape)}"
            if isinstance(pb, torch.Tensor)
            else type(pb).__qualname__
        )
        want = f"(1 or batch, 1 or {hq}, {lq}, {lk})"
        msg = f"expected position_bias to be a float tensor {want}, got {got}"
        raise ValueError(msg)
    xp = array_namespace(pb)
    grouped: torch.Tensor = group_mask(pb, num_kv_heads=hkv, heads_axis=True, xp=xp)
    # (1 or B, Hkv, G, Lq, Lk), or (1 or B, 1, 1, Lq, Lk) for a bias shared by the heads
    return grouped if bias is None else bias + grouped


def _sinks(s_aux: object, *, hq: int, hkv: int | None, xp: Namespace) -> dict[str, Any]:
    """gpt-oss's ``s_aux``, one per query head (Hq,), as ``sinks``; grouped onto ``hkv`` heads."""
    if s_aux is None:
        return {}
    if not isinstance(s_aux, torch.Tensor) or tuple(s_aux.shape) != (hq,):
        got = tuple(s_aux.shape) if isinstance(s_aux, torch.Tensor) else type(s_aux).__qualname__
        msg = f"expected s_aux (attention sinks) to be a tensor of shape ({hq},), got {got}"
        raise ValueError(msg)
    sinks = s_aux if hkv is None else group_per_head(s_aux, num_kv_heads=hkv, xp=xp)
    return {"sinks": sinks}


def _wants_weights(module: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether the caller asked for the weights: in the call, in the config, or by recording them.

    Some layers (GPT-2's) consume ``output_attentions`` themselves; their
    model then records the weights that the attention returns through
    transformers' output collector, which is where the request shows.
    """
    asked = kwargs.get("output_attentions")
    if asked is not None:
        return bool(asked)
    if getattr(getattr(module, "config", None), "output_attentions", False):
        return True
    collecting = None if _COLLECTOR is None else _COLLECTOR.get()
    return isinstance(collecting, dict) and "attentions" in collecting


def register(name: str = "portattn", *, impl: Impl = "auto") -> str:
    """Make ``attn_implementation=name`` compute attention with portattn.

    Registers :func:`attention_forward` (bound to ``impl``) with
    ``transformers.AttentionInterface`` and ``sdpa_mask`` (boolean masks,
    True = attend, or ``None`` where causality alone suffices) with
    ``AttentionMaskInterface``, under ``name`` and under its serving alias
    ``name + "_flash"`` (see :func:`serve`). Calling it again with the same
    arguments changes nothing; calling it with another ``impl`` rebinds the
    names.

    Parameters
    ----------
    name : str, optional
        The ``attn_implementation`` to register. Names that ``transformers``
        already gives another implementation (``"sdpa"``, ``"eager"``, ...)
        are refused, and so are names containing ``"flash"``, which
        ``transformers`` would not load (it looks for a flash-attn kernel).
    impl : {"auto", "materialize", "blockwise", "native", "invariant"}, optional
        The :func:`portattn.attention` path.

    Returns
    -------
    str
        ``name``, for ``from_config(..., attn_implementation=register())``.

    Raises
    ------
    ValueError
        An unknown ``impl``, an empty name, a name containing "flash", or a
        name taken by another implementation.

    Examples
    --------
    >>> from portattn.integrations.transformers import register
    >>> register()
    'portattn'
    >>> register("portattn-blockwise", impl="blockwise")
    'portattn-blockwise'
    """
    if impl not in IMPLS:
        msg = f"expected impl to be one of {', '.join(map(repr, IMPLS))}, got {impl!r}"
        raise ValueError(msg)
    if not isinstance(name, str) or not name:
        msg = f"expected name to be a non-empty string, got {name!r}"
        raise ValueError(msg)
    if "flash" in name:
        msg = (
            "expected a name without 'flash' (transformers would look for a flash-attn kernel "
            f"by that name; serve() gives the model a flash alias), got {name!r}"
        )
        raise ValueError(msg)
    for each in (name, name + _SERVING):
        taken = AttentionInterface._global_mapping.get(each)
        if each == "eager" or (taken is not None and not hasattr(taken, "portattn_impl")):
            msg = (
                f"expected a name that transformers does not already use, got {each!r}, "
                "which is another attention implementation"
            )
            raise ValueError(msg)
    taken = AttentionInterface._global_mapping.get(name)
    if taken is not None and taken.portattn_impl == impl:
        return name
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    forward = functools.partial(attention_forward, impl=impl)
    forward.portattn_impl = impl  # type: ignore[attr-defined]
    for each in (name, name + _SERVING):
        AttentionInterface.register(each, forward)
        AttentionMaskInterface.register(each, sdpa_mask)
    return name


# The serving alias's suffix: continuous batching admits names containing
# "flash"; no digit after it (transformers reads "flash...2" as flash-attn 2).
_SERVING = "_flash"


def serve(model: _Model, /, *, batch_invariant: bool = False) -> _Model:
    """Let ``model.generate_batch`` (transformers' continuous batching) run on portattn.

    Continuous batching admits only ``"sdpa"``, ``"paged|eager"`` and names
    containing ``"flash"``; only the latter get packed sequences
    (``cu_seq_lens_q`` / ``cu_seq_lens_k``) instead of a dense mask. This
    switches a model loaded with a name from :func:`register` to that name's
    alias ``name + "_flash"``: the same attention function and mask function,
    so every other use of the model (``generate``, training) is unchanged,
    except that packed sequences (padding-free training too) follow
    ``batch_invariant``. It sets ``model.config._attn_implementation`` (and the sub-configs'),
    because ``set_attn_implementation`` would try to import a flash-attn
    kernel for a name containing "flash", and would swap gpt-oss onto its
    own kernel. Calling it again changes only ``batch_invariant``, which it
    sets anew: ``serve(model)`` after ``serve(model, batch_invariant=True)``
    turns the guarantee off.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Loaded with ``attn_implementation=register(...)``.
    batch_invariant : bool, optional
        Passed to :func:`portattn.attention_varlen` on every packed call.
        ``False`` (the default): each step's sequences run as one masked
        call where that is worth it, the fast way. ``True``: a sequence's
        tokens do not depend on the other requests in the batch, bit for
        bit, at a cost the Serving page's table gives (every sequence runs
        as its own call). Stored on the model's modules as
        ``portattn_batch_invariant``; a model that ``serve`` did not mark
        (padding-free training on a model loaded with ``register()``) keeps
        the bitwise default of :func:`portattn.attention_varlen`.

    Returns
    -------
    transformers.PreTrainedModel
        ``model`` itself.

    Raises
    ------
    ValueError
        A model whose attention is not one that :func:`register` made.

    Examples
    --------
    >>> from portattn.integrations.transformers import register, serve, tiny_model
    >>> model = serve(tiny_model("llama", attn_implementation=register()))
    >>> model.config._attn_implementation
    'portattn_flash'
    """
    name = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if isinstance(name, str) and name.endswith(_SERVING):
        name = name.removesuffix(_SERVING)
    forward = AttentionInterface._global_mapping.get(name) if isinstance(name, str) else None
    if not hasattr(forward, "portattn_impl"):
        msg = (
            "expected a model loaded with attn_implementation=register(...) from "
            f"portattn.integrations.transformers, got attn_implementation={name!r}"
        )
        raise ValueError(msg)
    flag = check_flag("batch_invariant", batch_invariant)
    for module in model.modules():
        setattr(module, "portattn_batch_invariant", flag)  # noqa: B010 (nn.Module's typed setattr)
    model.config._attn_implementation = f"{name}{_SERVING}"  # type: ignore[union-attr]
    return model


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m portattn hf``: a tiny random model's last-layer attention, as heatmaps."""
    from .._lib._terminal import heatmap

    parser = argparse.ArgumentParser(
        prog="python -m portattn hf",
        description="Run a tiny random Hugging Face model with portattn as its attention and "
        "print the attention weights of its last layer, one heatmap per head.",
    )
    parser.add_argument("--arch", choices=ARCHITECTURES, default="llama")
    parser.add_argument("--length", type=int, default=8, help="prompt tokens (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-color", action="store_true", help="plain text heatmaps")
    args = parser.parse_args(argv)
    if not 1 <= args.length <= 64:
        parser.error(f"expected --length between 1 and 64, got {args.length}")
    model = tiny_model(args.arch, attn_implementation=register(), seed=args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(1, model.config.vocab_size, (1, args.length), generator=generator)
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    last = attentions[-1][0]  # (Hq, L, L)
    tokens = [f"t{int(i)}" for i in ids[0]]
    color = not args.no_color and sys.stdout.isatty()
    print(
        f"portattn in a tiny random {type(model).__name__} "
        f"({model.config.num_hidden_layers} layers, {last.shape[0]} heads): "
        "attention weights of the last layer (rows = queries)"
    )
    for h in range(last.shape[0]):
        print(f"\nhead {h}:")
        print(heatmap(tokens, last[h].numpy(), color=color))
    return 0
