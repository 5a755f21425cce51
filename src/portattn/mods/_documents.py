"""Packed documents: several sequences share one row and must not see each other."""

from __future__ import annotations

from .._core._modspec import MaskMod
from .._lib._typing import Array
from ._captured import captured, module_level, too_short

__all__ = ["documents"]


def documents(ids: Array, /, kv_ids: Array | None = None) -> MaskMod:
    """A ``mask_mod`` keeping pairs whose tokens belong to the same document.

    For sequences packed into one row, each document attending only to
    itself; add causality with ``pa.and_masks(mods.causal, mods.documents(ids))``.

    Parameters
    ----------
    ids : array
        Integer document id of every position: shape ``(L,)``, or ``(B, L)``
        when each batch row is packed differently. Captured, not copied; it
        must be of the library the mod computes in. A call with more
        positions (or batch rows) than it holds is refused before any tile
        is indexed (JAX would clamp the index).
    kv_ids : array, optional
        Ids of the keys when they differ from the queries' (cross-attention,
        a KV cache); same rank as ``ids``.

    Returns
    -------
    callable
        The ``mask_mod``: ``ids[q] == kv_ids[kv]``, by indexing alone (it also
        serves torch's ``flex_attention``).

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> from portattn import mods
    >>> ids = np.repeat(np.arange(8), 256)  # 8 documents of 256 tokens
    >>> packed = pa.and_masks(mods.causal, mods.documents(ids))
    >>> round(pa.create_block_mask(packed, None, None, 2048, 2048).density, 4)
    0.0938
    """
    q_ids, _ = captured("ids", ids, kind="integral", ranks=(1, 2))
    k_ids = q_ids
    if kv_ids is not None:
        k_ids, _ = captured("kv_ids", kv_ids, kind="integral", ranks=(q_ids.ndim,))
        if q_ids.ndim == 2 and k_ids.shape[0] != q_ids.shape[0]:
            msg = (
                "expected kv_ids to have as many batch rows as ids, "
                f"got {k_ids.shape[0]} and {q_ids.shape[0]}"
            )
            raise ValueError(msg)

    fn = _document_mask if q_ids.ndim == 1 else _document_rows_mask
    kv_name = "ids" if kv_ids is None else "kv_ids"
    return module_level(fn, q_ids, k_ids, kv_name, name="document_mask", check=_check)


def _document_mask(
    q_ids: Array, k_ids: Array, kv_name: str, b: Array, h: Array, q_idx: Array, kv_idx: Array
) -> Array:
    return q_ids[q_idx] == k_ids[kv_idx]


def _document_rows_mask(
    q_ids: Array, k_ids: Array, kv_name: str, b: Array, h: Array, q_idx: Array, kv_idx: Array
) -> Array:
    return q_ids[b, q_idx] == k_ids[b, kv_idx]


def _check(q_ids: Array, k_ids: Array, kv_name: str, nb: int, nh: int, lq: int, lk: int) -> None:
    name = "mods.documents"
    if q_ids.shape[-1] < lq:
        too_short(name, "ids", q_ids.shape[-1], f"an id for every query position, Lq={lq}")
    if k_ids.shape[-1] < lk:
        too_short(name, kv_name, k_ids.shape[-1], f"an id for every key position, Lk={lk}")
    if q_ids.ndim == 2 and q_ids.shape[0] < nb:
        too_short(name, "ids", q_ids.shape[0], f"a row for every batch entry, B={nb}")
