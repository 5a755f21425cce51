"""``impl="auto"``: which path a validated problem takes, decided here and nowhere else.

The entry (:func:`~portattn.attention`) asks for every call, and the dask
pair tasks ask for each tile of a chunked call, so both follow one rule.
"""

from __future__ import annotations

from .._core._problem import Problem
from .._lib._typing import Namespace
from ._native import auto_delegates

__all__ = ["MATERIALIZE_MAX_PAIRS", "auto_impl"]

# Below this many (query, key) pairs per batch entry, materialising the score
# matrix is cheaper than any blocking machinery.
MATERIALIZE_MAX_PAIRS = 256 * 256


def auto_impl(p: Problem, *, lib: str, want_lse: bool, xp: Namespace) -> str:
    """The path ``impl="auto"`` takes for ``p`` (the rule is spelled out in :func:`attention`).

    ``lib`` is ``xp``'s library name, which callers already hold.
    """
    if lib == "torch" and auto_delegates(
        p, return_lse=want_lse, materialize_max_pairs=MATERIALIZE_MAX_PAIRS, xp=xp
    ):
        return "native"
    s = p.structure
    return "blockwise" if s.lq * s.lk > MATERIALIZE_MAX_PAIRS else "materialize"
