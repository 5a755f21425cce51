"""Attention on a real ``dask.distributed.LocalCluster``: scale, a killed worker, bad input.

Every test here is marked ``cluster``: the default ``nox`` session leaves them
out and CI runs them. One cluster (2 worker processes, 1 thread and 1.5 GiB
each, on 127.0.0.1, no dashboard) is started for the module and shut down
after it, and the last test checks that no process it started is left.
"""

from __future__ import annotations

import math
import multiprocessing.resource_tracker
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import dask.array as da
import distributed
import numpy as np
import psutil
import pytest

import portattn as pa
from portattn.testing import dask_schedule

pytestmark = pytest.mark.cluster

MEMORY_LIMIT = "1.5GiB"
MEMORY_LIMIT_BYTES = int(1.5 * 2**30)
N, D, CHUNK = 65536, 64, 4096


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    # Spawning the workers starts the interpreter's multiprocessing resource
    # tracker if nothing has yet; it is stopped again below.
    tracker = multiprocessing.resource_tracker._resource_tracker
    tracker_was_running = getattr(tracker, "_pid", None) is not None
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        memory_limit=MEMORY_LIMIT,
        host="127.0.0.1",
        dashboard_address=None,
    )
    try:
        with distributed.Client(cluster) as c:
            yield c
    finally:
        cluster.close()
        if not tracker_was_running and hasattr(tracker, "_stop"):
            tracker._stop()
    # Nothing the cluster started may outlive it.
    deadline = time.monotonic() + 30
    while True:
        left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()]
        left = [p for p in left if p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"left running after the cluster closed: {[p.cmdline() for p in left]}"


def _pair_grid(x: Any) -> frozenset[tuple[int, int]]:
    return dask_schedule(x).pairs


def _peak_worker_memory(client: Any) -> int:
    def peak(dask_worker: Any) -> int:
        return int(max(dask_worker.monitor.quantities["memory"], default=0))

    return max(client.run(peak).values())


def _done_tasks(client: Any) -> int:
    def count(dask_scheduler: Any) -> int:
        return sum(ts.state == "memory" for ts in dask_scheduler.tasks.values())

    return int(client.run_on_scheduler(count))


def _rows_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: list[int]) -> np.ndarray:
    """Causal attention of the given rows only, in float64, from the same inputs."""
    out = []
    for r in rows:
        s = (k[: r + 1].astype(np.float64) @ q[r].astype(np.float64)) / math.sqrt(q.shape[-1])
        w = np.exp(s - s.max())
        out.append((w / w.sum()) @ v[: r + 1].astype(np.float64))
    return np.stack(out)


@pytest.mark.slow
def test_n65536_causal_fits_the_workers_and_survives_a_killed_worker(client: Any) -> None:
    # Inputs are generated on the workers (seeded, so a recomputed block is
    # the same block); materialising the scores would take N*N*4 = 16 GiB.
    rng = da.random.default_rng(20261201)
    q, k, v = (
        rng.standard_normal((1, N, D), dtype=np.float32, chunks=(1, CHUNK, D)) for _ in range(3)
    )
    out = pa.attention(q, k, v, causal=True)
    assert out.chunks == q.chunks
    chunks = N // CHUNK
    # One task per visible (query chunk, key chunk) pair: the lower triangle.
    assert len(_pair_grid(out)) == chunks * (chunks + 1) // 2 == 136
    assert len(_pair_grid(pa.attention(q, k, v))) == chunks * chunks == 256

    pids_before = client.run(os.getpid)
    t0 = time.perf_counter()
    future = client.compute(out)
    # Kill one worker process once some work is done but not all of it.
    deadline = time.monotonic() + 300
    while _done_tasks(client) < 20 and not future.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not future.done(), "the computation ended before a worker could be killed"
    peak_before_kill = _peak_worker_memory(client)
    victim = sorted(pids_before.values())[0]
    os.kill(victim, signal.SIGKILL)
    t_kill = time.perf_counter() - t0
    got = future.result(timeout=600)
    print(f"\nkilled a worker after {t_kill:.1f} s; result after {time.perf_counter() - t0:.1f} s")
    pids_after = client.run(os.getpid)
    assert victim not in pids_after.values()  # the nanny started a new worker process

    peak = max(peak_before_kill, _peak_worker_memory(client))
    print(f"peak worker RSS {peak / 2**20:.0f} MiB of {MEMORY_LIMIT}")
    assert peak < MEMORY_LIMIT_BYTES

    # Spot-check rows against NumPy on the same inputs (rows only: O(N d) each).
    rows = [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK + 17, N // 2 + 5, N - 1]
    qn, kn, vn = client.compute([q[0], k[0], v[0]], sync=True)
    np.testing.assert_allclose(got[0, rows], _rows_reference(qn, kn, vn, rows), atol=2e-5)


def test_unknown_chunk_sizes_give_a_clear_error_and_the_fix_works(client: Any) -> None:
    rng = da.random.default_rng(7)
    x = rng.standard_normal((4, 64, 8), chunks=(2, 32, 8))
    keep = x[:, 0, 0] > -100  # all True, but dask cannot know that
    q = x[keep]
    assert math.isnan(q.shape[0])
    with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
        pa.attention(q, x, x)
    q = q.compute_chunk_sizes()
    out = pa.attention(q, x, x, causal=True)
    xn = x.compute()
    np.testing.assert_allclose(out.compute(), pa.attention(xn, xn, xn, causal=True), atol=1e-12)
