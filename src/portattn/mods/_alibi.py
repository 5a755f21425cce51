"""ALiBi (Press et al., 2022): a per-head linear penalty on distance, instead of positions."""

from __future__ import annotations

import math

import numpy as np

from .._core._modspec import ScoreMod, sized
from .._lib._checks import check_int
from .._lib._compat import resolve_namespace
from .._lib._typing import Array, Device, DType, Namespace
from ._captured import captured, too_short

__all__ = ["alibi", "alibi_slopes"]


def _geometric(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(
    num_heads: int,
    /,
    *,
    xp: Namespace | None = None,
    device: Device = None,
    dtype: DType = None,
) -> Array:
    """The paper's slopes: ``2**(-8/H)``, its powers, interleaved when ``H`` is not a power of 2.

    Parameters
    ----------
    num_heads : int
        Number of (query) heads ``H``.
    xp : namespace, optional
        Library of the result; NumPy by default.
    device : optional
        Device of the result.
    dtype : dtype, optional
        Floating dtype of the result; float32 by default.

    Returns
    -------
    array
        Shape ``(H,)``: the slope of each head, largest first.

    Examples
    --------
    >>> from portattn import mods
    >>> mods.alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    n = check_int("num_heads", num_heads, minimum=1)
    base = 2 ** math.floor(math.log2(n))
    slopes = _geometric(base) + _geometric(2 * base)[0::2][: n - base]
    ns = resolve_namespace(xp)
    out = ns.asarray(np.asarray(slopes, dtype=np.float64), device=device)
    return ns.astype(out, ns.float32 if dtype is None else dtype)


def alibi(slopes: Array, /) -> ScoreMod:
    """A ``score_mod`` subtracting ``slopes[h] * |i - j|`` from the score of query ``i``, key ``j``.

    Causal ALiBi is this with a causal mask; bidirectional encoders use the
    symmetric distance as it stands. The slopes are captured, not copied: a
    learnable array (a ``requires_grad`` tensor, a traced JAX value) receives
    its gradient through attention.

    Parameters
    ----------
    slopes : array
        Real floating array of shape ``(H,)``, one slope per query head
        (:func:`alibi_slopes` gives the paper's), in the library the
        attention computes in. A call with another number of heads is
        refused before any score is formed.

    Returns
    -------
    callable
        The ``score_mod``: ``score - slopes[h] * |q_idx - kv_idx|``, the
        distance cast to the score's dtype (it also serves torch's
        ``flex_attention``).

    Examples
    --------
    >>> import numpy as np
    >>> from portattn import mods
    >>> mod = mods.alibi(mods.alibi_slopes(2))
    >>> q = np.arange(3).reshape(1, 1, 3, 1)
    >>> kv = np.arange(3).reshape(1, 1, 1, 3)
    >>> h = np.arange(2).reshape(1, 2, 1, 1)
    >>> mod(np.zeros((1, 2, 3, 3)), None, h, q, kv)[0, 0]
    array([[ 0.    , -0.0625, -0.125 ],
           [-0.0625,  0.    , -0.0625],
           [-0.125 , -0.0625,  0.    ]])
    """
    per_head, xp = captured("slopes", slopes, kind="real floating", ranks=(1,))

    def alibi_bias(score: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        # Cast the distance, not the product: NumPy would widen float32 * int64 to float64.
        distance = xp.astype(abs(q_idx - kv_idx), score.dtype)
        return score - per_head[h] * distance

    def check(nb: int, nh: int, lq: int, lk: int) -> None:
        if per_head.shape[0] != nh:
            too_short("mods.alibi", "slopes", per_head.shape[0], f"one per query head, H={nh}")

    return sized(alibi_bias, check)
