"""The variant of attention a call asks for: one validated description that every path reads.

Besides ``query``, ``key``, ``value`` and ``scale``, a call may ask for a
mask, a bias, padding lengths, causal or windowed positions and soft-capped
scores. :func:`~portattn._core._prepare.prepare` gathers them into one
:class:`Variant`, checks it once and lays its arrays out for the paths; the
paths, the dask pair tasks and the autodiff adapters read that value rather
than a list of keywords. A new option is a new field here (and, if it is an
array, a line in :data:`Variant.ARRAYS`), plus its keyword on the public
functions and on ``prepare``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .._lib._typing import Array
from ._flex import Mods
from ._masks import Align

__all__ = ["ArraySpec", "Variant"]


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

    #: The array fields, in the order their checks run (and errors are found).
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {
        "mask": ArraySpec("bool", "scores"),
        "bias": ArraySpec("floating", "scores"),
        "key_lengths": ArraySpec("lengths", "batch"),
        "query_lengths": ArraySpec("lengths", "batch"),
        "sinks": ArraySpec("floating", "batch"),
    }

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
