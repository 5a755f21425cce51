"""Causal: a query sees itself and the keys before it."""

from __future__ import annotations

from .._lib._typing import Array

__all__ = ["causal"]


def causal(b: Array, h: Array, q_idx: Array, kv_idx: Array, /) -> Array:
    """A ``mask_mod``: query ``i`` sees keys ``j <= i`` (positions counted from the start).

    Parameters
    ----------
    b, h, q_idx, kv_idx : array
        The index arrays of the tile (only ``q_idx`` and ``kv_idx`` are read).

    Returns
    -------
    array
        ``q_idx >= kv_idx``.

    Examples
    --------
    >>> import portattn as pa
    >>> from portattn import mods
    >>> pa.create_block_mask(mods.causal, None, None, 512, 512).density
    0.625
    """
    return q_idx >= kv_idx
