"""T5's relative position bias: a learned table indexed by log-spaced distance buckets."""

from __future__ import annotations

import math

import numpy as np

from .._core._modspec import ScoreMod, sized
from .._lib._checks import check_flag, check_int
from .._lib._compat import array_namespace, device_of
from .._lib._typing import Array
from ._captured import captured, too_short

__all__ = ["t5_buckets", "t5_relative_bias"]


def t5_buckets(
    relative: np.ndarray, /, *, num_buckets: int, max_distance: int, bidirectional: bool
) -> np.ndarray:
    """T5's bucket of each relative position ``key - query`` (Raffel et al., 2020), on NumPy.

    Exact below ``num_buckets // 2`` (halved again when bidirectional, the
    sign taking the other half), logarithmic up to ``max_distance``, one
    bucket beyond. Computed in float32 as T5 does, so buckets match its own.
    """
    rel = np.asarray(relative, dtype=np.int64)
    n = num_buckets
    out = np.zeros(rel.shape, dtype=np.int64)
    if bidirectional:
        n //= 2
        out += (rel > 0) * n
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = n // 2
    # Below `exact` the ratio is never read: log(1) there, so no flag is raised
    # and no np.errstate is needed (torch.compile cannot trace one).
    ratio = np.log(np.maximum(rel, exact).astype(np.float32) / np.float32(exact))
    scaled = ratio / np.float32(math.log(max_distance / exact)) * np.float32(n - exact)
    large = exact + np.where(rel < exact, 0, scaled).astype(np.int64)
    return out + np.where(rel < exact, rel, np.minimum(large, n - 1))


def _clip(x: Array, bound: int) -> Array:
    """``x`` clipped to ``[-bound, bound]``.

    The array's own ``clip`` where it has one (NumPy, torch, JAX): torch's
    ``flex_attention`` traces a mod with dynamo even in eager mode, and
    array-api-compat's ``clip`` for torch tests its bounds with ``math.isnan``,
    which dynamo refuses.
    """
    own = getattr(x, "clip", None)
    if own is not None:
        return own(-bound, bound)
    return array_namespace(x).clip(x, min=-bound, max=bound)


def t5_relative_bias(
    table: Array, /, *, bidirectional: bool = True, max_distance: int = 128
) -> ScoreMod:
    """A ``score_mod`` adding ``table[bucket(j - i), h]``, T5's relative attention bias.

    The bucket of every distance up to ``max_distance`` is worked out once and
    captured as an integer array beside the table (every distance beyond shares
    the last bucket), so the mod is two gathers: it also serves torch's
    ``flex_attention``, and a learnable ``table`` receives its gradient.

    Parameters
    ----------
    table : array
        Real floating ``(num_buckets, H)`` array, as T5's
        ``relative_attention_bias.weight``. A call with another number of
        heads is refused before any score is formed.
    bidirectional : bool, default True
        True for T5's encoder (the sign of the distance picks half the
        buckets), False for its decoder.
    max_distance : int, default 128
        Distance from which every pair shares the last bucket; it must
        exceed the number of exact buckets (``num_buckets // 4`` when
        bidirectional, ``// 2`` otherwise).

    Returns
    -------
    callable
        The ``score_mod``.

    Examples
    --------
    >>> import numpy as np
    >>> from portattn import mods
    >>> table = np.arange(32.0)[:, None]  # bucket number as the bias, one head
    >>> mod = mods.t5_relative_bias(table)
    >>> q = np.zeros((1, 1, 1, 1), dtype=np.int64)
    >>> kv = np.array([0, 1, 7, 8, 20, 500]).reshape(1, 1, 1, 6)
    >>> mod(np.zeros((1, 1, 1, 6)), None, np.zeros((1, 1, 1, 1), dtype=np.int64), q, kv).ravel()
    array([ 0., 17., 23., 24., 26., 31.])
    """
    weight, _ = captured("table", table, kind="real floating", ranks=(2,))
    two_way = check_flag("bidirectional", bidirectional)
    far = check_int("max_distance", max_distance, minimum=1)
    n = int(weight.shape[0])
    least = 4 if two_way else 2
    # At max_distance == the exact buckets the log-spaced ones would divide by log(1) = 0.
    if n < least or far <= n // (2 if two_way else 1) // 2:
        msg = (
            f"expected table to have at least {least} buckets (rows) and max_distance to reach "
            f"past the exact buckets, got {n} buckets and max_distance={far}"
        )
        raise ValueError(msg)
    steps = np.arange(-far, far + 1)
    host = t5_buckets(steps, num_buckets=n, max_distance=far, bidirectional=two_way)
    wxp = array_namespace(weight)
    buckets = wxp.asarray(host, device=device_of(weight))

    def t5_bias(score: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        step = _clip(kv_idx - q_idx, far) + far
        return score + weight[buckets[step], h]

    def check(nb: int, nh: int, lq: int, lk: int) -> None:
        if weight.shape[1] != nh:
            too_short(
                "mods.t5_relative_bias",
                "table",
                weight.shape[1],
                f"one column per query head, H={nh}",
            )

    return sized(t5_bias, check)
