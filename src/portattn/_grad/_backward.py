"""The backward pass of blockwise attention (FlashAttention-2, Dao 2023), written once.

Given the forward's output ``O`` and log-sum-exp ``lse`` (..., Lq), and the
cotangents ``dO`` of the output and ``dlse`` of the log-sum-exp, every tile
of probabilities is recomputed from the scores, ``P = exp(s - lse)``, and

- ``dV = Pᵀ dO``,
- ``dP = dO Vᵀ``,
- ``dS = P ∘ (dP - D)`` with ``D = rowsum(dO ∘ O) - dlse``
  (``d lse / d s = P``, so the lse's cotangent only shifts ``D``),
- through the soft cap ``t = tanh(s₀ / c) · c``: ``dS₀ = dS ∘ (1 - tanh²(s₀ / c))``,
- ``dQ = dS₀ K`` and ``dK = dS₀ᵀ Q``; the bias gets ``dS``.

The (Lq, Lk) matrices are never formed: key blocks are the outer loop (their
``dK``, ``dV`` accumulate locally) and query blocks the inner one (their
``dQ`` accumulates in a list), so extra memory is O((Lq + Lk) d) plus a few
tiles. Tiles that ``causal``/``window`` hide entirely are skipped, exactly as
the forward skips them (:meth:`~portattn._core._masks.Structure.key_range`), and
tiles that nothing hides build no mask (:meth:`Problem.allowed
<portattn._core._problem.Problem.allowed>`).

``q`` is the problem's ``q``: already multiplied by the scale and in the
compute dtype, so ``dQ`` is the gradient with respect to that ``q``; the
library's autodiff carries it back through ``prepare``'s scale and cast.
Masks and lengths have no gradient. A row that sees nothing (``lse = -inf``)
has ``P = 0`` and contributes exact zeros, never NaN.

Everything here is plain array API code: the adapters in
:mod:`portattn._grad._autodiff` only register it with torch and JAX.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .._core._flex import EMPTY
from .._core._groups import grouped_matmul, grouped_matmul_t
from .._core._problem import Problem, Variant
from .._core._softmax import exp_floor, floored_exp, row_shift, safe_exp
from .._lib._compat import is_concrete
from .._lib._typing import Array, Namespace
from .._paths._blockwise import exp_cannot_underflow, problem_block_sizes, traced_block_sizes

__all__ = ["Grads", "Pullback", "ScoreVjp", "blockwise_backward", "sink_grad", "sum_to"]


@dataclass(slots=True)
class Grads:
    """Gradients shaped like the problem's ``q``, ``k``, ``v`` and ``bias`` (``None`` if absent)."""

    q: Array
    k: Array
    v: Array
    bias: Array | None
    sinks: Array | None = None  # shaped like the variant's sinks (batch axes)
    captures: list[Array] = field(default_factory=list)  # one per array the score_mod captures

    def as_inputs(self) -> tuple[Array | None, ...]:
        """In :meth:`Problem.arrays` order; ``None`` for arrays without one (masks, lengths)."""
        return (self.q, self.k, self.v, *[getattr(self, name, None) for name in Variant.ARRAYS])


#: ``score_vjp(s, idx) -> (score_mod(s, *idx), pullback)``: the library's own
#: vector-Jacobian product of the score_mod on one tile. ``pullback(ds)``
#: returns the cotangent of ``s`` and one of each captured array.
Pullback = Callable[[Array], tuple[Array, list[Array]]]
ScoreVjp = Callable[[Array, tuple[Array, Array, Array, Array]], tuple[Array, Pullback]]


def sum_to(x: Array, shape: tuple[int, ...], *, xp: Namespace) -> Array:
    """Sum ``x`` over the axes that broadcasting added or stretched, so that it has ``shape``."""
    if tuple(x.shape) == shape:
        return x
    lead = x.ndim - len(shape)
    if lead > 0:
        x = xp.sum(x, axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    if axes:
        x = xp.sum(x, axis=axes, keepdims=True)
    return x


def blockwise_backward(
    p: Problem,
    out: Array,
    lse: Array,
    d_out: Array,
    d_lse: Array | None,
    *,
    block_size: tuple[int, int] | None,
    want_bias: bool = True,
    score_vjp: ScoreVjp | None = None,
    xp: Namespace,
) -> Grads:
    """Gradients of ``(out, lse) = blockwise_attention(p)`` for cotangents ``(d_out, d_lse)``.

    ``out`` (..., Lq, dv) and ``lse`` (..., Lq) are the forward's results on
    the full batch shape; ``d_out`` has ``out``'s shape and ``d_lse``
    ``lse``'s (``None`` means zero). ``want_bias=False`` skips the bias's
    gradient, which for a full (Lq, Lk) bias is as large as the bias.
    """
    bq, bk = problem_block_sizes(p, block_size, xp=xp)
    want_bias = want_bias and p.variant.bias is not None
    if p.lq == 0 or p.lk == 0 or math.prod(p.batch) == 0:
        return _zeros(p, want_bias=want_bias, xp=xp)
    if p.mods is not None and p.mods.score_mod is not None and score_vjp is None:
        msg = "a problem with a score_mod needs the library's vjp of it to be differentiated"
        raise NotImplementedError(msg)
    # As in the forward: under a trace the loop unrolls, so blocks grow to
    # bound the program, and only concrete arrays are read for the bound.
    concrete = is_concrete(p.q)
    if not concrete:
        bq, bk = traced_block_sizes(bq, bk, p.lq, p.lk, mods=p.mods)
    shortcut = concrete and exp_cannot_underflow(p, xp=xp)

    # D = rowsum(dO ∘ O) - dlse, and the lse as a column; a row that saw
    # nothing (lse = -inf) is shifted by 0 so that -inf - -inf never happens.
    delta = xp.sum(d_out * out, axis=-1, keepdims=True)  # (..., Lq, 1)
    if d_lse is not None:
        delta = delta - d_lse[..., None]
    lse_col = row_shift(lse, xp=xp)[..., None]  # (..., Lq, 1)
    run = _Sweep(
        p,
        d_out,
        delta,
        lse_col,
        None if shortcut else exp_floor(p.q.dtype, xp=xp),
        bq,
        want_bias,
        score_vjp,
        xp,
    )
    dk_blocks, dv_blocks = [], []
    for kj, k0 in enumerate(range(0, p.lk, bk)):
        dk, dv = run.key_block(kj, k0, min(k0 + bk, p.lk))
        dk_blocks.append(dk)
        dv_blocks.append(dv)
    d_bias = None
    if want_bias:
        d_bias = _assemble_bias(
            p, run.bias_tiles, bq, bk, rows=run.bias_rows, cols=run.bias_cols, xp=xp
        )
    return Grads(
        q=_concat(run.dq(), axis=-2, xp=xp),
        k=_concat(dk_blocks, axis=-2, xp=xp),
        v=_concat(dv_blocks, axis=-2, xp=xp),
        bias=d_bias,
        sinks=_d_sinks(p, delta, lse_col, xp=xp),
        captures=run.captures or [],
    )


def _d_sinks(p: Problem, delta: Array, lse_col: Array, *, xp: Namespace) -> Array | None:
    """The sinks' gradient (``None`` without sinks), from ``D`` and the lse, (..., Lq, 1) each."""
    sinks, col = p.variant.sinks, p.sink
    if sinks is None or col is None:
        return None
    return xp.reshape(sink_grad(col, delta, lse_col, xp=xp), tuple(sinks.shape))


def sink_grad(col: Array, delta: Array, lse_col: Array, *, xp: Namespace) -> Array:
    """The gradient of a sink column ``col`` (..., 1, 1), shaped like it.

    The sink is a logit of value 0: ``dSink = Σ_rows P_sink (0 - D)`` with
    ``P_sink = exp(sink - lse)``; ``delta`` is ``D`` and ``lse_col`` the
    row-shifted lse, (..., Lq, 1) each.
    """
    p_sink = safe_exp(col - lse_col, exp_floor(lse_col.dtype, xp=xp), xp=xp)  # (..., Lq, 1)
    d_rows = xp.sum(-(p_sink * delta), axis=(-2, -1), keepdims=True)  # (..., 1, 1)
    return sum_to(d_rows, tuple(col.shape), xp=xp)


class _Sweep:
    """One backward pass: key blocks outside, query blocks inside; it keeps ``dQ`` and ``dBias``."""

    def __init__(
        self,
        p: Problem,
        d_out: Array,
        delta: Array,
        lse_col: Array,
        floor: float | None,
        bq: int,
        want_bias: bool,
        score_vjp: ScoreVjp | None,
        xp: Namespace,
    ) -> None:
        self.p, self.d_out, self.delta, self.lse_col = p, d_out, delta, lse_col
        self.floor, self.bq, self.want_bias, self.xp = floor, bq, want_bias, xp
        self.score_vjp = score_vjp
        self.captures: list[Array] | None = None  # the mod's captures, summed in loop order
        self.neg_inf = xp.asarray(-math.inf, dtype=p.q.dtype, device=p.device)
        self.q_starts = list(range(0, p.lq, bq))
        self.key_ranges = [p.structure.key_range(q0, min(q0 + bq, p.lq)) for q0 in self.q_starts]
        self.dq_blocks: list[Array | None] = [None] * len(self.q_starts)
        self.bias_tiles: dict[tuple[int, int], Array] = {}
        bias = p.variant.bias
        self.bias_rows = want_bias and bias is not None and bias.shape[-2] != 1
        self.bias_cols = want_bias and bias is not None and bias.shape[-1] != 1

    def key_block(self, kj: int, k0: int, k1: int) -> tuple[Array, Array]:
        """``dK`` and ``dV`` of keys ``[k0, k1)``, adding their share to ``dQ`` and ``dBias``."""
        p, xp = self.p, self.xp
        k_blk = p.k[..., k0:k1, :]  # (..., bk, d)
        k_t = xp.matrix_transpose(k_blk)
        v_t = xp.matrix_transpose(p.v[..., k0:k1, :])  # (..., dv, bk)
        dk_acc = dv_acc = None
        for qi, q0 in enumerate(self.q_starts):
            lo, hi = self.key_ranges[qi]
            if hi <= lo or hi <= k0 or lo >= k1:  # positions hide the whole tile
                continue
            q1 = min(q0 + self.bq, p.lq)
            if p.kind(q0, q1, k0, k1) == EMPTY:  # as in the forward: no score, no key read
                continue
            dk_part, dv_part = self._tile(qi, kj, q0, q1, k0, k1, k_blk, k_t, v_t)
            dv_acc = dv_part if dv_acc is None else dv_acc + dv_part
            dk_acc = dk_part if dk_acc is None else dk_acc + dk_part
        k_shape, dtype = tuple(p.k.shape), p.q.dtype
        if dk_acc is None or dv_acc is None:  # no query sees this key block
            dk_acc = xp.zeros((*k_shape[:-2], k1 - k0, k_shape[-1]), dtype=dtype, device=p.device)
            dv_acc = xp.zeros((*p.v.shape[:-2], k1 - k0, p.dv), dtype=dtype, device=p.device)
        return dk_acc, dv_acc

    def _tile(
        self,
        qi: int,
        kj: int,
        q0: int,
        q1: int,
        k0: int,
        k1: int,
        k_blk: Array,
        k_t: Array,
        v_t: Array,
    ) -> tuple[Array, Array]:
        """``dK`` and ``dV`` of one tile; its ``dQ`` and ``dBias`` go into the running sums."""
        p, xp = self.p, self.xp
        qb = p.q[..., q0:q1, :]  # (..., bq, d)
        g = p.groups  # query heads per key/value head: dK, dV sum over each group
        s = grouped_matmul(qb, k_t, g, xp=xp)  # (..., bq, bk)
        capped = None
        if p.variant.softcap is not None:
            capped = xp.tanh(s / p.variant.softcap)
            s = capped * p.variant.softcap
        bias = p.bias_tile(q0, q1, k0, k1)
        if bias is not None:
            s = s + bias
        pullback = None
        if self.score_vjp is not None:
            s, pullback = self.score_vjp(s, p.indices(q0, q1, k0, k1, xp=xp))
        allowed = p.allowed(q0, q1, k0, k1, xp=xp)
        if allowed is not None:
            s = xp.where(allowed, s, self.neg_inf)
        z = s - self.lse_col[..., q0:q1, :]
        if self.floor is None:
            prob = xp.exp(z)  # P
        else:  # z is a new array, so exp may be computed into it
            prob = floored_exp(z, self.floor, xp=xp, overwrite=True)
        d_out_blk = self.d_out[..., q0:q1, :]  # (..., bq, dv)
        v_shape = (*p.v.shape[:-2], k1 - k0, p.dv)
        dv_part = sum_to(grouped_matmul_t(prob, d_out_blk, g, xp=xp), v_shape, xp=xp)
        d_prob = grouped_matmul(d_out_blk, v_t, g, xp=xp)  # dP (..., bq, bk)
        ds = prob * (d_prob - self.delta[..., q0:q1, :])  # dS = P ∘ (dP - D)
        if pullback is not None:  # back through the score_mod, to the score it was given
            ds, parts = pullback(ds)
            self._add_captures(parts)
        if self.want_bias:
            self._add_bias(ds, qi, kj, q1 - q0, k1 - k0)
        if capped is not None:
            ds = ds * (1.0 - capped * capped)  # d tanh(x) = 1 - tanh(x)²
        q_shape, k_shape = tuple(p.q.shape), tuple(p.k.shape)
        dq_tile = grouped_matmul(ds, k_blk, g, xp=xp)
        dq_part = sum_to(dq_tile, (*q_shape[:-2], q1 - q0, q_shape[-1]), xp=xp)
        prev = self.dq_blocks[qi]
        self.dq_blocks[qi] = dq_part if prev is None else prev + dq_part
        k_tile = (*k_shape[:-2], k1 - k0, k_shape[-1])
        return sum_to(grouped_matmul_t(ds, qb, g, xp=xp), k_tile, xp=xp), dv_part

    def _add_bias(self, ds: Array, qi: int, kj: int, rows: int, cols: int) -> None:
        """Add ``dS`` summed to the bias's tile shape (it may broadcast) to tile ``(qi, kj)``."""
        bias = self.p.variant.bias
        assert bias is not None
        key = (qi if self.bias_rows else 0, kj if self.bias_cols else 0)
        tile_shape = (
            *bias.shape[:-2],
            rows if self.bias_rows else 1,
            cols if self.bias_cols else 1,
        )
        part = sum_to(ds, tile_shape, xp=self.xp)
        self.bias_tiles[key] = part if key not in self.bias_tiles else self.bias_tiles[key] + part

    def _add_captures(self, parts: list[Array]) -> None:
        if self.captures is None:
            self.captures = parts
        else:
            self.captures = [a + b for a, b in zip(self.captures, parts, strict=True)]

    def dq(self) -> list[Array]:
        """``dQ`` per query block; zeros for a block that sees no key."""
        p, q_shape = self.p, tuple(self.p.q.shape)
        parts = []
        for qi, q0 in enumerate(self.q_starts):
            blk = self.dq_blocks[qi]
            if blk is None:
                rows = min(q0 + self.bq, p.lq) - q0
                shape = (*q_shape[:-2], rows, q_shape[-1])
                blk = self.xp.zeros(shape, dtype=p.q.dtype, device=p.device)
            parts.append(blk)
        return parts


def _concat(parts: list[Array], *, axis: int, xp: Namespace) -> Array:
    return parts[0] if len(parts) == 1 else xp.concat(parts, axis=axis)


def _assemble_bias(
    p: Problem,
    tiles: dict[tuple[int, int], Array],
    bq: int,
    bk: int,
    *,
    rows: bool,
    cols: bool,
    xp: Namespace,
) -> Array:
    """The bias's gradient from its tiles; tiles no query saw are zeros."""
    bias = p.variant.bias
    assert bias is not None
    batch = tuple(bias.shape[:-2])
    row_spans = [(q0, min(q0 + bq, p.lq)) for q0 in range(0, p.lq, bq)] if rows else [(0, 1)]
    col_spans = [(k0, min(k0 + bk, p.lk)) for k0 in range(0, p.lk, bk)] if cols else [(0, 1)]
    grid = []
    for qi, (q0, q1) in enumerate(row_spans):
        line = []
        for kj, (k0, k1) in enumerate(col_spans):
            tile = tiles.get((qi, kj))
            if tile is None:
                tile = xp.zeros((*batch, q1 - q0, k1 - k0), dtype=bias.dtype, device=p.device)
            line.append(tile)
        grid.append(_concat(line, axis=-1, xp=xp))
    return _concat(grid, axis=-2, xp=xp)


def _zeros(p: Problem, *, want_bias: bool, xp: Namespace) -> Grads:
    def like(x: Array) -> Array:
        return xp.zeros(tuple(x.shape), dtype=x.dtype, device=p.device)

    bias = p.variant.bias
    return Grads(
        q=like(p.q),
        k=like(p.k),
        v=like(p.v),
        bias=like(bias) if want_bias and bias is not None else None,
        sinks=None if p.variant.sinks is None else like(p.variant.sinks),
    )
