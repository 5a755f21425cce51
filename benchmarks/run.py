"""CPU benchmarks: portattn on numpy and torch against torch SDPA and plain NumPy.

Run as ``python benchmarks/run.py`` (``nox -s bench``). Every subject at one
size is timed in the same rounds, interleaved, so that load from other
processes hits peers alike; ratios are taken within a run. Writes
``benchmarks/results/cpu.json`` (the record the docs render),
``benchmarks/results/cpu.md`` and two plots.

Options: ``--quick`` (N up to 2048, 3 rounds; for a smoke test, not for the
record), ``--dry-run`` (N=128, one round: a check that the script works, in
seconds), ``--only programmable``, ``--only decode``, ``--only parallel`` or
``--only serving`` (only the cases of ``programmable.py``, ``decode.py``,
``parallel.py`` or ``serving.py``, merged into the existing record; context
parallelism and serving, which a full run writes too, have their own
records: ``parallel.json``, ``serving.json``),
``--out DIR``; ``--help`` lists the rest.

Record schema (``cpu.json``; the Performance page reads it, defensively):

- ``date``, ``machine`` (cpu, cores, versions, ``blas``: threadpoolctl's view
  of each BLAS, ``torch_threads``), ``load_before``/``load_after``
  (``os.getloadavg()``), ``config`` (shapes, sizes, and the thread pool's
  tile and threshold: :func:`pool_facts`), ``skipped`` (sentences);
- ``throughput``: rows ``{subject, library, impl, kind, setting, n, causal,
  runs, median_s, min_s, gflops, vs_sdpa, load}``; ``subject`` is the label,
  the four fields after it say what it is (``core.Subject``): torch SDPA and
  the plain NumPy formula (``kind`` ``"reference"``), portattn on numpy and
  torch per impl, and portattn numpy blockwise with ``setting`` ``"no pool"``
  (``PORTATTN_NUM_THREADS=1``: the thread pool off);
- ``threads``: ``{workers, rows: [{n, causal, pool_s, no_pool_s, speedup,
  default_pools}]}``; below ``_threads._MIN_WORK`` the default call runs
  without the pool, and ``pool_s`` is ``"portattn numpy blockwise, pool
  forced"`` (``default_pools`` false);
- ``training`` (torch, forward + backward against a fixed cotangent): rows
  ``{subject, library, impl, kind, setting, n, causal, runs, median_s,
  vs_sdpa, peak_bytes, io_bytes, peak_over_io, load}``: ``median_s`` is the
  median over rounds of each fresh process's best of two steps;
  ``peak_bytes`` is the resident high-water mark of one step above the
  inputs (see :func:`training`);
- ``memory``: rows ``{subject, library, impl, kind, setting, n, peak_bytes,
  inputs_plus_output_bytes, ratio}``;
- ``chapter``: ``{shape, loops, median_us, peers, ratio_to_plain,
  stages_us}``: each call's time over its hand-written peer's (``peers``: a
  causal call's peer writes the mask in);
- ``profile``: per-pass time of one blockwise tile, per library (see
  :func:`tile_profile`);
- ``programmable``: block masks and score mods against FlexAttention and
  portattn's dense calls (schema in ``programmable.py``);
- ``decode``: decode steps, grouped-query attention, prefill and training
  with GQA against SDPA (``enable_gqa``), NumPy and ``jax.jit`` (schema in
  ``decode.py``).

The method, the machine and the row fields are ``core.py``'s, shared with
``gpu.py``. Peak memory is measured with tracemalloc (NumPy reports its
allocations to it) in a fresh subprocess per point (``children.py``), so
nothing cached by an earlier call counts. The inputs are allocated before
tracing starts: the peak is the extra memory the call needs, output included.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import core
import numpy as np
from core import B, D, H, Subject, gflop, load, machine, plain, sdpa

HERE = Path(__file__).resolve().parent
SIZES = (128, 512, 2048, 8192)
MEMORY_SIZES = (128, 512, 2048, 8192, 16384)
# Materialising (N, N) scores for 8 heads at N=8192 takes 2 GiB per temporary
# and several seconds per call; the point of the blockwise path is not to.
MATERIALIZE_MAX_N = 2048
MATERIALIZE_MEMORY_MAX_N = 4096


def plain_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """The textbook formula, materialising the scores; the baseline to beat."""
    s = q @ np.swapaxes(k, -1, -2)  # (B, H, N, N)
    s *= 1.0 / np.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = np.where(np.tri(n, dtype=bool), s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s @ v


def subjects(
    n: int, causal: bool, materialize_max_n: int = MATERIALIZE_MAX_N
) -> dict[Subject, Callable[[], Any]]:
    import torch

    import portattn as pa

    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    kernel = torch.nn.functional.scaled_dot_product_attention
    out: dict[Subject, Callable[[], Any]] = {
        sdpa(): lambda: kernel(tq, tk, tv, is_causal=causal),
    }
    impls = [
        i
        for i in ("auto", "blockwise", "materialize")
        if i != "materialize" or n <= materialize_max_n
    ]
    for impl in impls:
        out[Subject("torch", impl)] = lambda impl=impl: pa.attention(
            tq, tk, tv, causal=causal, impl=impl
        )
    out[Subject("torch", "native")] = lambda: pa.attention(tq, tk, tv, causal=causal, impl="native")
    if n <= materialize_max_n:
        out[plain("numpy")] = lambda: plain_numpy(q, k, v, causal)
    for impl in impls:
        out[Subject("numpy", impl)] = lambda impl=impl: pa.attention(
            q, k, v, causal=causal, impl=impl
        )

    def no_pool() -> Any:
        os.environ[POOL_ENV] = "1"
        try:
            return pa.attention(q, k, v, causal=causal, impl="blockwise")
        finally:
            del os.environ[POOL_ENV]

    out[NO_POOL] = no_pool

    from portattn._lib import _threads

    if B * H * n * n * 2 * D < _threads._MIN_WORK:
        # Below the threshold the default call runs without the pool; this
        # subject forces it on, so the record shows what the threshold avoids.
        def forced_pool() -> Any:
            saved, _threads._MIN_WORK = _threads._MIN_WORK, 0
            try:
                return pa.attention(q, k, v, causal=causal, impl="blockwise")
            finally:
                _threads._MIN_WORK = saved

        out[FORCED_POOL] = forced_pool
    return out


POOL_ENV = "PORTATTN_NUM_THREADS"
NO_POOL = Subject("numpy", "blockwise", setting="no pool")
FORCED_POOL = Subject("numpy", "blockwise", setting="pool forced")
TRAINING_SIZES = (2048, 8192)
TRAINING_SUBJECTS = (sdpa(), Subject("torch", "blockwise"), Subject("torch", "auto"))


def _child(*args: object) -> list[str]:
    """Run ``children.py`` with ``args`` in a fresh process; its one line of output, split."""
    res = subprocess.run(
        [sys.executable, str(HERE / "children.py"), *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.split()


def training(sizes: tuple[int, ...], rounds: int, steps: int = 2) -> dict[str, Any]:
    """Forward + backward of ``out`` against a fixed cotangent, torch CPU, float32.

    Each (N, causal, subject) runs in a fresh process per round, and the
    subjects alternate within a round so that load hits them alike. A
    process times ``steps`` steps and keeps the best (the first also pays
    for first-touch memory). Peak memory is the resident-set high-water mark
    of the first step (``VmHWM``, reset through ``/proc/self/clear_refs``)
    minus the resident set once the inputs and the cotangent exist: the
    extra memory of one forward + backward, output and gradients included
    (tracemalloc does not see torch's allocator). ``io_bytes`` is q, k, v,
    out and their four gradients.
    """
    rows: list[dict[str, Any]] = []
    for n in sizes:
        for causal in (False, True):
            got: dict[Subject, list[tuple[float, int, int]]] = {s: [] for s in TRAINING_SUBJECTS}
            for _ in range(rounds):
                for s in TRAINING_SUBJECTS:
                    t, peak, io = _child("training", n, s.impl, int(causal), steps)
                    got[s].append((float(t), int(peak), int(io)))
            base = statistics.median(t for t, _, _ in got[sdpa()])
            for s, pts in got.items():
                med = statistics.median(t for t, _, _ in pts)
                peak = max(p for _, p, _ in pts)
                io = pts[0][2]
                rows.append(
                    {
                        **s.fields(),
                        "n": n,
                        "causal": causal,
                        "runs": len(pts),
                        "median_s": med,
                        "vs_sdpa": base / med,
                        "peak_bytes": peak,
                        "io_bytes": io,
                        "peak_over_io": peak / io,
                        "load": load(),
                    }
                )
                print(
                    f"train N={n:5d} causal={causal!s:5} {s.label:28s} {med * 1e3:9.1f} ms "
                    f"x{base / med:.2f} peak {peak / 2**20:8.1f} MiB = {peak / io:.2f}x io"
                )
    return {"backward": "O(N) blockwise backward (FlashAttention-2)", "rows": rows}


def pool_facts() -> dict[str, int]:
    """What the NumPy thread pool is built on, as this run's portattn sets it.

    ``numpy_tile_elements``: the score-tile size of the blockwise path's
    default blocks on NumPy (each pool worker holds one); ``pool_min_work``:
    the multiply-adds below which a call never uses the pool.
    """
    from portattn._lib import _threads
    from portattn._paths import _blockwise

    return {
        "numpy_tile_elements": _blockwise._DEFAULTS["numpy"][1],
        "pool_min_work": _threads._MIN_WORK,
    }


def threads_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the NumPy pool gains: blockwise with it against blockwise without it, same run."""
    from portattn._lib._threads import pool_workers

    out = []
    for n, causal in dict.fromkeys((r["n"], r["causal"]) for r in rows):
        group = {r["subject"]: r for r in rows if r["n"] == n and r["causal"] == causal}
        default_pools = FORCED_POOL.label not in group
        pooled = group.get(
            Subject("numpy", "blockwise").label if default_pools else FORCED_POOL.label
        )
        if NO_POOL.label in group and pooled is not None:
            on, off = pooled["median_s"], group[NO_POOL.label]["median_s"]
            out.append(
                {
                    "n": n,
                    "causal": causal,
                    "pool_s": on,
                    "no_pool_s": off,
                    "speedup": off / on,
                    "default_pools": default_pools,
                }
            )
    return {"workers": pool_workers(1 << 10, 1 << 40), "rows": out}


def _median_time(f: Callable[[], Any], reps: int = 20) -> float:
    """The median of ``reps`` single calls: thread wake-ups are not charged to one pass."""
    return statistics.median(core.wall_time(f) for _ in range(reps))


def _tile_passes(lib: str, qb: Any, kt: Any, vb: Any) -> dict[str, Callable[[], Any]]:
    """One tile's passes as ``_blockwise._query_block`` runs them on ``lib``, to be timed alone.

    NumPy's row sum rides in the value matmul (``vb`` carries a column of
    ones); torch sums separately (see ``_blockwise._DEFAULTS``).
    """
    import torch

    mod: Any = torch if lib == "torch" else np
    s = qb @ kt
    m = s.max(-1, keepdims=True) if lib == "numpy" else s.amax(-1, keepdim=True)
    z = s - m  # what exp sees: <= 0, and no subnormals (they would slow exp down)
    e = mod.exp(z)
    scratch = s * 1  # the in-place subtraction's own tile: z must stay as it is

    def row_max() -> Any:
        return s.max(-1, keepdims=True) if lib == "numpy" else s.amax(-1, keepdim=True)

    def subtract() -> None:
        scratch.__isub__(m)

    passes: dict[str, Callable[[], Any]] = {
        "scores matmul": lambda: qb @ kt,
        "row max": row_max,
        "subtract (in place)": subtract,
        "exp": lambda: mod.exp(z),
    }
    if lib == "torch":
        passes["row sum"] = lambda: e.sum(-1, keepdim=True)
        passes["value matmul"] = lambda: e @ vb
    else:
        passes["value matmul (+ ones column: row sum)"] = lambda: e @ vb
    return passes


def _whole_call_parts(lib: str, n: int, rounds: int) -> dict[str, float]:
    """Median ms of a whole N x N call, built up: the matmuls alone, plus exp, then portattn.

    The loops run the default tiles of N=2048 one after another with the
    library's own threading (no pool), so the first two rows are a floor for
    any composition of separate array operations: SDPA fuses the softmax
    into its matmul loop and pays for neither the extra passes nor the
    Python between them.
    """
    import torch

    import portattn as pa
    from portattn._lib._compat import array_namespace
    from portattn._paths._blockwise import block_sizes

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    arrays = (tq, tk, tv) if lib == "torch" else (q, k, v)
    aq, ak, av = arrays
    bq, bk = block_sizes(None, xp=array_namespace(aq), batch=(B, H))
    kt = ak.transpose(-1, -2) if lib == "torch" else np.swapaxes(ak, -1, -2)
    exp: Any = torch.exp if lib == "torch" else np.exp

    def matmuls(with_exp: bool) -> Callable[[], None]:
        def run() -> None:
            for q0 in range(0, n, bq):
                qb = aq[..., q0 : q0 + bq, :]
                for k0 in range(0, n, bk):
                    s = qb @ kt[..., k0 : k0 + bk]
                    e = exp(s) if with_exp else s
                    e @ av[..., k0 : k0 + bk, :]

        return run

    funcs = {
        "torch SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv),
        f"{lib}: two matmuls per tile": matmuls(False),
        f"{lib}: two matmuls + exp per tile": matmuls(True),
        f"portattn {lib} blockwise": lambda: pa.attention(*arrays, impl="blockwise"),
    }
    times = time_interleaved(funcs, rounds)
    return {name.split(": ")[-1]: statistics.median(ts) * 1e3 for name, ts in times.items()}


def tile_profile(rounds: int = 5, call_n: int = 2048) -> dict[str, Any]:
    """Where blockwise time goes at N=2048, per library.

    ``median_us``/``share``: each pass of one default tile, timed on its own
    (see :func:`_tile_passes`). torch only (its blockwise call runs its
    tiles one after another, as the build-up does; NumPy's runs them on a
    pool): ``call_ms``, a whole call built up from its matmuls (see
    :func:`_whole_call_parts`), and ``ceiling``, SDPA's time over the
    matmuls-and-exp floor: the best ratio an unfused composition could reach
    on this machine.
    """
    import torch

    from portattn._lib._compat import array_namespace
    from portattn._paths._blockwise import block_sizes

    res: dict[str, Any] = {}
    for lib in ("numpy", "torch"):
        rng = np.random.default_rng(0)
        probe = rng.standard_normal((1, 1, 1, 1), dtype=np.float32)
        xp = array_namespace(torch.from_numpy(probe) if lib == "torch" else probe)
        bq, bk = block_sizes(None, xp=xp, batch=(B, H))
        qb = rng.standard_normal((B, H, bq, D), dtype=np.float32)
        kt = rng.standard_normal((B, H, D, bk), dtype=np.float32)
        vb = rng.standard_normal((B, H, bk, D + (lib == "numpy")), dtype=np.float32)
        if lib == "torch":
            qb, kt, vb = (torch.from_numpy(x) for x in (qb, kt, vb))

        time.sleep(_PAUSE_S)  # the other library's threads stop spinning
        res[lib] = core.profile_passes(
            _tile_passes(lib, qb, kt, vb),
            tile=[B, H, bq, bk],
            rounds=rounds,
            time_pass=_median_time,
        )
        print(f"tile profile {lib}:", {k: f"{v:.0%}" for k, v in res[lib]["share"].items()})
        if lib == "torch":
            # NumPy's call runs its tiles on a pool, which a sequential
            # build-up cannot stand for; torch's runs them one after another.
            call = _whole_call_parts(lib, call_n, rounds)
            res[lib]["call_ms"] = call
            res[lib]["ceiling"] = call["torch SDPA"] / call["two matmuls + exp per tile"]
            print(f"  whole call {lib} (ms):", {k: round(v, 1) for k, v in call.items()})
    return res


def chapter_stages(rounds: int, loops: int = 2000) -> dict[str, float]:
    """Median microseconds of each stage of a 6 x 8 call, run on its own."""
    import portattn as pa
    from portattn._attention import solve
    from portattn._core._prepare import prepare
    from portattn._lib._compat import array_namespace

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((6, 8), dtype=np.float32) for _ in range(3))
    xp = array_namespace(q, k, v)
    p = prepare(q, k, v, xp=xp)
    funcs = {
        "namespace lookup": lambda: array_namespace(q, k, v, None, None, None, None),
        "validation (prepare)": lambda: prepare(q, k, v, xp=xp),
        "path and cast back (solve)": lambda: solve(p, xp=xp),
        "whole call": lambda: pa.attention(q, k, v),
    }
    per_call: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, f in funcs.items():
            t0 = time.perf_counter()
            for _ in range(loops):
                f()
            per_call[name].append((time.perf_counter() - t0) / loops * 1e6)
    return {name: statistics.median(ts) for name, ts in per_call.items()}


# OpenBLAS (numpy) and OpenMP (torch) worker threads keep spinning for a
# while after a call returns (OpenBLAS for about 0.1 s). On 2 cores, a call
# that follows one with other threads competes with them: a torch call after
# a numpy call, and NumPy's pool of one-thread workers after a two-thread
# BLAS call (measured 0.77x SDPA for the first pool subject after plain
# NumPy, 0.96x for the same call one subject later). So every subject starts
# after a pause, makes one untimed call that brings its own threads up, and
# then one timed call: each is timed in its own steady state, as a loop of
# its calls would see it, whatever ran before it.
_PAUSE_S = 0.3


def time_interleaved(funcs: dict[Any, Callable[[], Any]], rounds: int) -> dict[Any, list[float]]:
    """Per round, each subject after a pause: once untimed, then once timed."""
    return core.time_interleaved(funcs, rounds, pause_s=_PAUSE_S, rewarm=True)


# Each call is held to the hand-written formula that computes the same thing:
# a causal call to the formula with the mask written in.
_CHAPTER_PEERS = {
    "plain numpy": "plain numpy",
    "plain numpy causal": "plain numpy",
    "portattn": "plain numpy",
    "portattn causal": "plain numpy causal",
}


def chapter_overhead(rounds: int) -> dict[str, Any]:
    """Per-call time at the chapter's size (6 tokens, d=8): fixed overhead, not FLOPs."""
    import portattn as pa

    n, d = core.CHAPTER_SHAPE
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(3))
    scale = np.float32(1 / np.sqrt(d))

    future = np.triu(np.ones((n, n), dtype=bool), k=1)  # built once, as a user would

    def hand_written() -> np.ndarray:
        s = (q @ k.T) * scale
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ v

    def hand_written_causal() -> np.ndarray:
        s = np.where(future, -np.inf, (q @ k.T) * scale)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ v

    funcs = {
        "plain numpy": hand_written,
        "plain numpy causal": hand_written_causal,
        "portattn": lambda: pa.attention(q, k, v),
        "portattn causal": lambda: pa.attention(q, k, v, causal=True),
    }
    timing = core.per_call(funcs, _CHAPTER_PEERS, rounds=rounds, loops=1000, pause_s=_PAUSE_S)
    return {**timing, "stages_us": chapter_stages(rounds)}


def memory(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Peak extra memory of one NumPy call per impl, each in a fresh process (``children.py``)."""
    rows = []
    for n in sizes:
        for impl in ("blockwise", "materialize"):
            if impl == "materialize" and n > MATERIALIZE_MEMORY_MAX_N:
                continue
            peak, io = map(int, _child("memory", n, impl))
            rows.append(
                {
                    **Subject("numpy", impl).fields(),
                    "n": n,
                    "peak_bytes": peak,
                    "inputs_plus_output_bytes": io,
                    "ratio": peak / io,
                }
            )
            mib = peak / 2**20
            print(f"  memory N={n:5d} {impl:11s} peak {mib:9.1f} MiB = {peak / io:.2f}x io")
    return rows


DASK_SIZES = (2048, 8192)


def _dask_subjects(n: int, causal: bool, workers: int) -> dict[str, Callable[[], Any]]:
    import dask.array as da
    from threadpoolctl import threadpool_limits

    import portattn as pa

    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(3))
    dq, dk, dv = (da.from_array(x, chunks=(B, 1, n, D)) for x in (q, k, v))

    def lazy() -> Any:
        out = pa.attention(dq, dk, dv, causal=causal)  # the graph is built inside the timing
        return out.compute(scheduler="threads", num_workers=workers)

    def lazy_one_blas() -> Any:
        # each task's matmuls on one BLAS thread: no oversubscription of the cores
        with threadpool_limits(limits=1, user_api="blas"):
            return lazy()

    def eager_one_blas() -> Any:
        # the same, unparallelised: the baseline for how the dask rows scale
        with threadpool_limits(limits=1, user_api="blas"):
            return pa.attention(q, k, v, causal=causal)

    return {
        "portattn numpy": lambda: pa.attention(q, k, v, causal=causal),
        "portattn numpy, BLAS 1 thread": eager_one_blas,
        f"dask threads x{workers}, {H} head chunks": lazy,
        f"dask threads x{workers}, {H} head chunks, BLAS 1 thread": lazy_one_blas,
    }


def dask_rows(sizes: tuple[int, ...] = DASK_SIZES, rounds: int = 3) -> dict[str, Any]:
    """NumPy arrays wrapped in dask (threads scheduler, one chunk per head) vs plain portattn.

    Also the scheduling overhead per task: a graph of many tiny chunks,
    timed against the same kernel calls made in a plain loop.
    """
    workers = os.cpu_count() or 1
    rows = []
    for n in sizes:
        for causal in (False, True):
            times = time_interleaved(_dask_subjects(n, causal, workers), rounds)
            base = statistics.median(times["portattn numpy"])
            for row in summarise(times, n, causal):
                row["speedup"] = base / row["median_s"]
                rows.append(row)
                print(
                    f"dask N={n:5d} causal={causal!s:5} {row['subject']:40s} "
                    f"{row['median_s'] * 1e3:9.1f} ms x{row['speedup']:.2f}"
                )
    return {"workers": workers, "throughput": rows, "overhead": _dask_overhead(rounds)}


def _dask_overhead(rounds: int, tasks: int = 512) -> dict[str, Any]:
    """Per-task cost of the dask path: graph building and scheduling, not arithmetic."""
    import dask.array as da
    from threadpoolctl import threadpool_limits

    import portattn as pa

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((tasks, 16, 16), dtype=np.float32) for _ in range(3))
    dq, dk, dv = (da.from_array(x, chunks=(1, 16, 16)) for x in (q, k, v))
    build, run, loop = [], [], []
    # One BLAS thread: idle BLAS threads spinning between tiny calls would be
    # counted as scheduling.
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(rounds):
            t0 = time.perf_counter()
            out = pa.attention(dq, dk, dv)
            t1 = time.perf_counter()
            out.compute(scheduler="threads")
            t2 = time.perf_counter()
            for i in range(tasks):
                pa.attention(q[i : i + 1], k[i : i + 1], v[i : i + 1])
            t3 = time.perf_counter()
            build.append(t1 - t0)
            run.append(t2 - t1)
            loop.append(t3 - t2)
    b, r, lp = (statistics.median(x) for x in (build, run, loop))
    result = {
        "tasks": tasks,
        "chunk_shape": [1, 16, 16],
        "graph_build_us_per_task": b / tasks * 1e6,
        "compute_us_per_task": r / tasks * 1e6,
        "kernel_us_per_call": lp / tasks * 1e6,
        "scheduling_us_per_task": (r - lp) / tasks * 1e6,
    }
    print("dask per-task overhead (us):", {k: round(x, 1) for k, x in result.items() if "us" in k})
    return result


def summarise(
    times: dict[Subject, list[float]] | dict[str, list[float]], n: int, causal: bool
) -> list[dict[str, Any]]:
    """One row per subject: median and best time, GFLOP/s, load; against SDPA where it ran.

    A subject is a :class:`core.Subject` (its fields go into the row) or, for
    the dask record, a label alone.
    """
    rows = []
    for key, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                **(key.fields() if isinstance(key, Subject) else {"subject": key}),
                "n": n,
                "causal": causal,
                "runs": len(ts),
                "median_s": med,
                "min_s": min(ts),
                "gflops": gflop(n, causal) / med,
                "load": load(),
            }
        )
    peer = next((r for r in rows if r["subject"] == sdpa().label), None)
    for r in rows:
        if peer is not None:
            r["vs_sdpa"] = r["gflops"] / peer["gflops"]
    return rows


def markdown(record: dict[str, Any]) -> str:
    lines = [
        f"# portattn CPU benchmarks, {record['date']}",
        "",
        f"{record['machine']['cpu']}, {record['machine']['cores']} cores; "
        f"load average {record['load_before']} before, {record['load_after']} after.",
        "",
        "| N | causal | subject | median ms | GFLOP/s | vs SDPA |",
        "| ---: | :---: | --- | ---: | ---: | ---: |",
    ]
    for r in record["throughput"]:
        lines.append(
            f"| {r['n']} | {'yes' if r['causal'] else 'no'} | {r['subject']} | "
            f"{r['median_s'] * 1e3:.1f} | {r['gflops']:.1f} | {r['vs_sdpa']:.2f} |"
        )
    lines += ["", "| N | subject | peak MiB | x (inputs + output) |"]
    lines += ["| ---: | --- | ---: | ---: |"]
    for r in record["memory"]:
        lines.append(
            f"| {r['n']} | {r['subject']} | {r['peak_bytes'] / 2**20:.1f} | {r['ratio']:.2f} |"
        )
    tr = record.get("training", {}).get("rows", [])
    if tr:
        lines += ["", "| N | causal | forward + backward | median ms | x SDPA | peak MiB |"]
        lines += ["| ---: | :---: | --- | ---: | ---: | ---: |"]
        for r in tr:
            lines.append(
                f"| {r['n']} | {'yes' if r['causal'] else 'no'} | {r['subject']} | "
                f"{r['median_s'] * 1e3:.1f} | {r['vs_sdpa']:.2f} | {r['peak_bytes'] / 2**20:.1f} |"
            )
    ch = record["chapter"]
    lines += ["", "| 6 x 8 | median us | x its hand-written peer | peer |"]
    lines += ["| --- | ---: | ---: | --- |"]
    for name, us in ch["median_us"].items():
        lines.append(
            f"| {name} | {us:.1f} | {ch['ratio_to_plain'][name]:.2f} | {ch['peers'][name]} |"
        )
    return "\n".join(lines) + "\n"


def plots(record: dict[str, Any], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, causal in zip(axes, (False, True), strict=True):
        rows = [r for r in record["throughput"] if r["causal"] == causal]
        for name in dict.fromkeys(r["subject"] for r in rows):
            pts = sorted((r["n"], r["gflops"]) for r in rows if r["subject"] == name)
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="N", title=f"causal={causal}")
    axes[0].set_ylabel("GFLOP/s")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["subject"] for r in record["memory"]):
        mine = [r for r in record["memory"] if r["subject"] == name]
        pts = sorted((r["n"], r["peak_bytes"] / 2**20) for r in mine)
        ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    io = sorted({(r["n"], 2 * r["inputs_plus_output_bytes"] / 2**20) for r in record["memory"]})
    ax.plot(*zip(*io, strict=True), ls="--", color="grey", label="2 x (inputs + output)")
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="peak extra MiB (tracemalloc)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=110)


def only_programmable(out: Path, *, rounds: int, quick: bool) -> None:
    """Only the programmable-attention cases, merged into the record's ``programmable``."""
    import programmable

    name = "cpu-quick" if quick else "cpu"
    path = out / f"{name}.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    record["programmable"] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "load_before": load(),
        **programmable.run(rounds=rounds, quick=quick),
        "load_after": load(),
    }
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"merged the programmable cases into {path}")


def only_decode(out: Path, *, rounds: int, quick: bool) -> None:
    """Only the decode and GQA cases, merged into the record's ``decode``."""
    import decode

    path = out / ("cpu-quick.json" if quick else "cpu.json")
    record = json.loads(path.read_text()) if path.exists() else {}
    record["decode"] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": load(),
        **decode.run(rounds=rounds, quick=quick),
        "load_after": load(),
    }
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"merged the decode cases into {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N <= 2048, 3 rounds (smoke test)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="N=128 (training N=256), one round, no dask: a check that the script works, "
        "not a measurement (writes cpu-dry-run.json)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--max-n", type=int, default=max(SIZES), help="largest N for throughput")
    parser.add_argument(
        "--dask-only",
        action="store_true",
        help="only the dask rows (dask.json); with --quick, one round",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per size (default 7/5)")
    parser.add_argument(
        "--materialize-max-n",
        type=int,
        default=MATERIALIZE_MAX_N,
        help="largest N for materialize and plain numpy (throughput)",
    )
    parser.add_argument("--memory-max-n", type=int, default=max(MEMORY_SIZES))
    parser.add_argument(
        "--only",
        choices=("programmable", "decode", "parallel", "serving"),
        help="run only these cases and merge them into the existing record "
        "(programmable: block masks and score mods against FlexAttention, see programmable.py; "
        "decode: decode steps and grouped-query attention against SDPA, see decode.py; "
        "parallel: context parallelism on gloo processes, parallel.json; see parallel.py; "
        "serving: packed, paged and continuous batching against SDPA, serving.json; see "
        "serving.py)",
    )
    parser.add_argument(
        "--no-dask",
        action="store_true",
        help="leave dask.json as it is (its rows take long on a shared machine)",
    )
    args = parser.parse_args()
    if args.dry_run:
        args.quick, args.no_dask, args.rounds = True, True, 1
        args.max_n = args.memory_max_n = 128
    if args.only == "programmable":
        only_programmable(
            args.out, rounds=args.rounds or (1 if args.dry_run else 5), quick=args.quick
        )
        return
    if args.only == "decode":
        only_decode(args.out, rounds=args.rounds or (1 if args.dry_run else 7), quick=args.quick)
        return
    if args.only == "parallel" or not (args.quick or args.only or args.dask_only):
        import parallel  # its own record, parallel.json: processes of their own

        parallel.run(args.out)
        if args.only:
            return
    if args.only == "serving" or not (args.quick or args.only or args.dask_only):
        import serving  # its own record, serving.json

        serving.run(args.out, rounds=args.rounds or (1 if args.dry_run else 5))
        if args.only:
            return
    # The dask rows go to their own record: a full run writes them too.
    if args.dask_only or not (args.quick or args.no_dask):
        args.out.mkdir(parents=True, exist_ok=True)
        dask_sizes = tuple(n for n in DASK_SIZES if n <= args.max_n)
        dask_record = {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "load_before": load(),
            "config": {"B": B, "H": H, "d": D, "dtype": "float32", "sizes": list(dask_sizes)},
            "skipped": [
                f"N={n}: above --max-n={args.max_n} in this run"
                for n in DASK_SIZES
                if n not in dask_sizes
            ],
            **dask_rows(dask_sizes, rounds=1 if args.quick else 3),
            "load_after": load(),
        }
        (args.out / "dask.json").write_text(json.dumps(dask_record, indent=1) + "\n")
        print(f"wrote {args.out / 'dask.json'}")
        if args.dask_only:
            return
    sizes = tuple(n for n in SIZES if n <= (min(args.max_n, 2048) if args.quick else args.max_n))
    mem_max = min(args.memory_max_n, 2048) if args.quick else args.memory_max_n
    mem_sizes = tuple(n for n in MEMORY_SIZES if n <= mem_max)
    args.out.mkdir(parents=True, exist_ok=True)

    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": load(),
        "config": {
            "B": B,
            "H": H,
            "d": D,
            "dtype": "float32",
            "sizes": list(sizes),
            **pool_facts(),
        },
        "skipped": [
            f"materialize and plain numpy above N={MATERIALIZE_MAX_N} (throughput) and "
            f"materialize above N={MATERIALIZE_MEMORY_MAX_N} (memory): (N, N) scores for "
            "8 heads take 2 GiB per temporary at N=8192, 8.6 GB at N=16384",
        ],
        "throughput": [],
    }
    if args.materialize_max_n < MATERIALIZE_MAX_N:
        record["skipped"].append(
            f"materialize and plain numpy above N={args.materialize_max_n} in this run "
            "(--materialize-max-n): on a loaded machine they take minutes per round"
        )
    if any(n not in mem_sizes for n in MEMORY_SIZES):
        record["skipped"].append(f"memory above N={max(mem_sizes)} in this run (--memory-max-n)")
    if any(n not in sizes for n in SIZES):
        record["skipped"].append(
            f"throughput above N={max(sizes)} in this run (--max-n), to keep it short on a "
            "shared machine"
        )
    for n in sizes:
        for causal in (False, True):
            rounds = 3 if args.quick else (7 if n <= 2048 else 5)
            rounds = args.rounds or rounds
            times = time_interleaved(subjects(n, causal, args.materialize_max_n), rounds)
            rows = summarise(times, n, causal)
            record["throughput"] += rows
            for r in rows:
                print(
                    f"N={n:5d} causal={causal!s:5} {r['subject']:28s} "
                    f"{r['median_s'] * 1e3:9.2f} ms {r['gflops']:7.1f} GFLOP/s x{r['vs_sdpa']:.2f}"
                )
    record["threads"] = threads_summary(record["throughput"])
    # The forced pool is a thread-pool row only: no default call runs it.
    record["throughput"] = [r for r in record["throughput"] if r["subject"] != FORCED_POOL.label]
    train_sizes = tuple(n for n in TRAINING_SIZES if n <= max(args.max_n, 2048))
    if args.dry_run:
        train_sizes = (256,)
    record["training"] = training(train_sizes[:1] if args.quick else train_sizes, args.rounds or 2)
    record["profile"] = tile_profile(args.rounds or 5, call_n=256 if args.dry_run else 2048)
    record["memory"] = memory(mem_sizes)
    record["chapter"] = chapter_overhead(args.rounds or (3 if args.quick else 15))
    print("chapter size:", record["chapter"]["median_us"])
    if not args.dry_run:
        import decode

        record["decode"] = {"date": record["date"], **decode.run(quick=args.quick)}
    record["load_after"] = load()
    name = "cpu-dry-run" if args.dry_run else "cpu-quick" if args.quick else "cpu"
    (args.out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(markdown(record))
    if not args.quick:
        plots(record, args.out)
    print(f"wrote {args.out / (name + '.json')}")


if __name__ == "__main__":
    main()
