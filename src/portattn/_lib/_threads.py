"""Independent tiles of a NumPy call on a small thread pool, BLAS on one thread per worker.

NumPy's matmul already uses every core (through BLAS), but its ufuncs
(``exp``, ``max``, ``sum``, ``where``) run on one, and they are half of an
attention call. NumPy releases the GIL in both, so independent query blocks
can run side by side on threads, each with a one-thread BLAS.

The pool engages only when all of these hold:

- the arrays are NumPy's (eager, never traced or lazy, no autograd; torch
  runs its own intra-op threads);
- the work is large enough to pay for the pool (about 0.3 ms to start);
- ``PORTATTN_NUM_THREADS`` is unset or above 1 (it caps the workers;
  ``PORTATTN_NUM_THREADS=1`` turns the pool off);
- BLAS is allowed more than one thread right now: the workers are never more
  than the BLAS threads in effect, so a caller's
  ``threadpoolctl.threadpool_limits(1)`` (or ``OPENBLAS_NUM_THREADS=1``)
  turns the pool off too, and the process never runs more threads than the
  caller allowed;
- no other portattn call is using the pool: threadpoolctl's limits are
  process-wide, so one call at a time lowers and restores them. A call made
  meanwhile from another thread runs its blocks sequentially instead of
  waiting.
- threadpoolctl is importable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["ENV", "map_blocks", "pool_workers"]

T = TypeVar("T")
R = TypeVar("R")

ENV = "PORTATTN_NUM_THREADS"
# Below this many multiply-adds per call, starting threads costs more than it
# saves: the bench record has the pool 1.5-1.9x slower at 2**24 (B=1, H=8,
# N=128, d=64) and even at 2**28 (N=512).
_MIN_WORK = 1 << 25

_LOCK = threading.Lock()  # one pooled call at a time: BLAS limits are process-wide
_CONTROLLER: list[Any] = []  # the threadpoolctl controller, built on first use (~30 ms)


def _controller() -> Any | None:
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            _CONTROLLER.append(None)
        else:
            _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


def _env_cap() -> int | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        msg = f"expected {ENV} to be a positive integer, got {raw!r}"
        raise ValueError(msg) from None
    if value < 1:
        msg = f"expected {ENV} to be a positive integer, got {value}"
        raise ValueError(msg)
    return value


def pool_workers(blocks: int, work: int) -> int:
    """How many workers a call of ``blocks`` independent blocks and ``work`` multiply-adds gets.

    1 means: run sequentially, as before.
    """
    cap = _env_cap()
    if blocks < 2 or work < _MIN_WORK or cap == 1:
        return 1
    ctl = _controller()
    if ctl is None:
        return 1
    blas: list[int] = [lib.num_threads for lib in ctl.lib_controllers if lib.user_api == "blas"]
    if not blas:
        return 1
    workers = min(min(blas), blocks, os.cpu_count() or 1)
    return workers if cap is None else min(workers, cap)


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    with _controller().limit(limits=1, user_api="blas"):  # type: ignore[union-attr]
        yield


def map_blocks(func: Callable[[T], R], items: Sequence[T], *, workers: int) -> Iterator[R]:
    """``map(func, items)`` in order, on ``workers`` threads with one BLAS thread each."""
    if workers <= 1 or not _LOCK.acquire(blocking=False):
        yield from map(func, items)
        return
    try:
        with _one_blas_thread(), ThreadPoolExecutor(workers, "portattn") as pool:
            yield from pool.map(func, items)
    finally:
        _LOCK.release()
