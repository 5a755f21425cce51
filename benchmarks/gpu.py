"""GPU benchmarks: portattn on torch-CUDA and CuPy against torch SDPA, the rows of the CPU record.

Run as ``python benchmarks/gpu.py`` on a machine with an NVIDIA GPU (torch with
CUDA required; CuPy optional, its rows skipped with the reason when it cannot
run). ``scripts/gpu-check.sh`` runs it after the CUDA test sessions. Writes
``benchmarks/results/gpu.json`` (``--out FILE`` elsewhere). ``--max-n`` and
``--rounds`` shorten a run that must fit a device budget.

``--dry-run-cpu`` runs the same code on the CPU, with tiny sizes and one
round, NumPy standing in for CuPy: a check that the script works, on a
machine without a GPU, not a measurement. It is not part of the test suite.

Method, as ``benchmarks/run.py`` (both from ``benchmarks/core.py``): every
subject at one point (N, causal, dtype) is timed in the same rounds,
interleaved, after one warm-up call and one call that measures peak memory;
ratios are taken within a run. A timing starts after a device
synchronisation and ends at one: with CUDA events (``torch.cuda.Event``/
``cupy.cuda.Event`` on the library's current stream) on the GPU,
``time.perf_counter`` on the CPU. Half-precision inputs are
computed in float32 by portattn and cast back; CuPy has no bfloat16.

Record schema (``gpu.json``; close to ``cpu.json``, so the Performance page
can read both):

- ``date``, ``elapsed_s``, ``complete`` (false while the run goes on, or
  when it was cut short: the file is rewritten after every point),
  ``machine`` (GPU name, compute capability, memory,
  multiprocessors, driver, CUDA and cuDNN versions, TF32 and SDPA kernel
  settings, and the versions of python, numpy, torch, cupy, array-api-compat
  and portattn; the CPU instead in a dry run), ``config`` (``B``, ``H``,
  ``d``, ``sizes``, ``training_sizes``, ``dtypes`` per library,
  ``training_dtypes``, ``rounds``, ``device``, ``timer``, ``dry_run``,
  ``stand_ins``), ``skipped`` (sentences: what did not run, and why);
- ``throughput``: rows ``{subject, library, impl, kind, setting, n, causal,
  dtype, runs, median_s, min_s, gflops, vs_sdpa, peak_bytes}`` (the subject's
  fields as ``core.Subject`` writes them). Subjects are ``"torch SDPA"`` and
  ``"portattn <library> <impl>"`` for library ``torch`` (impl ``auto``,
  ``blockwise``, ``materialize``, ``native``) and ``cupy`` (``auto``,
  ``blockwise``, ``materialize``); ``gflops`` counts ``4 B H N^2 d`` FLOPs,
  halved when causal, as ``cpu.json`` does; ``vs_sdpa`` is SDPA's median
  over the subject's (above 1: faster than SDPA); ``peak_bytes`` is the
  extra device memory of one call above its inputs, output included
  (``torch.cuda.max_memory_allocated`` after a reset), ``null`` where the
  library's allocations are invisible to it (CuPy);
- ``training`` (torch, forward + backward of ``out`` against a fixed
  cotangent): ``{rows: [{subject, library, impl, kind, setting, n, causal,
  dtype, runs, median_s, vs_sdpa, peak_bytes, io_bytes, peak_over_io}]}``,
  subjects ``"torch SDPA"``, ``"portattn torch blockwise"`` and ``"portattn
  torch auto"``;
  ``peak_bytes`` as above with q, k, v and the cotangent as the inputs,
  ``io_bytes`` q, k, v, out, their three gradients and the cotangent;
- ``chapter``: ``{shape, loops, median_us, peers, ratio_to_plain}``: the time
  per call at the chapter's size (6 tokens, d=8), where the launch overhead
  is everything; ``ratio_to_plain`` against the hand-written formula on the
  same library (``"plain torch"``, ``"plain cupy"``), paired within rounds;
- ``profile``: per library, ``{tile, median_us, share}``: one blockwise
  tile's passes timed one by one, at the tile portattn's default picks.

In a dry run, ``peak_bytes`` is the growth of the process's resident
high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``) and
the CuPy subjects are named after their stand-in, ``numpy``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import core
from core import CHAPTER_SHAPE, B, D, H, Subject, gflop, plain, sdpa

HERE = Path(__file__).resolve().parent
SIZES = (512, 2048, 8192, 16384)
TRAINING_SIZES = (2048, 8192)
TRAINING_DTYPES = ("float32", "bfloat16")

# A dry run: the same code, sizes that take seconds on a loaded CPU. 600 is
# no power of two, so the blockwise path meets a ragged last block.
DRY_H = 2
DRY_SIZES = (64, 600)
DRY_TRAINING_SIZES = (600,)

# The materialising path holds about three (B, H, N, N) float32 temporaries
# (scores, exponentials, weights); it runs where they fit in free memory.
_MATERIALIZE_TEMPORARIES = 3


@dataclass(frozen=True)
class PeakMeter:
    """Peak memory of one call above what was allocated before it."""

    source: str
    reset: Callable[[], int]  # restarts the high-water mark; returns what is allocated now
    high: Callable[[], int]  # the high-water mark since the reset

    def extra(self, fn: Callable[[], Any]) -> int:
        base = self.reset()
        fn()
        # max: the resident set can shrink below where it was at the reset
        return max(0, self.high() - base)


@dataclass(frozen=True)
class Library:
    """One array library on the benchmark's device: how to synchronise, time and measure it."""

    name: str  # in subject names: "torch", "cupy", or the stand-in's name
    dtypes: tuple[str, ...]
    from_torch: Callable[[Any], Any]  # the same memory, as this library's array
    sync: Callable[[], None]
    release: Callable[[], None]  # hands cached device memory back
    event: Callable[[], Any] | None = None  # a timing event; None: time with perf_counter
    elapsed_s: Callable[[Any, Any], float] | None = None
    meter: PeakMeter | None = None
    plain: Callable[[Any, Any, Any], Any] | None = field(default=None, repr=False)


def timed(fn: Callable[[], Any], lib: Library, reps: int = 1) -> float:
    """Seconds per call of ``fn`` over ``reps`` calls back to back, between two synchronisations."""
    lib.sync()
    if lib.event is None or lib.elapsed_s is None:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        lib.sync()
        return (time.perf_counter() - t0) / reps
    start, stop = lib.event(), lib.event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return lib.elapsed_s(start, stop) / reps


# --- the device and its libraries -----------------------------------------------------


def _proc_status(field_name: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field_name))


def _resident_meter() -> PeakMeter | None:
    """The process's resident high-water mark, restartable on Linux; None elsewhere."""

    def reset() -> int:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the high-water mark restarts from the current resident set
        return _proc_status("VmRSS:")

    try:
        reset()
    except OSError:
        return None
    return PeakMeter("VmHWM growth (/proc/self/status)", reset, lambda: _proc_status("VmHWM:"))


def _plain_torch(q: Any, k: Any, v: Any) -> Any:
    """The textbook formula on torch: the baseline for the per-call overhead."""
    import torch

    s = (q @ k.mT) * (1.0 / q.shape[-1] ** 0.5)
    e = torch.exp(s - torch.amax(s, dim=-1, keepdim=True))
    return (e / torch.sum(e, dim=-1, keepdim=True)) @ v


def _plain_numpy_like(mod: Any) -> Callable[[Any, Any, Any], Any]:
    """The textbook formula for NumPy or CuPy (``mod``), which share these methods."""

    def plain(q: Any, k: Any, v: Any) -> Any:
        s = (q @ k.swapaxes(-1, -2)) * (1.0 / q.shape[-1] ** 0.5)
        e = mod.exp(s - s.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ v

    return plain


def torch_library(device: str) -> Library:
    import torch

    dtypes = ("float32", "bfloat16", "float16")
    if device == "cpu":
        return Library(
            "torch",
            dtypes,
            from_torch=lambda x: x,
            sync=lambda: None,
            release=lambda: None,
            meter=_resident_meter(),
            plain=_plain_torch,
        )

    def reset() -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return int(torch.cuda.memory_allocated())

    def high() -> int:
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())

    return Library(
        "torch",
        dtypes,
        from_torch=lambda x: x,
        sync=torch.cuda.synchronize,
        release=torch.cuda.empty_cache,
        event=lambda: torch.cuda.Event(enable_timing=True),
        elapsed_s=lambda a, b: a.elapsed_time(b) / 1e3,
        meter=PeakMeter("torch.cuda.max_memory_allocated", reset, high),
        plain=_plain_torch,
    )


def cupy_library(device: str) -> tuple[Library | None, str | None]:
    """CuPy on the GPU, NumPy standing in for it on the CPU; or None and the reason."""
    if device == "cpu":
        import numpy as np

        lib = Library(
            np.__name__,
            ("float32", "float16"),
            from_torch=lambda x: x.numpy(),
            sync=lambda: None,
            release=lambda: None,
            meter=_resident_meter(),
            plain=_plain_numpy_like(np),
        )
        return lib, None
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() < 1:
            return None, "cupy rows: cupy sees no CUDA device"
    except Exception as exc:  # ImportError, or CUDA errors from an installed cupy
        return None, f"cupy rows: cupy cannot run here ({type(exc).__name__}: {exc})"

    def release() -> None:
        cp.get_default_memory_pool().free_all_blocks()

    def sync() -> None:
        cp.cuda.get_current_stream().synchronize()

    lib = Library(
        "cupy",
        ("float32", "float16"),  # CuPy has no bfloat16
        from_torch=cp.from_dlpack,
        sync=sync,
        release=release,
        event=cp.cuda.Event,
        elapsed_s=lambda a, b: cp.cuda.get_elapsed_time(a, b) / 1e3,
        meter=None,  # CuPy's pool keeps no high-water mark, torch's counters miss it
        plain=_plain_numpy_like(cp),
    )
    return lib, None


def free_bytes(device: str) -> int:
    if device == "cpu":
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    import torch

    return int(torch.cuda.mem_get_info()[0])


def _command(*argv: str) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip()


def machine(device: str, cupy_lib: Library | None) -> dict[str, Any]:
    """The host as ``run.py`` records it (``core.machine``), and the GPU, CUDA and CuPy."""
    import torch

    out = core.machine()
    if device == "cpu":
        return out
    props = torch.cuda.get_device_properties(0)
    smi = _command(
        "nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader", "-i", "0"
    )
    out |= {
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": list(torch.cuda.get_device_capability(0)),
        "gpu_memory_bytes": props.total_memory,
        "multiprocessors": props.multi_processor_count,
        "driver": smi.split(",")[0].strip() if smi else None,
        "nvidia_smi": smi,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "tf32": {
            "torch_matmul": torch.backends.cuda.matmul.allow_tf32,
            "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cupy_env_CUPY_TF32": os.environ.get("CUPY_TF32"),
        },
        "sdpa_kernels_enabled": {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        },
    }
    if cupy_lib is not None:
        import cupy as cp

        out |= {
            "cupy": cp.__version__,
            "cupy_cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "cupy_cuda_driver_api": cp.cuda.runtime.driverGetVersion(),
        }
    return out


# --- timing -----------------------------------------------------------------------------

Call = tuple[Callable[[], Any], Library]  # a call, and the library that times it


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def time_interleaved(
    subjects: dict[Subject, Call],
    rounds: int,
    point: str,
    skipped: list[str],
) -> tuple[dict[Subject, list[float]], dict[Subject, int | None]]:
    """Times per subject (``core.time_interleaved``), and each one's peak extra memory.

    Each subject is first called once to warm up (kernels, plans, allocator
    pools) and once to measure its peak. A subject whose warm-up call raises
    (out of memory, a refused ``impl="native"``) is dropped, the reason
    appended to ``skipped``.
    """
    live: dict[Subject, Call] = {}
    peaks: dict[Subject, int | None] = {}
    for s, (fn, lib) in subjects.items():
        try:
            fn()
            lib.sync()
            peaks[s] = None if lib.meter is None else lib.meter.extra(lambda fn=fn: fn())
            lib.sync()
        except (RuntimeError, MemoryError, NotImplementedError) as exc:
            skipped.append(f"{s.label} at {point}: {_why(exc)}")
            lib.release()
            continue
        live[s] = (fn, lib)
    funcs = {s: fn for s, (fn, _) in live.items()}
    timers = {s: _timer(lib) for s, (_, lib) in live.items()}
    return core.time_interleaved(funcs, rounds, timers=timers), peaks


def _timer(lib: Library) -> core.Timer:
    return lambda fn, reps: timed(fn, lib, reps)


def throughput_subjects(
    n: int,
    causal: bool,
    dtype: str,
    *,
    device: str,
    heads: int,
    libs: list[Library],
    skipped: list[str],
) -> dict[Subject, Call]:
    import torch

    import portattn as pa

    tlib = libs[0]
    q, k, v = (
        torch.randn(B, heads, n, D, device=device, dtype=getattr(torch, dtype)) for _ in range(3)
    )
    kernel = torch.nn.functional.scaled_dot_product_attention
    need = _MATERIALIZE_TEMPORARIES * B * heads * n * n * 4
    fits = need < 0.8 * free_bytes(device)
    if not fits:
        skipped.append(
            f"materialize at N={n}: its scores need about {need / 2**30:.1f} GiB, "
            f"more than the free memory allows"
        )
    impls = ["auto", "blockwise", *(["materialize"] if fits else [])]
    out: dict[Subject, Call] = {
        sdpa(): (lambda: kernel(q, k, v, is_causal=causal), tlib),
    }
    # One library's subjects run back to back, as in run.py.
    for impl in [*impls, "native"]:
        out[Subject("torch", impl)] = (
            lambda impl=impl: pa.attention(q, k, v, causal=causal, impl=impl),
            tlib,
        )
    for lib in libs[1:]:
        if dtype not in lib.dtypes:
            continue
        cq, ck, cv = (lib.from_torch(x) for x in (q, k, v))
        for impl in impls:
            out[Subject(lib.name, impl)] = (
                lambda impl=impl, cq=cq, ck=ck, cv=cv: pa.attention(
                    cq, ck, cv, causal=causal, impl=impl
                ),
                lib,
            )
    return out


def throughput(
    sizes: tuple[int, ...],
    dtypes: tuple[str, ...],
    *,
    device: str,
    heads: int,
    libs: list[Library],
    rounds: int | None,
    skipped: list[str],
    rows: list[dict[str, Any]],
    save: Callable[[], None],
) -> None:
    """Throughput rows, appended to ``rows`` point by point; ``save`` after each point."""
    for n in sizes:
        for causal in (False, True):
            for dtype in dtypes:
                point = f"N={n} causal={causal} {dtype}"
                subjects = throughput_subjects(
                    n, causal, dtype, device=device, heads=heads, libs=libs, skipped=skipped
                )
                r = rounds or (7 if n <= 2048 else 5)
                times, peaks = time_interleaved(subjects, r, point, skipped)
                del subjects
                for lib in libs:
                    lib.release()
                if sdpa() not in times:
                    save()
                    continue
                base = statistics.median(times[sdpa()])
                for s, ts in times.items():
                    med = statistics.median(ts)
                    row = {
                        **s.fields(),
                        "n": n,
                        "causal": causal,
                        "dtype": dtype,
                        "runs": len(ts),
                        "median_s": med,
                        "min_s": min(ts),
                        "gflops": gflop(n, causal, heads=heads) / med,
                        "vs_sdpa": base / med,
                        "peak_bytes": peaks[s],
                    }
                    rows.append(row)
                    extra = peaks[s]
                    peak = "" if extra is None else f" peak {extra / 2**20:9.1f} MiB"
                    print(
                        f"N={n:5d} causal={causal!s:5} {dtype:8s} {s.label:28s} "
                        f"{med * 1e3:9.3f} ms {row['gflops']:8.1f} GFLOP/s x{base / med:.2f}{peak}"
                    )
                save()


def training_point(
    n: int,
    causal: bool,
    dtype: str,
    *,
    device: str,
    heads: int,
    tlib: Library,
    rounds: int,
    skipped: list[str],
) -> list[dict[str, Any]]:
    """Forward + backward at one point: blockwise (its O(N) backward) and auto against SDPA's."""
    import torch

    import portattn as pa

    kernel = torch.nn.functional.scaled_dot_product_attention
    tdt = getattr(torch, dtype)
    q, k, v = (
        torch.randn(B, heads, n, D, device=device, dtype=tdt, requires_grad=True) for _ in range(3)
    )
    d_out = torch.randn(B, heads, n, D, device=device, dtype=tdt)
    funcs: dict[Subject, Callable[[], Any]] = {
        sdpa(): lambda: kernel(q, k, v, is_causal=causal),
        Subject("torch", "blockwise"): lambda: pa.attention(
            q, k, v, causal=causal, impl="blockwise"
        ),
        Subject("torch", "auto"): lambda: pa.attention(q, k, v, causal=causal),
    }

    def step(f: Callable[[], Any]) -> None:
        f().backward(d_out)
        # dropped inside the step, so that each step starts from the inputs
        # and the cotangent alone, and its peak counts its own gradients
        q.grad = k.grad = v.grad = None

    subjects: dict[Subject, Call] = {s: (lambda f=f: step(f), tlib) for s, f in funcs.items()}
    point = f"forward+backward N={n} causal={causal} {dtype}"
    times, peaks = time_interleaved(subjects, rounds, point, skipped)
    if sdpa() not in times:
        return []
    io = 8 * q.nbytes  # q, k, v, out, three gradients, the cotangent
    sdpa_s = statistics.median(times[sdpa()])
    rows = []
    for s, ts in times.items():
        med = statistics.median(ts)
        peak = peaks[s]
        rows.append(
            {
                **s.fields(),
                "n": n,
                "causal": causal,
                "dtype": dtype,
                "runs": len(ts),
                "median_s": med,
                "vs_sdpa": sdpa_s / med,
                "peak_bytes": peak,
                "io_bytes": io,
                "peak_over_io": None if peak is None else peak / io,
            }
        )
        mem = "" if peak is None else f" peak {peak / 2**20:9.1f} MiB"
        print(
            f"train N={n:5d} causal={causal!s:5} {dtype:8s} {s.label:26s} "
            f"{med * 1e3:9.2f} ms x{sdpa_s / med:.2f}{mem}"
        )
    return rows


def training(
    sizes: tuple[int, ...],
    dtypes: tuple[str, ...],
    *,
    tlib: Library,
    rows: list[dict[str, Any]],
    save: Callable[[], None],
    **kw: Any,
) -> None:
    """Forward + backward rows on torch (see :func:`training_point`), appended to ``rows``."""
    for n in sizes:
        for causal in (False, True):
            for dtype in dtypes:
                rows += training_point(n, causal, dtype, tlib=tlib, **kw)
                tlib.release()
                save()


def chapter_overhead(
    libs: list[Library], *, device: str, rounds: int, loops: int
) -> dict[str, Any]:
    """Per-call time at the chapter's size (6 tokens, d=8): launch and Python overhead, no FLOPs."""
    import torch

    import portattn as pa

    torch.manual_seed(0)
    q, k, v = (torch.randn(*CHAPTER_SHAPE, device=device) for _ in range(3))
    kernel = torch.nn.functional.scaled_dot_product_attention
    funcs: dict[str, Callable[[], Any]] = {}
    timers: dict[str, core.Timer] = {}
    peers: dict[str, str] = {}
    for lib in libs:
        a, b, c = (lib.from_torch(x) for x in (q, k, v))
        assert lib.plain is not None
        mine: dict[str, Callable[[], Any]] = {
            plain(lib.name).label: lambda a=a, b=b, c=c, f=lib.plain: f(a, b, c)
        }
        if lib.name == "torch":
            mine[sdpa().label] = lambda: kernel(q, k, v)
        mine[f"portattn {lib.name}"] = lambda a=a, b=b, c=c: pa.attention(a, b, c)
        mine[f"portattn {lib.name} causal"] = lambda a=a, b=b, c=c: pa.attention(
            a, b, c, causal=True
        )
        funcs |= mine
        timers |= dict.fromkeys(mine, _timer(lib))
        peers |= dict.fromkeys(mine, plain(lib.name).label)
    for fn in funcs.values():
        fn()
    res = core.per_call(funcs, peers, rounds=rounds, loops=loops, timers=timers)
    print("chapter size (us per call):", {k: round(m, 1) for k, m in res["median_us"].items()})
    return res


def tile_profile(
    libs: list[Library], *, device: str, heads: int, rounds: int, reps: int
) -> dict[str, Any]:
    """Each pass of one blockwise tile timed alone, at the tile portattn picks for the library.

    The passes of ``_blockwise._query_block`` written out one by one, so that
    the record says where a tile's time goes: the two matmuls against the
    elementwise passes (max, subtract, exp, sum), each a kernel launch here.
    """
    import array_api_compat
    import torch

    from portattn._paths._blockwise import block_sizes

    torch.manual_seed(0)
    res: dict[str, Any] = {}
    for lib in libs:
        probe = lib.from_torch(torch.zeros(1, device=device))
        xp = array_api_compat.array_namespace(probe)
        bq, bk = block_sizes(None, xp=xp, batch=(B, heads))
        qb, kt, vb = (
            lib.from_torch(torch.randn(*shape, device=device))
            for shape in ((B, heads, bq, D), (B, heads, D, bk), (B, heads, bk, D))
        )
        s = qb @ kt
        m = xp.max(s, axis=-1, keepdims=True)
        e = xp.exp(s - m)

        def subtract(s: Any = s, m: Any = m) -> None:
            s -= m  # in place, as the blockwise path does where autograd is not watching

        passes: dict[str, Callable[[], Any]] = {
            "scores matmul": lambda qb=qb, kt=kt: qb @ kt,
            "row max": lambda s=s, xp=xp: xp.max(s, axis=-1, keepdims=True),
            "subtract (in place)": subtract,
            "exp": lambda s=s, xp=xp: xp.exp(s),
            "row sum": lambda e=e, xp=xp: xp.sum(e, axis=-1, keepdims=True),
            "value matmul": lambda e=e, vb=vb: e @ vb,
        }
        res[lib.name] = core.profile_passes(
            passes,
            tile=[B, heads, bq, bk],
            rounds=rounds,
            time_pass=lambda f, lib=lib: timed(f, lib, reps=reps),
        )
        print(
            f"tile profile {lib.name}:", {k: f"{t:.0%}" for k, t in res[lib.name]["share"].items()}
        )
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu.json")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per point (default 7/5)")
    parser.add_argument("--max-n", type=int, default=max(SIZES), help="largest N for throughput")
    parser.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="the same code on the CPU, tiny sizes, one round, NumPy for CuPy: a check, no record",
    )
    args = parser.parse_args()
    started = time.perf_counter()

    import torch

    dry = args.dry_run_cpu
    sizes: tuple[int, ...]
    train_sizes: tuple[int, ...]
    if dry:
        device, heads, rounds = "cpu", DRY_H, 1
        sizes, train_sizes = DRY_SIZES, DRY_TRAINING_SIZES
    else:
        if not torch.cuda.is_available():
            raise SystemExit(
                "no CUDA device available: this benchmark needs an NVIDIA GPU "
                "(--dry-run-cpu checks the script on the CPU)"
            )
        device, heads, rounds = "cuda", H, args.rounds
        sizes = tuple(n for n in SIZES if n <= args.max_n)
        train_sizes = tuple(n for n in TRAINING_SIZES if n <= args.max_n)
    torch.manual_seed(0)
    skipped: list[str] = []
    tlib = torch_library(device)
    clib, why = cupy_library(device)
    if why is not None:
        skipped.append(why)
    libs = [tlib] if clib is None else [tlib, clib]
    if any(n not in sizes for n in SIZES) and not dry:
        skipped.append(f"throughput above N={args.max_n} in this run (--max-n)")

    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(device, clib),
        "config": {
            "B": B,
            "H": heads,
            "d": D,
            "sizes": list(sizes),
            "training_sizes": list(train_sizes),
            "dtypes": {lib.name: list(lib.dtypes) for lib in libs},
            "training_dtypes": list(TRAINING_DTYPES),
            "rounds": rounds or "7 up to N=2048, 5 above",
            "device": device,
            "timer": "perf_counter between synchronisations" if dry else "CUDA events",
            "dry_run": dry,
            "stand_ins": {"cupy": clib.name} if dry and clib is not None else {},
        },
        "skipped": skipped,
    }

    def save(complete: bool = False) -> None:
        # rewritten after every point: a run cut short still leaves its rows
        record["skipped"] = list(dict.fromkeys(skipped))  # one sentence per reason
        record["complete"] = complete
        record["elapsed_s"] = round(time.perf_counter() - started, 1)
        args.out.write_text(json.dumps(record, indent=1) + "\n")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    record["throughput"] = []
    throughput(
        sizes,
        tlib.dtypes,
        device=device,
        heads=heads,
        libs=libs,
        rounds=rounds,
        skipped=skipped,
        rows=record["throughput"],
        save=save,
    )
    record["training"] = {"rows": []}
    training(
        train_sizes,
        TRAINING_DTYPES,
        device=device,
        heads=heads,
        tlib=tlib,
        rounds=rounds or 5,
        skipped=skipped,
        rows=record["training"]["rows"],
        save=save,
    )
    record["chapter"] = chapter_overhead(
        libs, device=device, rounds=rounds or 7, loops=20 if dry else 500
    )
    save()
    record["profile"] = tile_profile(
        libs, device=device, heads=heads, rounds=rounds or 5, reps=2 if dry else 50
    )
    save(complete=True)
    print(f"wrote {args.out} in {record['elapsed_s']} s")


if __name__ == "__main__":
    main()
