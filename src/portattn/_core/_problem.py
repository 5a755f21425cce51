"""A validated attention call, the :class:`Problem` that every path reads.

The materialising, blockwise and native paths all read the same problem
(built by :func:`~portattn._core._prepare.prepare`), so semantics (masking,
alignment, padding, soft-capping, mods, dtypes) are decided in one place and
the paths differ only in how they schedule the arithmetic. A tile's scores
and what hides pairs in it are formed here, once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from .._lib._compat import matrix_transpose
from .._lib._typing import Array, Device, DType, Namespace
from ._flex import FULL, Mods
from ._groups import grouped_matmul, grouped_scores, repeat_kv
from ._masks import Structure, length_mask
from ._variant import Variant

__all__ = ["Problem", "Variant", "empty_result", "empty_scores", "expand"]


@dataclass(slots=True)
class Problem:
    """A validated attention call (never modified after ``prepare``); ``q`` is already scaled.

    Except where ``q_scaled`` is False: the torch entry defers the scale to
    the path, since torch's kernel takes it (``scale=``) without a pass over
    ``q``; every other path reads :meth:`scaled` first.
    """

    q: Array  # (..., Lq, d), compute dtype
    k: Array  # (..., Lk, d); with groups > 1, (..., Hkv, Lk, d) against q's (..., H, Lq, d)
    v: Array  # (..., Lk, dv), like k
    variant: Variant  # every option but the scale, laid out on the batch shape
    structure: Structure  # the positions causal/window allow, resolved for (Lq, Lk)
    batch: tuple[int, ...]
    out_dtype: DType
    device: Device
    scale: float
    # Query heads per key/value head (grouped-query attention, _core/_groups):
    # every product of a query-side array with k or v goes through
    # grouped_matmul (the scores through grouped_scores). The batch shape,
    # and every option, has the query's H.
    groups: int = 1
    q_scaled: bool = True  # False: q is still to be multiplied by scale (see the docstring)

    def scaled(self) -> Problem:
        """This problem with ``q`` multiplied by ``scale`` (itself where it already is)."""
        if self.q_scaled:
            return self
        return dataclasses.replace(self, q=self.q * self.scale, q_scaled=True)

    @property
    def kernel_scale(self) -> float:
        """The scale a fused kernel must apply: 1 where ``q`` is already scaled."""
        return 1.0 if self.q_scaled else self.scale

    @property
    def lq(self) -> int:
        return self.structure.lq

    @property
    def lk(self) -> int:
        return self.structure.lk

    @property
    def dv(self) -> int:
        return self.v.shape[-1]  # type: ignore[no-any-return]

    @property
    def mods(self) -> Mods | None:
        """The score_mod and block mask, if any (batch is then (B, H))."""
        return self.variant.mods

    @property
    def sink(self) -> Array | None:
        """Each row's sink logit (``sinks``), a column against the scores (..., 1, 1), or ``None``.

        One more logit per row, of value 0: the paths fold it into the
        softmax (:func:`~portattn._core._softmax.add_sink`) and never read the option itself.
        """
        sinks = self.variant.sinks
        return None if sinks is None else sinks[..., None, None]

    @property
    def may_hide(self) -> bool:
        """Whether a score can be ``-inf`` before any mask: a bias or a score_mod can make one."""
        return self.variant.may_hide

    @property
    def rows_may_be_empty(self) -> bool:
        """Whether some row may see no key, or a score be ``-inf``: not positions alone at work."""
        return not (self.variant.positions_only and self.structure.every_query_sees_a_key)

    @property
    def kernel_causal(self) -> bool:
        """Plain top-left causal and nothing else hiding pairs: the kernels' own ``is_causal``.

        Never with a block mask: the kernel's ``is_causal`` takes no other
        mask, so the block mask's must be folded into the one it is handed;
        never with a bias (torch refuses ``is_causal`` with ``attn_mask``).
        """
        s = self.structure
        return self.variant.positions_only and s.causal and s.offset == 0 and s.window is None

    def mask_elements(self) -> int:
        """Elements of the one dense mask (or masked bias) that a fused kernel would be handed.

        0 when nothing hides a pair, or the caller's bias alone is handed as it is.
        """
        shapes = self.variant.mask_shapes(self.lq, self.lk)
        if not self.structure.trivial:
            shapes.append((self.lq, self.lk))
        if not shapes or (self.variant.bias is not None and len(shapes) == 1):
            return 0
        ndim = max(len(s) for s in shapes)
        padded = [(1,) * (ndim - len(s)) + s for s in shapes]
        # A plain loop: torch.compile cannot trace math.prod over a generator of
        # zip(..., strict=True), and breaks the graph there.
        elements = 1
        for axis in range(ndim):
            elements *= max(s[axis] for s in padded)
        return elements

    def grad_arrays(self) -> list[Array]:
        """``q``, ``k``, ``v`` and the options that have a gradient (present ones only)."""
        return [self.q, self.k, self.v, *self.variant.grad_arrays()]

    def kind(self, q0: int, q1: int, k0: int, k1: int) -> int:
        """The block mask's EMPTY, PARTIAL or FULL for the tile (FULL without one)."""
        mods = self.variant.mods
        return FULL if mods is None else mods.kind(q0, q1, k0, k1)

    def indices(
        self, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace
    ) -> tuple[Array, Array, Array, Array]:
        """The mods' index arrays ``(b, h, q_idx, kv_idx)`` for the tile, in absolute positions."""
        assert self.variant.mods is not None
        return self.variant.mods.indices(self.batch, q0, q1, k0, k1, xp=xp, device=self.device)

    def allowed(self, q0: int, q1: int, k0: int, k1: int, *, xp: Namespace) -> Array | None:
        """Everything that hides pairs in the tile, combined; ``None`` when nothing does.

        ``mask_mod`` is asked only where the block mask's kinds say PARTIAL:
        a FULL block hides nothing and an EMPTY one hides everything (the
        blockwise path never visits it; a path that takes the whole matrix
        as one tile reads it as all False).
        """
        parts = []
        if not self.structure.tile_is_full(q0, q1, k0, k1):
            parts.append(self.structure.shared_tile(q0, q1, k0, k1, xp=xp, device=self.device))
        va = self.variant
        mods = va.mods
        if mods is not None and mods.table is not None and self.kind(q0, q1, k0, k1) != FULL:
            idx = self.indices(q0, q1, k0, k1, xp=xp)
            block = mods.tile_allowed(idx, q0, q1, k0, k1, xp=xp, device=self.device)
            if block is not None:
                parts.append(block)
        if va.mask is not None:
            parts.append(_tile(va.mask, q0, q1, k0, k1))
        if va.key_lengths is not None:
            kl = length_mask(va.key_lengths, self.lk, k0, k1, xp=xp, device=self.device)
            parts.append(kl[..., None, :])  # (..., 1, k1-k0)
        if va.query_lengths is not None:
            ql = length_mask(va.query_lengths, self.lq, q0, q1, xp=xp, device=self.device)
            parts.append(ql[..., :, None])  # (..., q1-q0, 1)
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = xp.logical_and(out, p)
        return out

    def arrays(self) -> tuple[Array | None, ...]:
        """``q``, ``k``, ``v`` and every array field of the variant (``None`` where absent).

        In one fixed order: what the autodiff adapters hand the library as
        inputs, so that nothing they run closes over an array.
        """
        va = self.variant
        return (self.q, self.k, self.v, *[getattr(va, name) for name in Variant.ARRAYS])

    def with_arrays(self, arrays: tuple[Array | None, ...]) -> Problem:
        """This problem holding ``arrays``, in :meth:`arrays` order, instead of its own."""
        q, k, v, *options = arrays
        variant = self.variant.with_arrays(zip(Variant.ARRAYS, options, strict=True))
        return dataclasses.replace(self, q=q, k=k, v=v, variant=variant)

    def without_arrays(self) -> Problem:
        """The static part, to keep beside the arrays a library's autodiff saves."""
        return self.with_arrays((None,) * (3 + len(Variant.ARRAYS)))

    def part(self, b0: int, b1: int, h0: int, h1: int, mods: Mods, *, xp: Namespace) -> Problem:
        """Batch entries ``[b0, b1)`` and heads ``[h0, h1)`` of a 4-D problem, reading ``mods``.

        Every array keeps the axes it broadcasts along (size 1) and is cut
        along the others; ``mods`` says where the part starts
        (:meth:`Mods.parts`).
        """
        spans = ((b0, b1), (h0, h1))

        def cut(
            x: Array | None, tail: int, spans: tuple[tuple[int, int], ...] = spans
        ) -> Array | None:
            if x is None:
                return None
            lead = x.ndim - tail  # batch axes present, aligned to the right of (B, H)
            index = tuple(
                slice(None) if x.shape[a] == 1 else slice(*spans[2 - lead + a]) for a in range(lead)
            )
            key = (*index, ...)  # a name: a starred subscript needs Python 3.11
            return x[key]

        k, v, groups = self.k, self.v, self.groups
        if groups > 1 and (h0 % groups or h1 % groups):
            # The range splits a group: its query heads get their keys apart.
            k, v = (repeat_kv(x, groups, xp=xp) for x in (k, v))
            groups = 1
        kv_spans = ((b0, b1), (h0 // groups, h1 // groups))
        va = self.variant
        options = [
            (name, cut(x, 2 if spec.layout == "scores" else 0))
            for name, spec in Variant.ARRAYS.items()
            for x in (getattr(va, name),)
        ]
        variant = dataclasses.replace(va.with_arrays(options), mods=mods)
        return dataclasses.replace(
            self,
            q=cut(self.q, 2),
            k=cut(k, 2, kv_spans),
            v=cut(v, 2, kv_spans),
            variant=variant,
            batch=(b1 - b0, h1 - h0),
            groups=groups,
        )

    def bias_tile(self, q0: int, q1: int, k0: int, k1: int) -> Array | None:
        bias = self.variant.bias
        return None if bias is None else _tile(bias, q0, q1, k0, k1)

    def scores(
        self,
        q_block: Array,
        k_t: Array,
        q0: int,
        q1: int,
        k0: int,
        k1: int,
        *,
        xp: Namespace,
        product: Callable[..., Array] = grouped_scores,
    ) -> Array:
        """Scores of the tile ``[q0, q1) x [k0, k1)``: scaled, capped, biased, then ``score_mod``.

        ``q_block`` is ``q[..., q0:q1, :]`` and ``k_t`` the transposed keys
        ``k[..., k0:k1, :]ᵀ``; both are passed in so that callers slice once
        per block rather than once per tile. Hidden pairs are not masked here.
        ``product(q_block, k_t, groups, xp=xp)`` forms the products (the
        invariant path's sums them in a fixed order).
        """
        s = product(q_block, k_t, self.groups, xp=xp)  # (..., q1-q0, k1-k0), scaled
        cap = self.variant.softcap
        if cap is not None:
            s = xp.tanh(s / cap) * cap  # Gemma 2's logit soft-capping
        if self.variant.bias is not None:
            s = s + self.bias_tile(q0, q1, k0, k1)
        mods = self.variant.mods
        if mods is not None and mods.score_mod is not None:
            s = mods.score(s, self.indices(q0, q1, k0, k1, xp=xp), xp=xp)
        return s


def empty_result(p: Problem, *, xp: Namespace) -> tuple[Array, Array]:
    """Nothing to attend to (``Lk == 0``) or nobody asking (``Lq == 0``, an empty batch).

    The output is zeros and the lse ``-inf``, computed from the inputs
    rather than created, so that autograd stays connected and every input
    gets a zero gradient: an empty sum is an exact 0 whatever the arrays hold.
    """
    s = empty_scores(p, xp=xp)  # (..., Lq, Lk), no element
    sv = grouped_matmul(s, p.v, p.groups, xp=xp)
    out = expand(sv, (*p.batch, p.lq, p.dv), xp=xp)  # zeros: sums over Lk == 0 terms
    sinks = p.variant.sinks
    if sinks is not None:  # the sink is the only logit a row has: lse = sink
        lse = expand(xp.sum(s, axis=-1) + sinks[..., None], (*p.batch, p.lq), xp=xp)
        return out, lse
    lse = expand(xp.sum(s, axis=-1) - math.inf, (*p.batch, p.lq), xp=xp)
    return out, lse


def empty_scores(p: Problem, *, xp: Namespace) -> Array:
    """The scores of a problem with no (query, key) pair, connected to ``q``, ``k`` and ``bias``."""
    return p.scores(p.q, matrix_transpose(p.k, xp=xp), 0, p.lq, 0, p.lk, xp=xp)


def expand(x: Array, shape: tuple[int, ...], *, xp: Namespace) -> Array:
    """Broadcast ``x`` to ``shape`` as a fresh, writable array (no-op when it already fits).

    ``astype(copy=True)`` is differentiable on every torch version; whether
    ``asarray(copy=True)`` keeps a tensor's graph changed in torch 2.13.
    """
    if tuple(x.shape) == shape:
        return x
    return xp.astype(xp.broadcast_to(x, shape), x.dtype, copy=True)


def _tile(x: Array, q0: int, q1: int, k0: int, k1: int) -> Array:
    rows = slice(None) if x.shape[-2] == 1 else slice(q0, q1)
    cols = slice(None) if x.shape[-1] == 1 else slice(k0, k1)
    return x[..., rows, cols]
