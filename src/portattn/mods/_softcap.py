"""Soft-capping (Gemma 2, Grok): scores squashed smoothly into (-cap, cap)."""

from __future__ import annotations

from .._core._modspec import ScoreMod
from .._lib._checks import check_real
from .._lib._compat import array_namespace
from .._lib._typing import Array

__all__ = ["softcap"]


def softcap(cap: float, /) -> ScoreMod:
    """A ``score_mod`` returning ``cap * tanh(score / cap)``.

    The same formula as attention's ``softcap=`` option, as a value that
    composes with other mods; it sees the score after ``scale``.

    Parameters
    ----------
    cap : float
        Positive bound (Gemma 2 uses 50).

    Returns
    -------
    callable
        The ``score_mod``; it also serves torch's ``flex_attention``.

    Examples
    --------
    >>> import numpy as np
    >>> from portattn import mods
    >>> mods.softcap(5.0)(np.asarray([0.0, 5.0, 500.0]), None, None, None, None)
    array([0.        , 3.80797078, 5.        ])
    """
    c = check_real("cap", cap, above=0.0)
    # Captured as text, read back in the mod: torch 2.15's dynamo turns a
    # captured float whose value changes between calls into a SymFloat, which
    # flex_attention's higher-order op refuses; a str is guarded by value.
    text = repr(c)

    def softcap_score(score: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        xp = array_namespace(score)
        bound = float(text)
        return bound * xp.tanh(score / bound)

    softcap_score.__qualname__ = f"softcap({c:g})"
    return softcap_score
