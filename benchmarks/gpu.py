"""GPU benchmarks, for a machine with an NVIDIA GPU: portattn on torch-CUDA and CuPy vs torch SDPA.

Run as ``python benchmarks/gpu.py`` on the device machine (torch with CUDA
required; CuPy optional, skipped with the reason when missing). Times with
CUDA events after a synchronising warm-up, medians of at least 5 runs,
bf16/fp16/fp32 (CuPy has no bfloat16), causal and not, N up to 16384; the
same rows as the CPU record: auto, blockwise, native, and forward+backward of
blockwise against SDPA's.
Peak memory from ``torch.cuda.max_memory_allocated`` (torch) and CuPy's
memory pool high-water mark. Writes ``benchmarks/results/gpu.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
B, H, D = 1, 16, 64
SIZES = (512, 2048, 8192, 16384)
DTYPES = ("bfloat16", "float16", "float32")


def _time(fn: Callable[[], Any], sync: Callable[[], None], rounds: int) -> list[float]:
    import torch

    fn()
    sync()
    out = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        sync()
        out.append(start.elapsed_time(stop) / 1e3)
    return out


def _train(f: Callable[[Any, Any, Any], Any], q: Any, k: Any, v: Any) -> None:
    """One forward + backward of ``f(q, k, v).sum()`` with respect to all three inputs."""
    a, b, w = (x.detach().requires_grad_() for x in (q, k, v))
    f(a, b, w).float().sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu.json")
    args = parser.parse_args()

    import torch

    import portattn as pa

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device available: this benchmark needs an NVIDIA GPU")
    try:
        import cupy as cp
    except ImportError as exc:
        cp = None
        cupy_reason = f"cupy not importable: {exc}"
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows: list[dict[str, Any]] = []
    skipped: list[str] = [] if cp is not None else [cupy_reason]
    for n in SIZES:
        for causal in (False, True):
            gflop = 4.0 * B * H * n * n * D / (2 if causal else 1) / 1e9
            for dtype in DTYPES:
                tdt = getattr(torch, dtype)
                q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=tdt) for _ in range(3))
                subjects: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {
                    "torch SDPA": (
                        lambda q=q, k=k, v=v, c=causal: sdpa(q, k, v, is_causal=c),
                        torch.cuda.synchronize,
                    ),
                    "portattn torch auto": (
                        lambda q=q, k=k, v=v, c=causal: pa.attention(q, k, v, causal=c),
                        torch.cuda.synchronize,
                    ),
                    "portattn torch blockwise": (
                        lambda q=q, k=k, v=v, c=causal: pa.attention(
                            q, k, v, causal=c, impl="blockwise"
                        ),
                        torch.cuda.synchronize,
                    ),
                    "torch SDPA forward+backward": (
                        lambda q=q, k=k, v=v, c=causal: _train(
                            lambda a, b, w: sdpa(a, b, w, is_causal=c), q, k, v
                        ),
                        torch.cuda.synchronize,
                    ),
                    "portattn torch blockwise forward+backward": (
                        lambda q=q, k=k, v=v, c=causal: _train(
                            lambda a, b, w: pa.attention(a, b, w, causal=c, impl="blockwise"),
                            q,
                            k,
                            v,
                        ),
                        torch.cuda.synchronize,
                    ),
                    "portattn torch native": (
                        lambda q=q, k=k, v=v, c=causal: pa.attention(
                            q, k, v, causal=c, impl="native"
                        ),
                        torch.cuda.synchronize,
                    ),
                }
                if cp is not None and dtype != "bfloat16":
                    cq, ck, cv = (cp.from_dlpack(x) for x in (q, k, v))
                    subjects["portattn cupy auto"] = (
                        lambda q=cq, k=ck, v=cv, c=causal: pa.attention(q, k, v, causal=c),
                        cp.cuda.Device().synchronize,
                    )
                for name, (fn, sync) in subjects.items():
                    torch.cuda.reset_peak_memory_stats()
                    try:
                        ts = _time(fn, sync, args.rounds)
                    except (RuntimeError, NotImplementedError, MemoryError) as exc:
                        skipped.append(f"{name} N={n} {dtype} causal={causal}: {exc}")
                        continue
                    med = statistics.median(ts)
                    rows.append(
                        {
                            "subject": name,
                            "n": n,
                            "causal": causal,
                            "dtype": dtype,
                            "median_s": med,
                            "gflops": gflop / med,
                            "peak_torch_bytes": torch.cuda.max_memory_allocated(),
                        }
                    )
                    print(f"N={n} {dtype} causal={causal} {name}: {med * 1e3:.2f} ms")
    record = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "config": {"B": B, "H": H, "d": D},
        "throughput": rows,
        "skipped": skipped,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
