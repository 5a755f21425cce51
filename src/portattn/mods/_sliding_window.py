"""Sliding window: a band of keys around each query."""

from __future__ import annotations

from .._core._modspec import MaskMod
from .._lib._checks import check_int
from .._lib._typing import Array
from ._captured import module_level

__all__ = ["sliding_window"]


def sliding_window(left: int, right: int = 0, /) -> MaskMod:
    """A ``mask_mod`` keeping keys ``i - left <= j <= i + right`` for query ``i``.

    Parameters
    ----------
    left : int
        Keys before the query that it sees (``left=0`` sees none).
    right : int, default 0
        Keys after the query that it sees; 0 makes the window causal, as in
        Mistral and Gemma.

    Returns
    -------
    callable
        The ``mask_mod``, written with operators alone (it also serves
        torch's ``flex_attention``).

    Examples
    --------
    >>> import portattn as pa
    >>> from portattn import mods
    >>> bm = pa.create_block_mask(mods.sliding_window(128), None, None, 1024, 1024, block_size=128)
    >>> bm.key_blocks(5)
    (4, 5)
    """
    lo = check_int("left", left, minimum=0)
    hi = check_int("right", right, minimum=0)

    return module_level(_sliding_window_mask, lo, hi, name=f"sliding_window({lo}, {hi})")


def _sliding_window_mask(
    lo: int, hi: int, b: Array, h: Array, q_idx: Array, kv_idx: Array
) -> Array:
    return (q_idx - kv_idx <= lo) & (kv_idx - q_idx <= hi)
