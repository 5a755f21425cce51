"""Chunked attention (Llama 4): queries see only keys of their own fixed-size chunk."""

from __future__ import annotations

from .._core._modspec import MaskMod
from .._lib._checks import check_int
from .._lib._typing import Array
from ._captured import module_level

__all__ = ["chunked"]


def chunked(chunk_size: int, /) -> MaskMod:
    """A ``mask_mod`` keeping pairs in the same chunk: ``i // chunk_size == j // chunk_size``.

    Llama 4's local layers are this and :func:`causal` together:
    ``pa.and_masks(mods.causal, mods.chunked(8192))``.

    Parameters
    ----------
    chunk_size : int
        Tokens per chunk, counted from position 0.

    Returns
    -------
    callable
        The ``mask_mod`` (operators alone: it also serves torch's ``flex_attention``).

    Examples
    --------
    >>> import portattn as pa
    >>> from portattn import mods
    >>> llama4 = pa.and_masks(mods.causal, mods.chunked(256))
    >>> pa.create_block_mask(llama4, None, None, 1024, 1024).key_blocks(3)
    (2, 3)
    """
    size = check_int("chunk_size", chunk_size, minimum=1)

    return module_level(_chunked_mask, size, name=f"chunked({size})")


def _chunked_mask(size: int, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
    return q_idx // size == kv_idx // size
