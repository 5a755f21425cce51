"""Prefix-LM: a prefix attended in both directions, then causal text."""

from __future__ import annotations

import numbers

from .._core._modspec import MaskMod
from .._lib._checks import check_int
from .._lib._typing import Array
from ._captured import captured, module_level, too_short

__all__ = ["prefix_lm"]


def prefix_lm(prefix: int | Array, /) -> MaskMod:
    """A ``mask_mod``: every query sees the first ``prefix`` keys, and the keys before it.

    As in T5's prefix-LM and PaliGemma: the prefix (an image, a prompt) is
    attended bidirectionally, the rest causally.

    Parameters
    ----------
    prefix : int or array
        Length of the prefix: one int for every row, or an integer array of
        shape ``(B,)`` with one length per batch row (captured; of the
        library the mod computes in).

    Returns
    -------
    callable
        The ``mask_mod``: ``(kv_idx < prefix) | (q_idx >= kv_idx)``
        (operators and indexing alone: it also serves torch's ``flex_attention``).

    Examples
    --------
    >>> import portattn as pa
    >>> from portattn import mods
    >>> bm = pa.create_block_mask(mods.prefix_lm(256), None, None, 512, 512)
    >>> bm.key_blocks(0), bm.tile_kind(0, 1) == pa.BlockMask.FULL
    ((0, 1), True)
    """
    if isinstance(prefix, numbers.Integral) and not isinstance(prefix, bool):
        n = check_int("prefix", prefix, minimum=0)
        return module_level(_prefix_lm_mask, n, name=f"prefix_lm({n})")
    if isinstance(prefix, bool):
        msg = f"expected prefix to be a non-negative int or an integer array, got {prefix!r}"
        raise ValueError(msg)
    lengths, _ = captured("prefix", prefix, kind="integral", ranks=(1,))
    return module_level(_prefix_lm_rows, lengths, name="prefix_lm_rows", check=_check_rows)


def _prefix_lm_mask(n: int, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
    return (kv_idx < n) | (q_idx >= kv_idx)


def _prefix_lm_rows(lengths: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
    return (kv_idx < lengths[b]) | (q_idx >= kv_idx)


def _check_rows(lengths: Array, nb: int, nh: int, lq: int, lk: int) -> None:
    if lengths.shape[0] < nb:
        too_short("mods.prefix_lm", "prefix", lengths.shape[0], f"one per batch row, B={nb}")
