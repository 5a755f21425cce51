"""A key/value cache for incremental (token-by-token) decoding.

During generation each new token only needs its own query; the keys and
values of earlier tokens never change under a causal mask, so they are kept
here instead of being recomputed. The new queries are the *last* rows of the
sequence, which is why decoding aligns the causal mask bottom-right.
"""

from __future__ import annotations

import numbers
import threading
from typing import NamedTuple

from .._core._masks import Causal
from .._lib._checks import check_array, check_dtype, check_int, dtype_name, shown
from .._lib._compat import array_namespace, device_of, is_writeable_array, resolve_namespace
from .._lib._typing import Array, Device, DType, Namespace

__all__ = ["KVCache", "Staged", "cache_step"]


class Staged(NamedTuple):
    """An append written beyond a cache's length, not yet visible: :meth:`commit` shows it."""

    cache: KVCache
    k_buffer: Array
    v_buffer: Array
    start: int  # the first new token
    end: int

    def commit(self) -> None:
        """Make the append visible: the cache's buffers and length change together."""
        self.cache._commit(self)


# A growing cache starts this large and doubles, so appending n tokens one by
# one copies O(n) elements in total.
_GROWING_START = 16


def _check_batch_shape(batch_shape: object) -> tuple[int, ...]:
    if not isinstance(batch_shape, tuple) or not all(
        isinstance(n, numbers.Integral) and not isinstance(n, bool) and int(n) >= 0
        for n in batch_shape
    ):
        msg = f"expected batch_shape to be a tuple of non-negative ints, got {shown(batch_shape)}"
        raise ValueError(msg)
    return tuple(int(n) for n in batch_shape)


class KVCache:
    """Keys and values of the tokens seen so far, stored as (\\*batch, Hkv, capacity, d_head).

    Two forms: with ``capacity`` the buffers are allocated once and an
    append that would exceed it raises ``ValueError``; with
    ``capacity=None`` the buffers grow (doubling) as needed.

    A cache may be shared between threads: :meth:`append` holds a lock from
    its first check to its last write, so each append stores its tokens
    contiguously and completely, concurrent appends are applied one after
    another (in the order they take the lock), and :attr:`keys`,
    :attr:`values` and :attr:`length` always describe one consistent state.
    The order of tokens from different threads is whatever order they
    arrive in; when it matters, appends must be ordered by the caller.
    A call that raises leaves the cache exactly as it was.

    Parameters
    ----------
    num_kv_heads, d_head : int
        Number of key/value heads and their width.
    batch_shape : tuple of int, optional
        Leading batch dimensions of the keys and values stored.
    capacity : int, optional
        Maximum number of tokens; ``None`` (default) grows without bound.
    xp : namespace or module, optional
        Array library; ``None`` means NumPy.
    dtype : dtype, optional
        Real floating dtype of the stored keys and values; default float32.
    device : optional
        Device in ``xp``'s terms.

    Attributes
    ----------
    length : int
        Number of tokens stored.
    capacity : int or None
        The fixed capacity, or ``None`` for a growing cache.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> cache = pa.KVCache(2, 4, capacity=3, xp=np)
    >>> k = v = np.ones((2, 1, 4), dtype=np.float32)  # (Hkv, new tokens, d_head)
    >>> keys, values = cache.append(k, v)
    >>> keys.shape, cache.length
    ((2, 1, 4), 1)
    """

    def __init__(
        self,
        num_kv_heads: int,
        d_head: int,
        /,
        *,
        batch_shape: tuple[int, ...] = (),
        capacity: int | None = None,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
    ) -> None:
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1)
        self.d_head = check_int("d_head", d_head, minimum=1)
        self.batch_shape = _check_batch_shape(batch_shape)
        self.capacity = None if capacity is None else check_int("capacity", capacity, minimum=0)
        self._xp = resolve_namespace(xp)
        self.dtype = self._xp.float32 if dtype is None else check_dtype("dtype", dtype, xp=self._xp)
        self._lock = threading.RLock()
        self.length = 0
        size = _GROWING_START if self.capacity is None else self.capacity
        self._k = self._empty(size, device)
        self._v = self._empty(size, device)
        self.device = device_of(self._k)
        self.dtype = self._k.dtype  # the array's own dtype object (numpy: a dtype, not a type)

    def _empty(self, size: int, device: Device | None) -> Array:
        shape = (*self.batch_shape, self.num_kv_heads, size, self.d_head)
        return self._xp.zeros(shape, dtype=self.dtype, device=device)

    def __repr__(self) -> str:
        cap = "growing" if self.capacity is None else f"capacity={self.capacity}"
        return (
            f"KVCache(num_kv_heads={self.num_kv_heads}, d_head={self.d_head}, "
            f"batch_shape={self.batch_shape}, length={self.length}, {cap}, "
            f"dtype={dtype_name(self.dtype)})"
        )

    @property
    def keys(self) -> Array:
        """The stored keys, (\\*batch, Hkv, length, d_head)."""
        with self._lock:
            return self._k[..., : self.length, :]

    @property
    def values(self) -> Array:
        """The stored values, (\\*batch, Hkv, length, d_head)."""
        with self._lock:
            return self._v[..., : self.length, :]

    def append(self, keys: Array, values: Array, /) -> tuple[Array, Array]:
        """Store new keys and values (\\*batch, Hkv, n, d_head); return all stored so far.

        Every check runs before anything is written, so a failed append leaves
        the cache unchanged. The inputs are copied, never kept or modified.
        The whole append (checks, growth, writes) is atomic with respect to
        other threads using this cache.

        Returns
        -------
        keys, values : array, shape (\\*batch, Hkv, length, d_head)

        Raises
        ------
        TypeError
            Something other than arrays, arrays from another library, or a
            dtype other than the cache's.
        ValueError
            A shape other than (\\*batch, Hkv, n, d_head), a different device,
            or more tokens than a fixed capacity holds.
        """
        check_array("keys", keys)
        check_array("values", values)
        xp = array_namespace(keys, values)
        with self._lock:
            k_all, v_all, staged = self._stage(keys, values, xp=xp)
            self._commit(staged)
            return k_all, v_all

    @property
    def lock(self) -> threading.RLock:
        """The re-entrant lock every append holds, from its first check to its last write."""
        return self._lock

    def _check(self, keys: Array, values: Array, *, xp: Namespace) -> None:
        """Raise if ``keys``/``values`` cannot be appended (nothing is written)."""
        if xp is not self._xp:
            msg = f"expected arrays from {self._xp.__name__} like the cache, got {xp.__name__}"
            raise TypeError(msg)
        want = (*self.batch_shape, self.num_kv_heads, "n", self.d_head)
        for name, a in (("keys", keys), ("values", values)):
            if a.dtype != self.dtype:
                msg = (
                    f"expected {name} of dtype {dtype_name(self.dtype)} like the cache, "
                    f"got {dtype_name(a.dtype)}"
                )
                raise TypeError(msg)
            shape = tuple(a.shape)
            if len(shape) != len(want) or shape[:-2] != want[:-2] or shape[-1] != self.d_head:
                msg = (
                    f"expected {name} of shape (*batch, Hkv, n, d_head) = {want} to match the "
                    f"cache, got shape {shape}"
                )
                raise ValueError(msg)
            if device_of(a) != self.device:
                msg = f"expected {name} on the cache's device {self.device}, got {device_of(a)}"
                raise ValueError(msg)
        if tuple(keys.shape) != tuple(values.shape):
            msg = (
                f"expected keys and values of one shape, got {tuple(keys.shape)} and "
                f"{tuple(values.shape)}"
            )
            raise ValueError(msg)
        n = int(keys.shape[-2])
        if self.capacity is not None and self.length + n > self.capacity:
            msg = (
                f"KVCache overflow: capacity is {self.capacity} tokens, it holds "
                f"{self.length}, and {n} more were appended; create the cache with a larger "
                "capacity, or capacity=None to let it grow"
            )
            raise ValueError(msg)

    def _stage(self, keys: Array, values: Array, *, xp: Namespace) -> tuple[Array, Array, Staged]:
        """Check new tokens and write them after the stored ones, not yet visible.

        Returns every token as the cache would hold them after the append,
        and the append itself. Until its :meth:`Staged.commit`, :attr:`length`,
        :attr:`keys` and :attr:`values` are unchanged, so a caller can
        validate the rest of its call first and simply drop the staged
        append if that fails. Hold :attr:`lock` from stage to commit.
        """
        with self._lock:
            self._check(keys, values, xp=xp)
            n = int(keys.shape[-2])
            start = self.length
            end = start + n
            k_buf, v_buf = self._k, self._v
            if end > int(k_buf.shape[-2]):
                k_buf, v_buf = self._grown(k_buf, end), self._grown(v_buf, end)
            k_buf = self._write(k_buf, start, keys)  # beyond `length`: invisible until committed
            v_buf = self._write(v_buf, start, values)
            return k_buf[..., :end, :], v_buf[..., :end, :], Staged(self, k_buf, v_buf, start, end)

    def _commit(self, staged: Staged) -> None:
        """Make a :meth:`_stage`-d append visible: buffers and length change together."""
        _, k_buf, v_buf, start, end = staged
        with self._lock:
            if start != self.length:
                msg = (
                    f"a staged append starting at token {start} cannot be committed to a cache "
                    f"now holding {self.length}: hold the cache's lock from stage to commit"
                )
                raise RuntimeError(msg)
            self._k, self._v, self.length = k_buf, v_buf, end

    def _write(self, buffer: Array, start: int, new: Array) -> Array:
        """Put ``new`` at token ``start``: in place, or rebuilt for immutable arrays (JAX)."""
        end = start + int(new.shape[-2])
        if is_writeable_array(buffer):
            buffer[..., start:end, :] = new
            return buffer
        xp = self._xp  # JAX: no item assignment, so splice with concat (O(capacity) per append)
        return xp.concat([buffer[..., :start, :], new, buffer[..., end:, :]], axis=-2)

    def _grown(self, old: Array, needed: int) -> Array:
        """A larger buffer holding ``old``'s stored tokens (``old`` itself is left alone)."""
        size = max(needed, 2 * int(old.shape[-2]))
        return self._write(self._empty(size, self.device), 0, old[..., : self.length, :])

    def clear(self) -> None:
        """Forget every stored token.

        Fresh buffers are allocated, so arrays returned earlier are never
        overwritten by later appends.
        """
        size = _GROWING_START if self.capacity is None else self.capacity
        with self._lock:
            self._k = self._empty(size, self.device)
            self._v = self._empty(size, self.device)
            self.length = 0


def cache_step(
    cache: KVCache, keys: Array, values: Array, *, causal: Causal, xp: Namespace
) -> tuple[Array, Array, Causal, Staged]:
    """Stage a layer's new keys and values (..., Hkv, n, d_head) in ``cache``; attend over all.

    Returns every token's keys and values so far, the causal alignment for
    the new queries (``True`` becomes bottom-right: they are the last rows),
    and the staged append, for the caller to commit once its whole call has
    succeeded, holding ``cache.lock`` throughout.
    """
    k_all, v_all, staged = cache._stage(keys, values, xp=xp)
    return k_all, v_all, "bottom_right" if causal is True else causal, staged
