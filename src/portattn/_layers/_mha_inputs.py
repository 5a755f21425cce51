"""The inputs of a :class:`~portattn.MultiHeadAttention` call: checked, and laid out for its heads.

Every argument whose meaning does not depend on the projections is checked
here, before anything is computed. A user passes masks in the layout of
``x`` (..., Lq, Lk), or in torch's and Hugging Face's (\\*batch, 1 or H, Lq,
Lk), and one key length per sequence. The heads run as one grouped call
(:mod:`._heads`), so both gain head axes here. Anything that would silently
enlarge the batch instead is refused, with the user's own shapes in the
message.
"""

from __future__ import annotations

from typing import Protocol

from .._lib._checks import check_array, check_floating, check_same_device, shown
from .._lib._typing import Array, Namespace
from ._heads import group_mask
from ._kvcache import KVCache

__all__ = ["Widths", "check_arrays", "check_inputs", "check_layouts", "layout_masks"]


def _shape(a: Array) -> tuple[int, ...]:
    return tuple(int(n) for n in a.shape)


class Widths(Protocol):
    """What :func:`check_inputs` reads of the layer: its widths, RoPE and weights' device."""

    d_model: int
    d_context: int
    wq: Array

    @property
    def rope(self) -> str | None: ...


def check_inputs(
    layer: Widths,
    x: Array,
    context: Array | None,
    *,
    positions: Array | None,
    cache: object,
    xp: Namespace,
) -> Array:
    """Check ``x``, ``context`` and ``positions`` against the layer; return where keys come from."""
    check_floating("x", x, xp=xp)
    if x.ndim < 2 or int(x.shape[-1]) != layer.d_model:
        msg = f"expected x of shape (..., Lq, d_model={layer.d_model}), got shape {_shape(x)}"
        raise ValueError(msg)
    if context is None:
        if layer.d_context != layer.d_model:
            msg = (
                f"expected a context (keys and values have width d_context={layer.d_context} "
                f"!= d_model={layer.d_model}), got context=None"
            )
            raise ValueError(msg)
        src = x
    else:
        check_floating("context", context, xp=xp)
        if context.ndim < 2 or int(context.shape[-1]) != layer.d_context:
            msg = (
                f"expected context of shape (..., Lk, d_context={layer.d_context}), "
                f"got shape {_shape(context)}"
            )
            raise ValueError(msg)
        if cache is not None:
            msg = "expected cache=None with a context: the KV cache serves causal self-attention"
            raise ValueError(msg)
        if layer.rope is not None:
            msg = (
                "expected context=None with rope: RoPE rotates by positions within one "
                "sequence, and a cross-attention context has no shared positions"
            )
            raise ValueError(msg)
        src = context
    if positions is not None:
        if layer.rope is None:
            msg = "expected positions=None for a MultiHeadAttention built with rope=None"
            raise ValueError(msg)
        lq = int(x.shape[-2])
        if positions.ndim < 1 or int(positions.shape[-1]) != lq:
            msg = (
                f"expected positions of shape (..., Lq={lq}) like x {_shape(x)}, "
                f"got shape {_shape(positions)}"
            )
            raise ValueError(msg)
    check_same_device([("weights", layer.wq), ("x", x), ("context", context)])
    return src


def check_arrays(
    x: object, context: object, mask: object, key_lengths: object, positions: object, cache: object
) -> None:
    """Name the argument that is not an array (or not a KVCache) before anything reads it."""
    check_array("x", x)
    named = (("context", context), ("mask", mask), ("key_lengths", key_lengths))
    for name, a in (*named, ("positions", positions)):
        if a is not None:
            check_array(name, a)
    if cache is not None and not isinstance(cache, KVCache):
        msg = f"expected cache to be a KVCache or None, got {shown(cache)}"
        raise TypeError(msg)


def _fits(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` and ``target`` broadcast together (NumPy rules, from the right)."""
    return all(m == n or 1 in (m, n) for m, n in zip(shape[::-1], target[::-1], strict=False))


def check_layouts(
    x: Array, mask: Array | None, key_lengths: Array | None, *, num_heads: int, num_keys: int
) -> bool:
    """Refuse masks and lengths that would silently enlarge the batch or do not fit; find heads.

    ``num_keys`` is ``Lk``, the number of keys the call attends over. Every
    message shows the shapes the user passed, never the grouped ones the
    heads run in. Returns whether the mask has the torch / Hugging Face
    layout (\\*batch, 1 or H, Lq, Lk), one axis more than ``x``.
    """
    nb = x.ndim - 2
    batch = _shape(x)[:-2]
    lq_lk = (int(x.shape[-2]), num_keys)
    heads_axis = False
    if mask is not None:
        shape = _shape(mask)
        if mask.ndim < 2 or mask.ndim > nb + 3:
            msg = (
                f"expected mask of shape (..., Lq, Lk) for x of shape {_shape(x)}, or the "
                f"torch / Hugging Face layout (*batch, 1 or num_heads={num_heads}, Lq, "
                f"Lk), with no more batch axes than x has; got mask shape {shape}"
            )
            raise ValueError(msg)
        if mask.ndim == nb + 3:
            if shape[-3] not in (1, num_heads):
                msg = (
                    f"expected a mask with one axis more than x {_shape(x)} to be in the "
                    f"torch / Hugging Face layout (*batch, 1 or num_heads={num_heads}, "
                    f"Lq, Lk), got mask shape {shape} with {shape[-3]} on the heads axis"
                )
                raise ValueError(msg)
            heads_axis = True
        mask_batch = shape[: -3 if heads_axis else -2]
        if shape[-2] not in (1, lq_lk[0]) or shape[-1] not in (1, lq_lk[1]):
            ok = False
        else:
            ok = _fits(mask_batch, batch)
        if not ok:
            msg = (
                f"expected mask of shape (..., Lq, Lk) with (Lq, Lk) = {lq_lk} and a batch "
                f"broadcastable with x's {batch} (x of shape {_shape(x)}), got mask shape {shape}"
            )
            raise ValueError(msg)
    if key_lengths is not None and (key_lengths.ndim > nb or not _fits(_shape(key_lengths), batch)):
        msg = (
            f"expected key_lengths with one length per sequence, broadcastable to x's batch "
            f"shape {batch}, got shape {_shape(key_lengths)}"
        )
        if key_lengths.ndim == nb + 1 and _shape(key_lengths)[-1] == 1:
            msg += f"; pass key_lengths[..., 0] (shape {_shape(key_lengths)[:-1]})"
        raise ValueError(msg)
    return heads_axis


def layout_masks(
    mask: Array | None,
    key_lengths: Array | None,
    *,
    heads_axis: bool,
    num_kv_heads: int,
    xp: Namespace,
) -> tuple[Array | None, Array | None]:
    """``mask`` and ``key_lengths`` with the grouped heads axes (..., Hkv or 1, G or 1, ...)."""
    if mask is not None:
        mask = group_mask(mask, num_kv_heads=num_kv_heads, heads_axis=heads_axis, xp=xp)
    if key_lengths is not None:
        key_lengths = xp.reshape(key_lengths, (*key_lengths.shape, 1, 1))  # (..., 1, 1)
    return mask, key_lengths
