"""The variant of attention a call asks for: one validated description that every path reads.

Besides ``query``, ``key``, ``value`` and ``scale``, a call may ask for a
mask, a bias, padding lengths, causal or windowed positions and soft-capped
scores. The public entries gather them once into one :class:`Variant`
(:func:`build_variant`, the only function besides the public signatures that
lists the options); :func:`~portattn._core._prepare.prepare` checks its
arrays against the call's shapes and lays them out for the paths. The paths,
the dask pair tasks and the autodiff adapters ask the variant (or the
problem holding it) questions (:attr:`Variant.positions_only`,
:meth:`Variant.memo_key`, :meth:`Variant.grad_arrays`, ...) rather than
listing keywords. A new option is a new field here (and, if it is an array,
a line in :data:`Variant.ARRAYS`), its keyword on the public functions and in
:func:`build_variant`, and the code that gives it meaning.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .._lib._checks import check_finite_scale
from .._lib._typing import Array
from ._flex import Mods, flex_mods
from ._masks import Align, Structure, normalize_causal, normalize_window

__all__ = [
    "OPTIONS",
    "SINK",
    "ArraySpec",
    "Variant",
    "build_variant",
    "no_array_or_mod",
    "variant_from",
]


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """What an array option must be, and which axes it spans."""

    kind: Literal["bool", "floating", "lengths"]
    # "scores": (..., Lq|1, Lk|1), like the score matrix; "batch": the batch axes only.
    layout: Literal["scores", "batch"]


@dataclass(frozen=True, slots=True)
class Variant:
    """Every option of a call but ``scale``, validated; after ``prepare``, laid out for the paths.

    Arrays hold their ``prepare``d layout: ``mask`` and ``bias`` have the
    batch axes plus (Lq|1, Lk|1), ``bias`` in the compute dtype; lengths
    have the batch axes, as int32 or int64.
    """

    mask: Array | None = None  # True where a query may attend
    bias: Array | None = None  # added to the (soft-capped) scores
    key_lengths: Array | None = None  # keys at positions >= this are padding
    query_lengths: Array | None = None  # query rows at positions >= this output 0
    causal: bool | Align = False
    window: tuple[int, int] | None = None
    softcap: float | None = None  # scores become tanh(s / softcap) * softcap
    sinks: Array | None = None  # one logit of value 0 per (batch, head) row set, batch axes
    mods: Mods | None = None  # score_mod and the block mask (programmable attention)
    # As the caller gave them, until prepare checks them against the call's
    # shapes and turns them into ``mods`` (then both are None).
    score_mod: Any = None
    block_mask: Any = None
    # Not an option: True only where the caller has proved that every query
    # row sees at least one key, whatever the arrays' values (the fused varlen
    # call, from its offsets: _varlen.run_fused). The native path then skips
    # its search for empty rows (an ``any`` over the mask and a ``where``).
    rows_see_keys: bool = False

    #: The array fields, in the order their checks run (and errors are found).
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {
        "mask": ArraySpec("bool", "scores"),
        "bias": ArraySpec("floating", "scores"),
        "key_lengths": ArraySpec("lengths", "batch"),
        "query_lengths": ArraySpec("lengths", "batch"),
        "sinks": ArraySpec("floating", "batch"),
    }

    @property
    def positions_only(self) -> bool:
        """Whether positions (``causal``, ``window``) alone hide pairs or move scores off ``q·kᵀ``.

        No mask, bias, lengths or mods: every row then sees the keys its
        positions leave it, with finite scores (``softcap`` and ``sinks``
        change neither).
        """
        return (
            self.mods is None
            and self.mask is None
            and self.bias is None
            and self.key_lengths is None
            and self.query_lengths is None
        )

    @property
    def may_hide(self) -> bool:
        """Whether a score can be ``-inf`` before any mask: a bias or a score_mod can make one."""
        mods = self.mods
        return self.bias is not None or (mods is not None and mods.score_mod is not None)

    def mask_shapes(self, lq: int, lk: int) -> list[tuple[int, ...]]:
        """The shapes of the arrays that hide pairs or add to scores, against (..., Lq, Lk).

        What a kernel taking one dense mask (or masked bias) must combine:
        ``mask``, ``bias`` and the lengths as a row and a column.
        """
        shapes: list[tuple[int, ...]] = []
        for x in (self.mask, self.bias):
            if x is not None:
                shapes.append(tuple(x.shape))
        if self.key_lengths is not None:
            shapes.append((*self.key_lengths.shape, 1, lk))
        if self.query_lengths is not None:
            shapes.append((*self.query_lengths.shape, lq, 1))
        return shapes

    def grad_arrays(self) -> list[Array]:
        """The arrays present that have a gradient (the floating ones), in :data:`ARRAYS` order."""
        return [x for name, x in self.arrays() if self.ARRAYS[name].kind == "floating"]

    def memo_key(self) -> tuple[object, ...] | None:
        """The options as a dict key, or ``None`` when one is an array or a mod.

        ``prepare``'s checks of a call depend on nothing else than these and
        the inputs' dtypes and shapes, so a repeat call may skip them.
        """
        if self.mods is not None or self.score_mod is not None or self.block_mask is not None:
            return None
        for x in _arrays_of(self):
            if x is not None:
                return None
        return _scalars_of(self)

    def without_flex(self) -> Variant:
        """This variant without the ``score_mod`` and ``block_mask`` it was asked for."""
        return dataclasses.replace(self, score_mod=None, block_mask=None)

    def without_positions(self) -> Variant:
        """This variant without what reads the rows' positions: positions and the mods asked for.

        A shard's part where positions are global (context parallelism): the
        caller applies :meth:`structure` and :meth:`flex` to the whole sequence.
        """
        return dataclasses.replace(self, causal=False, window=None, score_mod=None, block_mask=None)

    def without_sink(self) -> Variant:
        """This variant without its sink logits: a part over some of the keys, merged later.

        A sink is one more logit per row, so only one of the parts merged by
        log-sum-exp may count it (dask's pair tasks, context parallelism's pairs).
        """
        return self if self.sinks is None else self.with_arrays([(SINK, None)])

    def structure(self, lq: int, lk: int) -> Structure:
        """What ``causal`` and ``window`` leave visible of ``lq`` queries by ``lk`` keys."""
        return Structure.build(lq, lk, self.causal, self.window)

    def flex(self, *, batch: tuple[int, ...], lq: int, lk: int) -> Mods | None:
        """The ``score_mod`` and ``block_mask`` asked for, checked against a (B, H, lq, lk) call."""
        return flex_mods(self.score_mod, self.block_mask, batch=batch, lq=lq, lk=lk)

    def for_heads(self, h0: int, h1: int, heads: int) -> Variant:
        """This variant for query heads ``[h0, h1)`` of ``heads``: per-head arrays cut to them.

        An array option in the ``"batch"`` layout whose last axis has
        ``heads`` entries holds one per head; one of size 1 serves every head.
        """
        cut = [
            (name, x[..., h0:h1])
            for name, x in self.arrays()
            if self.ARRAYS[name].layout == "batch" and x.ndim and x.shape[-1] == heads
        ]
        return self.with_arrays(cut) if cut else self

    def kernel_lacks(self) -> tuple[str, str] | None:
        """What a fused SDPA kernel cannot do of this variant, as ``(what, why)``; else ``None``.

        The first option asked for that torch's and JAX's kernels have no
        argument for, in words for ``impl='native'``'s refusal.
        """
        mods = self.mods
        if mods is not None and mods.score_mod is not None:
            return "run a score_mod", "takes no function of the scores"
        if self.sinks is not None:
            return "add attention sinks", "has no sink logit"
        if self.softcap is not None:
            return "soft-cap scores", "has no softcap"
        return None

    def arrays(self) -> list[tuple[str, Array]]:
        """The array options present, as ``(field name, array)`` in :data:`ARRAYS` order."""
        present = []
        for name in self.ARRAYS:  # a plain loop: every call with an array option runs it
            x = getattr(self, name)
            if x is not None:
                present.append((name, x))
        return present

    def with_arrays(self, arrays: Iterable[tuple[str, Array | None]]) -> Variant:
        """This variant with the array fields named in ``arrays`` replaced."""
        # Not dataclasses.replace: it inspects the fields on every call, and
        # every call with an array option comes through here.
        values: dict[str, Any] = {name: getattr(self, name) for name in _FIELDS}
        values.update(arrays)
        return Variant(**values)

    def without_arrays(self) -> Variant:
        """The static part: what a task or a saved frame keeps beside the arrays it is handed."""
        return self.with_arrays((name, None) for name in self.ARRAYS)

    def from_offset(self, q0: int, k0: int) -> Variant:
        """The variant of the tile whose queries start at ``q0`` and keys at ``k0``.

        Lengths count from the start of the whole sequences; a tile counts
        positions from its own start.
        """
        kl, ql = self.key_lengths, self.query_lengths
        return self.with_arrays(
            [
                ("key_lengths", None if kl is None else kl - k0),
                ("query_lengths", None if ql is None else ql - q0),
            ]
        )


_FIELDS = tuple(f.name for f in dataclasses.fields(Variant))
#: The options' keywords, as the public signatures and :func:`build_variant` spell them.
OPTIONS = tuple(name for name in _FIELDS if name not in ("mods", "rows_see_keys"))
#: The array field that is one more logit per row (gpt-oss's attention sinks).
SINK = "sinks"
# The options that are neither arrays nor mods: plain values, a memo key's parts.
_FLEX = ("mods", "score_mod", "block_mask")
_SCALARS = tuple(name for name in _FIELDS if name not in Variant.ARRAYS and name not in _FLEX)
# One C call each: every small NumPy call asks for its memo key.
_arrays_of = operator.attrgetter(*Variant.ARRAYS)
_scalars_of = operator.attrgetter(*_SCALARS)
# The variants without arrays, mods or a soft cap, by (causal, window): most calls.
_PLAIN: dict[tuple[object, object], Variant] = {}


def no_array_or_mod(
    mask: object,
    bias: object,
    key_lengths: object,
    query_lengths: object,
    softcap: object,
    score_mod: object,
    block_mask: object,
    sinks: object,
    /,
) -> bool:
    """Whether every option but the positions (``causal``, ``window``) is left out.

    :func:`build_variant` then takes its memoised plain variant, and the
    public entry (with the positions left out too) its bare-call shortcut.
    """
    return (
        mask is None
        and bias is None
        and key_lengths is None
        and query_lengths is None
        and softcap is None
        and score_mod is None
        and block_mask is None
        and sinks is None
    )


def build_variant(
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: object = False,
    window: object = None,
    key_lengths: Array | None = None,
    query_lengths: Array | None = None,
    softcap: object = None,
    score_mod: object = None,
    block_mask: object = None,
    sinks: Array | None = None,
) -> Variant:
    """The options of one call as a :class:`Variant`: the one place that lists them.

    Every entry (``attention``, ``attention_weights``, the varlen and paged
    entries, the layers) builds its variant here, once, and hands it to
    :func:`~portattn._attention.attend`. The options that need no shape are
    checked here (``causal``, ``window``, ``softcap``); the arrays and the
    mods are checked against the call by ``prepare``.
    """
    # The defaults need no call: a small call feels each.
    aligned = False if causal is False else normalize_causal(causal)
    sizes = None if window is None else normalize_window(window)
    plain = no_array_or_mod(
        mask, bias, key_lengths, query_lengths, softcap, score_mod, block_mask, sinks
    )
    if plain:  # built once per (causal, window): a small call feels a dataclass's __init__
        variant = _PLAIN.get((aligned, sizes))
        if variant is None:
            if len(_PLAIN) >= 256:  # windows are ints: keep the memo bounded
                _PLAIN.clear()
            variant = _PLAIN[aligned, sizes] = Variant(causal=aligned, window=sizes)
        return variant
    cap = None if softcap is None else _check_softcap(softcap)
    # Positional, in field order: keywords cost a small call half a microsecond.
    return Variant(
        mask,
        bias,
        key_lengths,
        query_lengths,
        aligned,
        sizes,
        cap,
        sinks,
        None,
        score_mod,
        block_mask,
    )


def variant_from(arguments: Mapping[str, Any]) -> Variant:
    """:func:`build_variant` on the options among a public entry's ``arguments``, by name.

    An entry passes its ``locals()`` (no name of its own may be an option's),
    so that its signature is the one place it lists the options it takes:
    one added to the signature reaches the variant with no other line.
    """
    return build_variant(**{name: arguments[name] for name in OPTIONS if name in arguments})


def _check_softcap(softcap: object) -> float:
    value = check_finite_scale(softcap, name="softcap")
    if value <= 0:
        msg = f"expected softcap to be a positive finite number or None, got {value}"
        raise ValueError(msg)
    return value
