"""Decode and grouped-query attention: portattn against SDPA (``enable_gqa``) and plain NumPy.

Run by ``python benchmarks/run.py --only decode`` (``nox -s bench -- --only
decode``), which merges the result into ``cpu.json`` under ``"decode"``;
``python benchmarks/decode.py memory H`` is the fresh-process child of the
memory point.

Every ratio is paired: per round each subject of a case runs ``loops`` calls
in turn, and the ratio is the median over rounds of (subject time / peer
time in the same round), so that the load of a shared machine hits both
alike. Every library runs on one thread (torch's, NumPy's BLAS through
threadpoolctl, XLA's through ``XLA_FLAGS``), timed by the process's CPU clock:
on a shared, loaded machine two-thread timings measured the scheduler (an
SDPA decode step of 29 us took 35 ms of wall time at a load of 16 on 2 cores).

Cases, ``(B, H, Hkv, Lq, Lk, d)``, float32:

- ``decode`` (8, 32, 8, 1, 2048, 128), (1, 8, 2, 1, 512, 64) and, without GQA,
  (1, 8, 8, 1, 512, 64): portattn torch ``auto`` against SDPA with
  ``enable_gqa`` (target >= 0.9x, as a speed: SDPA's time over portattn's), and
  portattn NumPy against the hand-written NumPy formula on K/V repeated once,
  outside the timing (target >= 0.9x);
- ``prefill``, causal (1, 32, 8, 2048, 2048, 128), and (1, 32, 32, ...) without
  GQA: torch ``auto`` against SDPA (target >= 0.95x);
- ``chapter`` (1, 8, 8, 16, 16, 64): the per-call cost, torch ``auto`` against
  SDPA (target <= 2.5x in time) and NumPy against hand-written NumPy (<= 1.2x);
- ``training`` (1, 32, 8, 1024, 1024, 64), causal: forward + backward through
  portattn's blockwise path against SDPA with ``enable_gqa`` (recorded);
- ``jax``: the decode rows under ``jax.jit``, portattn against
  ``jax.nn.dot_product_attention`` (recorded);
- ``lq1``: Lq=1 against long caches, per library and impl, for ``auto``'s rule;
- ``memory``: tracemalloc's peak above the inputs of a NumPy (2, 32, 1, 64)
  query over (2, 4, 4096, 64) keys, against G = 8 times that of a (2, 4, 1, 64)
  query over the same keys (target <= 1x).

Record (``cpu.json["decode"]``): ``config``; ``rows``: ``{case, shape, library,
subject, peer, median_s, peer_median_s, speed, ratio, target, met, rounds,
loops}`` (``ratio`` is time over the peer's, ``speed`` its inverse);
``memory``: ``{peak_bytes: {H: bytes}, ratio, target, met}``.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DECODE = ((8, 32, 8, 1, 2048, 128), (1, 8, 2, 1, 512, 64), (1, 8, 8, 1, 512, 64))
PREFILL = ((1, 32, 8, 2048, 2048, 128), (1, 32, 32, 2048, 2048, 128))
CHAPTER = (1, 8, 8, 16, 16, 64)
TRAINING = (1, 32, 8, 1024, 1024, 64)
LQ1 = ((1, 32, 8, 1, 32768, 128), (1, 8, 2, 1, 262144, 64))
MEMORY = ((2, 4, 4096, 64), (32, 4))  # keys, then the two query head counts
THREADS = 1
TARGETS = {  # speed (peer time over subject time) at least, or time ratio at most
    ("decode", "torch"): ("speed", 0.9),
    ("decode", "numpy"): ("speed", 0.9),
    ("prefill", "torch"): ("speed", 0.95),
    ("chapter", "torch"): ("ratio", 2.5),
    ("chapter", "numpy"): ("ratio", 1.2),
    ("memory", "numpy"): ("ratio", 1.0),
}


def inputs(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, ...]:
    b, h, hkv, lq, lk, d = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, lq, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    return q, k, v


def repeated(x: np.ndarray, g: int) -> np.ndarray:
    """K or V with each head repeated ``g`` times, as plain multi-head attention reads them."""
    return np.ascontiguousarray(np.repeat(x, g, axis=1))


def plain_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    """The hand-written formula on (B, H, L, d) arrays: what plain multi-head attention costs."""
    s = q @ np.swapaxes(k, -1, -2)
    s *= np.float32(1.0 / np.sqrt(q.shape[-1]))
    if causal:
        s = np.where(np.tri(s.shape[-2], s.shape[-1], dtype=bool), s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s @ v


def _loops(f: Callable[[], Any], window_s: float) -> int:
    f()
    t0 = time.process_time()
    f()
    one = max(time.process_time() - t0, 1e-7)
    return max(1, min(2000, int(window_s / one)))


def paired(
    funcs: dict[str, Callable[[], Any]], rounds: int, windows: int = 5, window_s: float = 0.005
) -> dict[str, tuple[list[float], int]]:
    """Per subject: its per-call CPU seconds in each round, and the loops per window.

    Per round each subject in turn runs ``windows`` windows of ``loops``
    calls and keeps its best window. The clock is the process's CPU time
    (every library runs on :data:`THREADS` thread), which leaves out the
    time other processes of a shared machine hold the cores; the best of a
    few short windows leaves out most of the rest (cache and frequency
    disturbance from them).
    """
    loops = {name: _loops(f, window_s) for name, f in funcs.items()}
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, f in funcs.items():
            f()
            best = math.inf
            for _ in range(windows):
                t0 = time.process_time()
                for _ in range(loops[name]):
                    f()
                best = min(best, time.process_time() - t0)
            times[name].append(best / loops[name])
    return {name: (times[name], loops[name]) for name in funcs}


def _spread(xs: list[float]) -> list[float]:
    """The quartiles of ``xs``: the noise of a median over rounds."""
    if len(xs) < 2:
        return [xs[0], xs[0]]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return [q[0], q[2]]


def rows(
    case: str,
    shape: tuple[int, ...],
    funcs: dict[str, tuple[str, Callable[[], Any]]],
    peers: dict[str, str],
    rounds: int,
) -> list[dict[str, Any]]:
    """Time ``funcs`` (subject -> (library, call)) in interleaved rounds, each against its peer."""
    timed = paired({name: f for name, (_, f) in funcs.items()}, rounds)
    out = []
    for name, (library, _) in funcs.items():
        ts, loops = timed[name]
        row: dict[str, Any] = {
            "case": case,
            "shape": list(shape),
            "library": library,
            "subject": name,
            "median_s": statistics.median(ts),
            "rounds": rounds,
            "loops": loops,
        }
        peer = peers.get(name)
        if peer is not None:
            ratios = [t / p for t, p in zip(ts, timed[peer][0], strict=True)]
            ratio = statistics.median(ratios)
            target = TARGETS.get((case, library))
            row |= {
                "peer": peer,
                "peer_median_s": statistics.median(timed[peer][0]),
                "ratio": ratio,
                "ratio_quartiles": _spread(ratios),
                "speed": 1.0 / ratio,
            }
            if target is not None:
                kind, value = target
                met = 1.0 / ratio >= value if kind == "speed" else ratio <= value
                row |= {"target": {kind: value}, "met": met}
        out.append(row)
        print(
            f"{case:9s} {shape!s:28s} {name:34s} {row['median_s'] * 1e6:11.1f} us"
            + (
                f"  x{row['ratio']:.2f} [{row['ratio_quartiles'][0]:.2f}, "
                f"{row['ratio_quartiles'][1]:.2f}] of {peer}"
                if peer
                else ""
            )
        )
    return out


def _torch_gqa(shape: tuple[int, ...], causal: bool = False) -> dict[str, Any]:
    import torch

    import portattn as pa

    q, k, v = (torch.from_numpy(x) for x in inputs(shape))
    gqa = shape[1] != shape[2]
    kernel = torch.nn.functional.scaled_dot_product_attention
    return {
        "torch SDPA": (
            "torch",
            lambda: kernel(q, k, v, is_causal=causal, enable_gqa=gqa),
        ),
        "portattn torch auto": ("torch", lambda: pa.attention(q, k, v, causal=causal)),
    }


def _numpy_gqa(shape: tuple[int, ...]) -> dict[str, Any]:
    import portattn as pa

    q, k, v = inputs(shape)
    g = shape[1] // shape[2]
    kr, vr = repeated(k, g), repeated(v, g)  # once, outside the timing
    return {
        "plain numpy": ("numpy", lambda: plain_numpy(q, kr, vr)),
        "portattn numpy auto": ("numpy", lambda: pa.attention(q, k, v)),
    }


def decode(rounds: int) -> list[dict[str, Any]]:
    out = []
    peers = {"portattn torch auto": "torch SDPA", "portattn numpy auto": "plain numpy"}
    for shape in DECODE:
        out += rows("decode", shape, {**_torch_gqa(shape), **_numpy_gqa(shape)}, peers, rounds)
    return out


def prefill(rounds: int) -> list[dict[str, Any]]:
    out = []
    for shape in PREFILL:
        funcs = _torch_gqa(shape, causal=True)
        out += rows("prefill", shape, funcs, {"portattn torch auto": "torch SDPA"}, rounds)
    return out


def chapter(rounds: int) -> list[dict[str, Any]]:
    peers = {"portattn torch auto": "torch SDPA", "portattn numpy auto": "plain numpy"}
    funcs = {**_torch_gqa(CHAPTER), **_numpy_gqa(CHAPTER)}
    return rows("chapter", CHAPTER, funcs, peers, rounds)


def training(rounds: int) -> list[dict[str, Any]]:
    """Forward + backward with GQA: portattn's blockwise path against SDPA with ``enable_gqa``."""
    import torch

    import portattn as pa

    arrays = [torch.from_numpy(x).requires_grad_() for x in inputs(TRAINING)]
    d_out = torch.from_numpy(inputs(TRAINING, seed=1)[0])
    kernel = torch.nn.functional.scaled_dot_product_attention

    def step(call: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            for x in arrays:
                x.grad = None
            call().backward(d_out)

        return run

    q, k, v = arrays
    funcs = {
        "torch SDPA": ("torch", step(lambda: kernel(q, k, v, is_causal=True, enable_gqa=True))),
        "portattn torch blockwise": (
            "torch",
            step(lambda: pa.attention(q, k, v, causal=True, impl="blockwise")),
        ),
    }
    return rows("training", TRAINING, funcs, {"portattn torch blockwise": "torch SDPA"}, rounds)


def jax_rows(rounds: int) -> list[dict[str, Any]]:
    """The decode rows under ``jax.jit``: portattn against ``jax.nn.dot_product_attention``."""
    import jax
    import jax.numpy as jnp

    import portattn as pa

    out = []
    for shape in DECODE:
        q, k, v = (jnp.asarray(x) for x in inputs(shape))
        ref = jax.jit(
            lambda q, k, v: jax.nn.dot_product_attention(
                q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)
            ).swapaxes(1, 2)
        )
        ours = jax.jit(lambda q, k, v: pa.attention(q, k, v))
        funcs = {
            "jax.nn dot_product_attention, jit": (
                "jax",
                lambda ref=ref, q=q, k=k, v=v: ref(q, k, v).block_until_ready(),
            ),
            "portattn jax, jit": (
                "jax",
                lambda ours=ours, q=q, k=k, v=v: ours(q, k, v).block_until_ready(),
            ),
        }
        peers = {"portattn jax, jit": "jax.nn dot_product_attention, jit"}
        out += rows("jax", shape, funcs, peers, rounds)
    return out


def lq1(rounds: int) -> list[dict[str, Any]]:
    """One query against long caches, per library and impl: the facts ``auto``'s rule reads."""
    import torch

    import portattn as pa

    out = []
    kernel = torch.nn.functional.scaled_dot_product_attention
    for shape in LQ1:
        q, k, v = inputs(shape)
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        funcs: dict[str, tuple[str, Callable[[], Any]]] = {
            "torch SDPA": ("torch", lambda t=(tq, tk, tv): kernel(*t, enable_gqa=True))
        }
        peers = {}
        for impl in ("auto", "materialize", "blockwise", "native"):
            name = f"portattn torch {impl}"
            call = lambda impl=impl, t=(tq, tk, tv): pa.attention(*t, impl=impl)  # noqa: E731
            funcs[name], peers[name] = ("torch", call), "torch SDPA"
        for impl in ("auto", "materialize", "blockwise"):
            name = f"portattn numpy {impl}"
            call = lambda impl=impl, a=(q, k, v): pa.attention(*a, impl=impl)  # noqa: E731
            funcs[name], peers[name] = ("numpy", call), "portattn numpy materialize"
        funcs |= _jax_impls(q, k, v, peers)
        out += rows("lq1", shape, funcs, peers, rounds)
    return out


def _jax_impls(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, peers: dict[str, str]
) -> dict[str, tuple[str, Callable[[], Any]]]:
    """portattn's generic paths on JAX under ``jax.jit``, each held to materialize's time."""
    import jax
    import jax.numpy as jnp

    import portattn as pa

    a = tuple(jnp.asarray(x) for x in (q, k, v))
    funcs: dict[str, tuple[str, Callable[[], Any]]] = {}
    for impl in ("materialize", "blockwise"):
        f = jax.jit(lambda q, k, v, impl=impl: pa.attention(q, k, v, impl=impl))
        name = f"portattn jax {impl}, jit"
        funcs[name] = ("jax", lambda f=f: f(*a).block_until_ready())
        peers[name] = "portattn jax materialize, jit"
    return funcs


def memory_child(h: int) -> None:
    """Print tracemalloc's peak (bytes) of one NumPy call with ``h`` query heads."""
    import tracemalloc

    import portattn as pa

    (b, hkv, lk, d), _ = MEMORY
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, h, 1, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    pa.attention(q, k, v)  # imports, caches: not the call's memory
    tracemalloc.start()
    pa.attention(q, k, v)
    print(tracemalloc.get_traced_memory()[1])


def memory() -> dict[str, Any]:
    """Peak extra memory of the GQA query against G times the plain one's (target <= 1x)."""
    keys, heads = MEMORY
    peak = {}
    for h in heads:
        cmd = [sys.executable, str(Path(__file__).resolve()), "memory", str(h)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        peak[h] = int(res.stdout.split()[-1])
    g = heads[0] // keys[1]
    ratio = peak[heads[0]] / (g * peak[heads[1]])
    print(f"memory: peak {peak}, GQA over G x MHA-sized: {ratio:.2f}")
    return {
        "keys": list(keys),
        "query_heads": list(heads),
        "peak_bytes": {str(h): n for h, n in peak.items()},
        "ratio": ratio,
        "target": {"ratio": 1.0},
        "met": ratio <= 1.0,
    }


def one_thread_xla() -> None:
    """XLA on one thread, as torch and the BLAS: set before JAX is first imported."""
    if "jax" not in sys.modules:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def run(*, rounds: int = 7, quick: bool = False) -> dict[str, Any]:
    import torch
    from threadpoolctl import threadpool_limits

    one_thread_xla()
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        r = 3 if quick else rounds
        with threadpool_limits(THREADS):
            record_rows = decode(r) + chapter(r) + prefill(max(3, r // 2))
            record_rows += training(max(3, r // 2)) + lq1(3) + jax_rows(r)
    finally:
        torch.set_num_threads(threads)
    return {
        "config": {
            "dtype": "float32",
            "threads": THREADS,
            "clock": "process CPU time, best of 5 windows per round",
            "rounds": r,
            "quick": quick,
        },
        "note": "timed on a shared 2-core machine: ratios within one run, interleaved rounds",
        "rows": record_rows,
        "memory": memory(),
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "memory":
        memory_child(int(sys.argv[2]))
    else:
        import json

        print(json.dumps(run(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=1))
