"""The checked options of one :func:`portattn.parallel.attention` call (no array, no library)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._layout import Layout

__all__ = ["Options"]


@dataclasses.dataclass(frozen=True)
class Options:
    """The options of one call of :func:`portattn.parallel.attention`, checked by the entry."""

    strategy: str
    layout: Layout
    causal: bool
    window: tuple[int, int] | None
    scale: float | None
    softcap: float | None
    score_mod: Any
    block_mask: Any
    block_size: tuple[int, int] | None
