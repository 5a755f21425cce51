"""A paged key/value cache, as inference servers keep one (vLLM, FlashInfer).

Keys and values live in a pool of fixed-size pages, ``(num_pages, page_size,
Hkv, d)``; each sequence owns a list of pages (its row of the block table)
and a length. Sequences of any length share one pool without padding, a
finished sequence gives its pages back, and a forked sequence (beam search,
parallel sampling, a shared system prompt) shares its parent's pages
instead of copying them: a page is written only by its single owner, and a
shared page that must change is copied first (copy-on-write).
:func:`~portattn.paged_attention` reads the pages.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable, Sequence

from .._lib._checks import check_array, check_dtype, check_int, dtype_name
from .._lib._compat import array_namespace, device_of, is_writeable_array, resolve_namespace
from .._lib._typing import Array, Device, DType, Namespace

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Keys and values of many sequences in a shared pool of pages, with a block table each.

    Parameters
    ----------
    num_pages, page_size : int
        The pool: ``num_pages`` pages of ``page_size`` tokens each.
    kv_heads, head_dim : int
        Key/value heads and their width.
    xp : namespace or module, optional
        Array library; ``None`` means NumPy.
    dtype : dtype, optional
        Real floating dtype of the pages; default float32.
    device : optional
        Device in ``xp``'s terms.
    value_dim : int, optional
        Width of the values; default ``head_dim``.

    Attributes
    ----------
    k_pages, v_pages : array, shape (num_pages, page_size, kv_heads, head_dim / value_dim)
        The pool, as :func:`~portattn.paged_attention` takes it.

    Notes
    -----
    Every check of :meth:`append` runs before anything is written: when the
    pool has too few free pages, it raises ``ValueError`` and the block
    tables, the free list and every page are left bit-identical. On JAX
    the pages are replaced by updated arrays (JAX arrays are immutable);
    elsewhere they are written in place.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> cache = pa.PagedKVCache(8, 4, 1, 2)
    >>> cache.add("a")
    >>> cache.add("b")
    >>> kv = np.ones((7, 1, 2), dtype=np.float32)  # 5 tokens for "a", 2 for "b"
    >>> cache.append(["a", "b"], kv, kv, cu_seqlens=[0, 5, 7])
    >>> cache.block_table(["a", "b"]).tolist(), cache.seq_lens(["a", "b"]).tolist()
    ([[0, 1], [2, 0]], [5, 2])
    >>> cache.fork("a", "c")  # shares both of a's pages
    >>> cache.free_pages
    5
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        /,
        *,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
        value_dim: int | None = None,
    ) -> None:
        self.num_pages = check_int("num_pages", num_pages, minimum=1)
        self.page_size = check_int("page_size", page_size, minimum=1)
        kv_heads = check_int("kv_heads", kv_heads, minimum=1)
        head_dim = check_int("head_dim", head_dim, minimum=1)
        dv = head_dim if value_dim is None else check_int("value_dim", value_dim, minimum=1)
        self._xp = resolve_namespace(xp)
        dtype = self._xp.float32 if dtype is None else check_dtype("dtype", dtype, xp=self._xp)
        shape = (self.num_pages, self.page_size, kv_heads)
        self.k_pages = self._xp.zeros((*shape, head_dim), dtype=dtype, device=device)
        self.v_pages = self._xp.zeros((*shape, dv), dtype=dtype, device=device)
        self.device = device_of(self.k_pages)
        self._free = list(range(self.num_pages - 1, -1, -1))  # pop() hands out page 0 first
        self._refs = [0] * self.num_pages
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_pages={self.num_pages}, page_size={self.page_size}, "
            f"sequences={len(self._tables)}, free_pages={len(self._free)}, "
            f"dtype={dtype_name(self.k_pages.dtype)})"
        )

    @property
    def free_pages(self) -> int:
        """How many pages no sequence owns."""
        return len(self._free)

    def add(self, seq_id: Hashable) -> None:
        """Start an empty sequence ``seq_id`` (it owns no page until something is appended)."""
        with self._lock:
            if seq_id in self._tables:
                msg = f"expected a new seq_id, got {seq_id!r}, which the cache already holds"
                raise ValueError(msg)
            self._tables[seq_id] = []
            self._lengths[seq_id] = 0

    def free(self, seq_id: Hashable) -> None:
        """Drop ``seq_id``; its pages that no other sequence shares return to the free list."""
        with self._lock:
            table = self._table(seq_id)
            for page in reversed(table):
                self._refs[page] -= 1
                if self._refs[page] == 0:
                    self._free.append(page)
            del self._tables[seq_id], self._lengths[seq_id]

    def fork(self, seq_id: Hashable, new_id: Hashable) -> None:
        """Start ``new_id`` as a copy of ``seq_id`` that shares its pages (nothing is copied).

        A shared page is copied only when one of the two appends into it.
        """
        with self._lock:
            table = self._table(seq_id)
            self.add(new_id)
            for page in table:
                self._refs[page] += 1
            self._tables[new_id] = list(table)
            self._lengths[new_id] = self._lengths[seq_id]

    def block_table(self, seq_ids: Sequence[Hashable]) -> Array:
        """The sequences' pages, (S, max_pages) int32, padded with 0 (never read past a length)."""
        with self._lock:
            rows = [self._table(s) for s in seq_ids]
        width = max((len(r) for r in rows), default=0)
        padded = [r + [0] * (width - len(r)) for r in rows]
        return self._xp.reshape(
            self._xp.asarray(padded, dtype=self._xp.int32, device=self.device), (len(rows), width)
        )

    def seq_lens(self, seq_ids: Sequence[Hashable]) -> Array:
        """The sequences' lengths, (S,) int32."""
        with self._lock:
            for s in seq_ids:
                self._table(s)  # an unknown id raises
            lens = [self._lengths[s] for s in seq_ids]
        return self._xp.asarray(lens, dtype=self._xp.int32, device=self.device)

    def append(
        self, seq_ids: Sequence[Hashable], k: Array, v: Array, /, *, cu_seqlens: object
    ) -> None:
        """Store packed keys and values: ``seq_ids[i]`` gets rows ``cu_seqlens[i]:cu_seqlens[i+1]``.

        ``k`` is (T, kv_heads, head_dim) and ``v`` (T, kv_heads, value_dim),
        in the pages' dtype. The inputs are copied, never kept or modified.

        Raises
        ------
        ValueError
            An unknown or repeated sequence, bad ``cu_seqlens``, shapes that
            do not fit, or too few free pages; nothing is written then.
        TypeError
            Arrays from another library or of another dtype.
        """
        from .._varlen import host_offsets  # the entry floor's offset checks

        check_array("k", k)
        check_array("v", v)
        xp = array_namespace(k, v, names=("k", "v"))
        with self._lock:
            self._check_new(xp, k, v)
            starts = host_offsets("cu_seqlens", cu_seqlens, total=k.shape[0])
            ids = list(seq_ids)
            if len(ids) != len(starts) - 1 or len(set(ids)) != len(ids):
                msg = (
                    f"expected one distinct seq_id per sequence of cu_seqlens "
                    f"({len(starts) - 1}), got {ids!r}"
                )
                raise ValueError(msg)
            # Planned in order, each copy counted as done: when a fork and its parent
            # both write to their shared last page, the first copies it and the
            # second keeps it (it is then its only holder), no page is orphaned.
            refs = list(self._refs)
            plans = []
            for s, a, b in zip(ids, starts[:-1], starts[1:], strict=True):
                plans.append(self._plan(s, b - a, refs))
                if plans[-1][1] is not None:
                    refs[plans[-1][1]] -= 1
            need = sum(fresh for fresh, _ in plans)
            if need > len(self._free):
                msg = (
                    f"expected the cache to have {need} free pages for this append, got "
                    f"{len(self._free)} (of {self.num_pages}); nothing was written"
                )
                raise ValueError(msg)
            spans = itertools.pairwise(starts)
            for s, rows, (fresh, copy_from) in zip(ids, spans, plans, strict=True):
                self._write(s, k, v, rows, fresh, copy_from)

    def _table(self, seq_id: Hashable) -> list[int]:
        table = self._tables.get(seq_id)
        if table is None:
            msg = f"expected a seq_id the cache holds, got {seq_id!r}"
            raise ValueError(msg)
        return table

    def _check_new(self, xp: Namespace, k: Array, v: Array) -> None:
        if xp is not self._xp:
            msg = f"expected arrays from {self._xp.__name__} like the cache, got {xp.__name__}"
            raise TypeError(msg)
        for name, x, pages in (("k", k, self.k_pages), ("v", v, self.v_pages)):
            if x.dtype != pages.dtype:
                msg = (
                    f"expected {name} of dtype {dtype_name(pages.dtype)} like the cache, "
                    f"got {dtype_name(x.dtype)}"
                )
                raise TypeError(msg)
            want = tuple(pages.shape[2:])
            if x.ndim != 3 or tuple(x.shape[1:]) != want:
                msg = f"expected {name} of shape (T, {want[0]}, {want[1]}), got {tuple(x.shape)}"
                raise ValueError(msg)
        if k.shape[0] != v.shape[0]:
            msg = f"expected k and v with the same T, got {k.shape[0]} and {v.shape[0]}"
            raise ValueError(msg)

    def _plan(self, seq_id: Hashable, n: int, refs: list[int]) -> tuple[int, int | None]:
        """How many new pages ``n`` tokens need, and a shared last page to copy first."""
        table, length = self._table(seq_id), self._lengths[seq_id]
        used = -(-length // self.page_size)
        pages = -(-(length + n) // self.page_size)
        shared_tail = n > 0 and length % self.page_size != 0 and refs[table[-1]] > 1
        copy_from = table[-1] if shared_tail else None
        return pages - used + (copy_from is not None), copy_from

    def _write(
        self,
        seq_id: Hashable,
        k: Array,
        v: Array,
        rows: tuple[int, int],
        fresh: int,
        copy_from: int | None,
    ) -> None:
        """Take ``fresh`` pages and store ``k[start:end]``, ``v[start:end]`` (checks are done)."""
        table, length = self._tables[seq_id], self._lengths[seq_id]
        new = [self._free.pop() for _ in range(fresh)]
        for page in new:
            self._refs[page] = 1
        if copy_from is not None:  # the shared, partly filled last page: copy it, then write
            own = new.pop(0)
            self._set(own, slice(None), self.k_pages[copy_from, ...], self.v_pages[copy_from, ...])
            self._refs[copy_from] -= 1
            table[-1] = own
        table.extend(new)
        start, end = rows
        pos = 0
        while pos < end - start:
            page, slot = divmod(length + pos, self.page_size)
            m = min(end - start - pos, self.page_size - slot)
            chunk = slice(start + pos, start + pos + m)
            self._set(table[page], slice(slot, slot + m), k[chunk, ...], v[chunk, ...])
            pos += m
        self._lengths[seq_id] = length + end - start

    def _set(self, page: int, slots: slice, k: Array, v: Array) -> None:
        if is_writeable_array(self.k_pages):
            self.k_pages[page, slots, ...] = k
            self.v_pages[page, slots, ...] = v
        else:  # JAX: immutable arrays, functional updates
            self.k_pages = self.k_pages.at[page, slots].set(k)
            self.v_pages = self.v_pages.at[page, slots].set(v)
