"""Block masks: which tiles of the score matrix a ``mask_mod`` leaves empty, full or partial.

Built once from a ``mask_mod`` and reused across calls and layers, as
FlexAttention's ``BlockMask`` is: attention paths skip empty tiles without
touching their keys, and skip the mod on full ones. The record is a small
host NumPy ``int8`` array, one entry per (batch, head, query block, key
block); the mod itself is kept to build partial tiles exactly.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from .._lib._checks import check_int, shown
from .._lib._compat import is_concrete, is_dask_namespace, namespace_library, resolve_namespace
from .._lib._convert import to_numpy
from .._lib._typing import Array, Device, Namespace
from .._lib._vocabulary import check_mod_arity
from ._modspec import MaskMod, apply_mask_mod, check_libraries, check_sizes, tile_indices

__all__ = ["EMPTY", "FULL", "PARTIAL", "BlockMask", "create_block_mask"]

EMPTY, PARTIAL, FULL = 0, 1, 2

# Booleans evaluated at once; the mod's own temporaries are a few times this.
_BUDGET = 1 << 22


class BlockMask:
    """Which (query block, key block) tiles a ``mask_mod`` leaves empty, full or partial.

    Build one with :func:`create_block_mask`; pass it as ``block_mask=`` to
    attention. It is immutable and may be shared across calls and layers.

    Attributes
    ----------
    mask_mod : callable
        The ``mask_mod`` it was built from; attention applies it on partial tiles.
    shape : tuple of int
        ``(B, H, q_len, kv_len)``; a ``B`` or ``H`` of 1 (given as ``None``)
        broadcasts over the inputs' batch or heads.
    block_size : tuple of int
        ``(query block, key block)`` sizes. The last block along an axis may be shorter.
    kinds : numpy.ndarray
        Read-only ``int8`` array of shape ``(B, H, query blocks, key blocks)``
        holding ``BlockMask.EMPTY`` (0), ``BlockMask.PARTIAL`` (1) or
        ``BlockMask.FULL`` (2).
    """

    EMPTY: ClassVar[int] = EMPTY
    PARTIAL: ClassVar[int] = PARTIAL
    FULL: ClassVar[int] = FULL

    kinds: np.ndarray
    mask_mod: MaskMod
    shape: tuple[int, int, int, int]
    block_size: tuple[int, int]
    _merged: np.ndarray
    _key_blocks: tuple[tuple[int, ...], ...]
    _table: tuple[tuple[int, ...], ...]
    _parts: tuple[tuple[int, int, int, int, tuple[tuple[int, ...], ...]], ...]

    def __init__(
        self,
        kinds: np.ndarray,
        /,
        *,
        mask_mod: MaskMod,
        shape: tuple[int, int, int, int],
        block_size: tuple[int, int],
    ) -> None:
        if not callable(mask_mod):
            msg = f"expected mask_mod to be a callable (b, h, q_idx, kv_idx), got {shown(mask_mod)}"
            raise TypeError(msg)
        bq, bk = _check_block_size(block_size)
        shape = _check_shape(shape)
        want = (shape[0], shape[1], -(-shape[2] // bq), -(-shape[3] // bk))
        if not isinstance(kinds, np.ndarray) or kinds.shape != want or kinds.dtype != np.int8:
            got = f"{kinds.dtype} {kinds.shape}" if isinstance(kinds, np.ndarray) else shown(kinds)
            msg = f"expected kinds to be an int8 array of shape {want}, got {got}"
            raise ValueError(msg)
        odd = np.setdiff1d(kinds, (EMPTY, PARTIAL, FULL))
        if odd.size:
            msg = (
                f"expected kinds to hold EMPTY ({EMPTY}), PARTIAL ({PARTIAL}) or FULL ({FULL}) "
                f"only, got {odd.tolist()}"
            )
            raise ValueError(msg)
        kinds = kinds.copy()
        kinds.flags.writeable = False
        # Set once, here: every attribute below is derived from these four.
        setattr_ = object.__setattr__
        setattr_(self, "kinds", kinds)
        setattr_(self, "mask_mod", mask_mod)
        setattr_(self, "shape", shape)
        setattr_(self, "block_size", (bq, bk))
        # Over batch and heads: empty only if empty for all, full only if full for all.
        every_empty = np.all(kinds == EMPTY, axis=(0, 1))
        every_full = np.all(kinds == FULL, axis=(0, 1))
        merged = np.where(every_full, FULL, np.where(every_empty, EMPTY, PARTIAL)).astype(np.int8)
        merged.flags.writeable = False
        setattr_(self, "_merged", merged)
        setattr_(
            self, "_key_blocks", tuple(tuple(int(j) for j in np.flatnonzero(r)) for r in merged)
        )
        # Plain ints, so attention reads a tile's kind without touching NumPy:
        # torch.compile would turn a NumPy read into a traced tensor op.
        setattr_(self, "_table", _plain(merged))
        setattr_(self, "_parts", _parts(kinds, merged))

    def __setattr__(self, name: str, value: object) -> None:
        # Half-applied changes (a new mask_mod that full tiles skip, a
        # block_size the kinds were not built for) are refused outright.
        msg = (
            f"BlockMask is immutable: cannot set {name!r} (expected it to stay as built, "
            "got an assignment); build a new one with create_block_mask"
        )
        raise AttributeError(msg)

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt through the constructor: the kinds come back read-only and checked.
        args = (np.array(self.kinds), self.mask_mod, self.shape, self.block_size)
        return (_rebuilt, args)

    @property
    def table(self) -> tuple[tuple[int, ...], ...]:
        """The kinds reduced over batch and heads (as :meth:`tile_kind` without ``b``, ``h``).

        Nested tuples of plain ints, one row per query block: what the
        attention paths read per tile, built once with the mask.
        """
        return self._table

    @property
    def parts(self) -> tuple[tuple[int, int, int, int, tuple[tuple[int, ...], ...]], ...]:
        """Ranges of (batch, head) that share one tile table, where splitting a call pays.

        ``(b0, b1, h0, h1, table)`` per range, in the mask's own axes (a
        ``B`` or ``H`` of 1 spans the inputs' whole axis); empty when the
        kinds are the same for every batch entry and head, or when running
        the ranges apart would visit less than a tenth fewer tiles than
        :attr:`table` does for all of them (packed documents that differ per
        batch entry are the case it is for).
        """
        return self._parts

    @property
    def num_blocks(self) -> tuple[int, int]:
        """``(query blocks, key blocks)``."""
        return int(self.kinds.shape[2]), int(self.kinds.shape[3])

    def _at(self, b: int | None, h: int | None) -> np.ndarray:
        if b is None and h is None:
            return np.asarray(self._merged)
        if b is None or h is None:
            msg = f"expected b and h both given or both None, got b={b!r}, h={h!r}"
            raise ValueError(msg)
        bb = 0 if self.shape[0] == 1 else b
        hh = 0 if self.shape[1] == 1 else h
        return np.asarray(self.kinds[bb, hh])

    def tile_kind(self, qi: int, kj: int, /, *, b: int | None = None, h: int | None = None) -> int:
        """The kind of tile (query block ``qi``, key block ``kj``).

        With ``b`` and ``h`` it is that batch entry's and head's; without, it
        is reduced over all of them: EMPTY only if empty for every one, FULL
        only if full for every one, PARTIAL otherwise.
        """
        return int(self._at(b, h)[qi, kj])

    def key_blocks(
        self, qi: int, /, *, b: int | None = None, h: int | None = None
    ) -> tuple[int, ...]:
        """The key blocks query block ``qi`` must visit (not EMPTY), in ascending order."""
        if b is None and h is None:
            return self._key_blocks[qi]
        return tuple(int(j) for j in np.flatnonzero(self._at(b, h)[qi]))

    def query_span(self, qi: int, /) -> range:
        """The query positions of block ``qi``."""
        bq = self.block_size[0]
        return range(qi * bq, min((qi + 1) * bq, self.shape[2]))

    def key_span(self, kj: int, /) -> range:
        """The key positions of block ``kj``."""
        bk = self.block_size[1]
        return range(kj * bk, min((kj + 1) * bk, self.shape[3]))

    @property
    def density(self) -> float:
        """The fraction of (batch, head, query, key) pairs in tiles that are not EMPTY.

        The work a block-sparse path does, relative to the dense call.
        """
        _, _, lq, lk = self.shape
        if lq == 0 or lk == 0:
            return 0.0
        bq, bk = self.block_size
        rows = np.minimum(bq, lq - bq * np.arange(self.num_blocks[0]))
        cols = np.minimum(bk, lk - bk * np.arange(self.num_blocks[1]))
        area = rows[:, None] * cols[None, :]
        visited = float(np.sum((self.kinds != EMPTY) * area))
        return visited / float(self.kinds.shape[0] * self.kinds.shape[1] * lq * lk)

    def to_dense(self) -> np.ndarray:
        """A boolean NumPy array ``(B, H, query blocks, key blocks)``: True where a tile is visited.

        One entry per tile, as FlexAttention's ``BlockMask.to_dense``; for a
        picture that also tells full from partial, read :attr:`kinds`.
        """
        return np.asarray(self.kinds != EMPTY)

    def __repr__(self) -> str:
        counts = np.bincount(self.kinds.ravel(), minlength=3)
        return (
            f"BlockMask(shape={self.shape}, block_size={self.block_size}, "
            f"density={self.density:.3f}, tiles: {counts[FULL]} full, "
            f"{counts[PARTIAL]} partial, {counts[EMPTY]} empty)"
        )


def _rebuilt(
    kinds: np.ndarray,
    mask_mod: MaskMod,
    shape: tuple[int, int, int, int],
    block_size: tuple[int, int],
) -> BlockMask:
    """A pickled :class:`BlockMask`, built again by its constructor."""
    return BlockMask(kinds, mask_mod=mask_mod, shape=shape, block_size=block_size)


def _check_shape(shape: object) -> tuple[int, int, int, int]:
    """``(B, H, q_len, kv_len)``: B and H positive, the lengths non-negative."""
    if not isinstance(shape, tuple) or len(shape) != 4:
        msg = f"expected shape to be a tuple (B, H, q_len, kv_len), got {shown(shape)}"
        raise ValueError(msg)
    return (
        check_int("shape[0] (B)", shape[0], minimum=1),
        check_int("shape[1] (H)", shape[1], minimum=1),
        check_int("shape[2] (q_len)", shape[2], minimum=0),
        check_int("shape[3] (kv_len)", shape[3], minimum=0),
    )


Table = tuple[tuple[int, ...], ...]

# Split a call by (batch, head) ranges only if that visits at most this
# share of the tiles the merged table visits for all of them.
_SPLIT_PAYS = 0.9


def _plain(kinds: np.ndarray) -> Table:
    return tuple(tuple(int(x) for x in row) for row in kinds)


def _runs(slices: list[np.ndarray]) -> list[tuple[int, int]]:
    """``[start, stop)`` of each run of consecutive equal arrays."""
    runs, start = [], 0
    for i in range(1, len(slices) + 1):
        if i == len(slices) or not np.array_equal(slices[i], slices[start]):
            runs.append((start, i))
            start = i
    return runs


def _parts(kinds: np.ndarray, merged: np.ndarray) -> tuple[tuple[int, int, int, int, Table], ...]:
    """:attr:`BlockMask.parts`: runs of batch entries with equal kinds, then runs of heads."""
    nb, nh = kinds.shape[:2]
    if nb * nh == 1:
        return ()
    groups = [
        (b0, b1, h0, h1)
        for b0, b1 in _runs([kinds[b] for b in range(nb)])
        for h0, h1 in _runs([kinds[b0, h] for h in range(nh)])
    ]
    if len(groups) == 1:
        return ()
    apart = sum(
        (b1 - b0) * (h1 - h0) * np.count_nonzero(kinds[b0, h0]) for b0, b1, h0, h1 in groups
    )
    if apart > _SPLIT_PAYS * nb * nh * np.count_nonzero(merged):
        return ()
    return tuple((b0, b1, h0, h1, _plain(kinds[b0, h0])) for b0, b1, h0, h1 in groups)


def _check_extent(name: str, value: object) -> int:
    if value is None:
        return 1
    return check_int(name, value, minimum=1)


def _check_block_size(block_size: object) -> tuple[int, int]:
    if isinstance(block_size, numbers.Integral) and not isinstance(block_size, bool):
        n = check_int("block_size", block_size, minimum=1)
        return n, n
    if isinstance(block_size, tuple) and len(block_size) == 2:
        return (
            check_int("block_size[0]", block_size[0], minimum=1),
            check_int("block_size[1]", block_size[1], minimum=1),
        )
    msg = f"expected block_size to be a positive int or a pair of them, got {shown(block_size)}"
    raise ValueError(msg)


def _pad(m: Array, rows: int, cols: int, value: bool, *, xp: Namespace) -> Array:
    """``m`` grown to (…, rows, cols) with ``value`` (edge blocks shorter than a block)."""
    r, c = m.shape[2], m.shape[3]
    if (r, c) == (rows, cols):
        return m
    out = xp.full((m.shape[0], m.shape[1], rows, cols), value, dtype=xp.bool, device=_device(m))
    if isinstance(out, np.ndarray):
        out[:, :, :r, :c] = m
        return out
    return xp.concat(
        (
            xp.concat((m, out[:, :, :r, c:]), axis=3),
            out[:, :, r:, :],
        ),
        axis=2,
    )


def _device(x: Array) -> Device:
    dev = getattr(x, "device", None)
    return None if callable(dev) else dev


def _tile_kinds(m: Array, bq: int, bk: int, *, xp: Namespace) -> np.ndarray:
    """Kinds of the tiles that the boolean chunk ``m`` (rb, rh, R, C) covers, per block."""
    rb, rh, r, c = m.shape
    nq, nk = -(-r // bq), -(-c // bk)

    def blocks(x: Array) -> Array:
        return xp.reshape(x, (rb, rh, nq, bq, nk, bk))

    # One axis at a time, the contiguous one first: a reduction over a tuple
    # of axes makes torch (through array-api-compat) copy the chunk.
    some = xp.any(xp.any(blocks(_pad(m, nq * bq, nk * bk, False, xp=xp)), axis=5), axis=3)
    every = xp.all(xp.all(blocks(_pad(m, nq * bq, nk * bk, True, xp=xp)), axis=5), axis=3)
    some_np, every_np = to_numpy(some), to_numpy(every)
    return np.where(every_np, FULL, np.where(some_np, PARTIAL, EMPTY)).astype(np.int8)


def create_block_mask(
    mask_mod: MaskMod,
    B: int | None,
    H: int | None,
    q_len: int,
    kv_len: int,
    *,
    block_size: int | tuple[int, int] = 128,
    xp: Namespace | None = None,
    device: Device = None,
) -> BlockMask:
    """Evaluate ``mask_mod`` once over every (query, key) pair and record the kind of each tile.

    Parameters
    ----------
    mask_mod : callable
        ``mask_mod(b, h, q_idx, kv_idx) -> bool array``, True where the query
        may attend. It receives integer arrays of ``xp`` that broadcast to
        (batch, heads, queries, keys) and may return any broadcastable shape.
    B, H : int or None
        Batch size and number of query heads; ``None`` means the mask does
        not depend on it (it is evaluated at 0 and broadcast).
    q_len, kv_len : int
        Numbers of queries and keys.
    block_size : int or (int, int), default 128
        Tile size, or ``(query block, key block)``.
    xp : namespace, optional
        The library the mod computes in (the one its captured arrays come
        from); NumPy by default. A NumPy-built mask serves every library.
    device : optional
        Device of ``xp`` to evaluate the mod on.

    Returns
    -------
    BlockMask
        The tile record, reusable across calls and layers.

    Notes
    -----
    The mod is evaluated in chunks of whole blocks, a few million pairs at a
    time, so memory stays bounded whatever ``q_len`` and ``kv_len`` are. Edge
    blocks shorter than ``block_size`` are FULL when every pair they hold is
    allowed (FlexAttention calls them partial).

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> doc = np.repeat(np.arange(4), 64)  # four packed documents of 64 tokens
    >>> same_doc = lambda b, h, q, kv: doc[q] == doc[kv]
    >>> bm = pa.create_block_mask(same_doc, None, None, 256, 256, block_size=64)
    >>> bm.key_blocks(2)
    (2,)
    >>> bm.tile_kind(2, 2) == pa.BlockMask.FULL, bm.density
    (True, 0.25)
    """
    if not callable(mask_mod):
        msg = (
            "expected mask_mod to be a callable (b, h, q_idx, kv_idx) -> bool array, "
            f"got {shown(mask_mod)}"
        )
        raise TypeError(msg)
    _refuse_a_torch_trace()
    check_mod_arity("mask_mod", mask_mod)
    nb, nh = _check_extent("B", B), _check_extent("H", H)
    lq, lk = check_int("q_len", q_len, minimum=0), check_int("kv_len", kv_len, minimum=0)
    bq, bk = _check_block_size(block_size)
    ns = resolve_namespace(xp)
    if is_dask_namespace(ns):
        msg = (
            "expected xp to be an eager library (a block mask is read on the host), got dask; "
            "pass xp=None (NumPy): that mask serves dask inputs"
        )
        raise ValueError(msg)
    library = namespace_library(ns)
    if library != "other":
        against = f"the library the block mask is built with (xp={library})"
        check_libraries(mask_mod, what="mask_mod", library=library, against=against)
    check_sizes(mask_mod, batch=nb, heads=nh, lq=lq, lk=lk)
    kinds = np.zeros((nb, nh, -(-lq // bq), -(-lk // bk)), dtype=np.int8)
    if lq and lk:
        _fill(kinds, mask_mod, (nb, nh, lq, lk), (bq, bk), xp=ns, device=device)
    return BlockMask(kinds, mask_mod=mask_mod, shape=(nb, nh, lq, lk), block_size=(bq, bk))


def _refuse_a_torch_trace() -> None:
    """Name the remedy under torch.compile, as :func:`_fill` does under a JAX trace.

    Dynamo would stop at the first NumPy read instead, with its own message.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        msg = (
            "expected create_block_mask to run outside torch.compile: it reads the mask's "
            "values on the host, got a call while dynamo traces; build the block mask once, "
            "outside the compiled function, and pass it in"
        )
        raise ValueError(msg)


def _fill(
    kinds: np.ndarray,
    mask_mod: Callable[..., Array],
    shape: tuple[int, int, int, int],
    block: tuple[int, int],
    *,
    xp: Namespace,
    device: Device,
) -> None:
    """Evaluate the mod chunk by chunk of whole blocks and write each chunk's tile kinds."""
    nb, nh, lq, lk = shape
    bq, bk = block
    batch, heads = range(nb), range(nh)
    probe = apply_mask_mod(
        mask_mod, tile_indices(batch, heads, range(1), range(1), xp=xp, device=device), xp=xp
    )
    if not is_concrete(probe):
        msg = (
            "expected create_block_mask to run on concrete arrays: it reads the mask's "
            f"values on the host, got a traced or lazy {type(probe).__name__} from mask_mod "
            f"{getattr(mask_mod, '__name__', type(mask_mod).__name__)} (under jax.jit, "
            "jax.vmap or torch.compile); build the block mask once, outside the traced "
            "function, and pass it in"
        )
        raise ValueError(msg)
    lead = int(probe.shape[0]) * int(probe.shape[1])  # 1 when the mod ignores b and h
    cols = min(-(-lk // bk), max(1, _BUDGET // (lead * bq * bk))) * bk
    rows = min(-(-lq // bq), max(1, _BUDGET // (lead * cols * bq))) * bq
    for q0 in range(0, lq, rows):
        for k0 in range(0, lk, cols):
            qs, ks = range(q0, min(q0 + rows, lq)), range(k0, min(k0 + cols, lk))
            idx = tile_indices(batch, heads, qs, ks, xp=xp, device=device)
            m = apply_mask_mod(mask_mod, idx, xp=xp)
            m = xp.broadcast_to(m, (m.shape[0], m.shape[1], len(qs), len(ks)))
            part = _tile_kinds(m, bq, bk, xp=xp)
            kinds[
                :, :, q0 // bq : q0 // bq + part.shape[2], k0 // bk : k0 // bk + part.shape[3]
            ] = part
