"""How one :func:`portattn.parallel.attention` call runs, beside its options (no array, no library).

The attention options are the one :class:`~portattn._core._variant.Variant`
every entry builds (:func:`~portattn._core._variant.build_variant`); this holds
what only context parallelism asks, and the arguments ``attend`` takes apart.
"""

from __future__ import annotations

import dataclasses

from .._core._variant import Variant
from ._layout import Layout

__all__ = ["Setup"]


@dataclasses.dataclass(frozen=True)
class Setup:
    """One call of :func:`portattn.parallel.attention`, checked by the entry."""

    strategy: str
    layout: Layout
    variant: Variant  # the options, global positions and all
    scale: float | None
    block_size: tuple[int, int] | None
